"""Reference models that `hw` runs; each layer matches a parsim.workload layer kind (the transformer's are in
hw.nets.transformer)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from hw.nets.transformer import lm_loss, transformer_module
from hw.usermodel.sources import loss_of, user_layer
from parsim.workload import Decoder, Embedding, Head, Layer, Model, stage_layers
from parsim.workload.timed import TimedLayer


class MlpBlock(nn.Module):
    """x + W2 gelu(W1 layernorm(x)), 4x expansion: parsim's "mlp" layer kind."""

    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


def _conv3x3(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)


class ConvBlock(nn.Module):
    """x + conv3x3(relu(bn(conv3x3(relu(bn(x)))))) on C channels: parsim's "conv" kind, a pre-activation
    basic block (He et al., 2016). Batch statistics are per micro-batch, as in GPipe without deferred batch norm."""

    def __init__(self, channels: int):
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(channels), _conv3x3(channels, channels)
        self.bn2, self.conv2 = nn.BatchNorm2d(channels), _conv3x3(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(F.relu(self.bn2(self.conv1(F.relu(self.bn1(x))))))


class DownBlock(nn.Module):
    """C/2 x 2S x 2S -> C x S x S: a = relu(bn(x)); conv3x3(relu(bn(conv3x3/2(a)))) + conv1x1/2(a), the
    projection shortcut of a pre-activation block: parsim's "down" kind, the first block of a group."""

    def __init__(self, channels: int):
        super().__init__()
        half = channels // 2
        self.bn1, self.conv1 = nn.BatchNorm2d(half), _conv3x3(half, channels, stride=2)
        self.bn2, self.conv2 = nn.BatchNorm2d(channels), _conv3x3(channels, channels)
        self.shortcut = nn.Conv2d(half, channels, 1, stride=2, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = F.relu(self.bn1(x))
        return self.shortcut(a) + self.conv2(F.relu(self.bn2(self.conv1(a))))


LAYER_KINDS = {"mlp": MlpBlock, "conv": ConvBlock, "down": DownBlock}  # each takes the layer's `hidden`


def layer_module(layer: Layer | Decoder | Embedding | Head) -> nn.Module:
    """The module of one parsim layer: an MLP or conv block by its width, a transformer layer by its shape."""
    return LAYER_KINDS[layer.kind](layer.hidden) if isinstance(layer, Layer) else transformer_module(layer)


def loss_for(model: Model) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loss on the last stage's output: cross-entropy on a transformer's logits, a profiled model's own (see
    hw.usermodel.sources.loss_of), else mean squared error."""
    last = model.layers[-1]
    if isinstance(last, TimedLayer):
        return loss_of(last.source)
    return lm_loss if isinstance(model.layers[-1], Head) else F.mse_loss


def build_layer(model: Model, index: int, seed: int = 0, device: torch.device | str = "cpu") -> nn.Module:
    """Layer `index` of `model`, drawn from its own seed: a stage builds only its layers, on its device (a profiled
    model's layer is copied from the whole model, built once per process from `seed`)."""
    layer = model.layers[index]
    if isinstance(layer, TimedLayer):
        return user_layer(layer.source, index, seed, device)
    torch.manual_seed(seed * 1_000_003 + index)
    with torch.device(device):
        return layer_module(model.layers[index])


def build_layers(model: Model, seed: int = 0) -> list[nn.Module]:
    """All layers of `model`; every rank that builds layer i gets the same weights (per device type)."""
    return [build_layer(model, i, seed) for i in range(len(model.layers))]


def build_stage(model: Model, num_stages: int, stage: int, seed: int = 0,
                device: torch.device | str = "cpu") -> nn.Sequential:
    """The layers of one stage under the model's split (parsim's stage_layers: its balance, or equal counts)."""
    return nn.Sequential(*(build_layer(model, i, seed, device) for i in stage_layers(model, num_stages)[stage]))
