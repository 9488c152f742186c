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


def build_layer(model: Model, index: int, seed: int = 0, device: torch.device | str = "cpu") -> nn.Module:
    """Layer `index` of `model`, drawn from its own seed: a stage builds only its layers, on its device."""
    torch.manual_seed(seed * 1_000_003 + index)
    with torch.device(device):
        return LAYER_KINDS[model.layers[index].kind](model.layers[index].hidden)


def build_layers(model: Model, seed: int = 0) -> list[nn.Module]:
    """All layers of `model`; every rank that builds layer i gets the same weights (per device type)."""
    return [build_layer(model, i, seed) for i in range(len(model.layers))]


def build_stage(model: Model, num_stages: int, stage: int, seed: int = 0,
                device: torch.device | str = "cpu") -> nn.Sequential:
    """The layers of one stage under parsim's equal partition."""
    return nn.Sequential(*(build_layer(model, i, seed, device) for i in partition(len(model.layers), num_stages)[stage]))
