"""Reference models that `hw` runs; each layer matches a parsim.workload.Layer kind."""

from __future__ import annotations

import torch
from torch import nn

from parsim.workload import Model, partition


class MlpBlock(nn.Module):
    """x + W2 gelu(W1 layernorm(x)), 4x expansion: parsim's "mlp" layer kind."""

    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))


LAYER_KINDS = {"mlp": MlpBlock}


def build_layers(model: Model, seed: int = 0) -> list[nn.Module]:
    """All layers of `model`, initialised from `seed` so every rank builds the same weights."""
    torch.manual_seed(seed)
    return [LAYER_KINDS[layer.kind](layer.hidden) for layer in model.layers]


def build_stage(model: Model, num_stages: int, stage: int, seed: int = 0) -> nn.Sequential:
    """The layers of one stage under parsim's equal partition."""
    layers = build_layers(model, seed)
    return nn.Sequential(*(layers[i] for i in partition(len(layers), num_stages)[stage]))
