"""Users' own models for tests/test_user_models.py, named as `hw profile` takes them: user_nets:FUNCTION."""

from __future__ import annotations

import torch
from torch import nn


def mlp() -> tuple[nn.Sequential, torch.Tensor]:
    """An embedding-free MLP stack: four alike blocks, then a narrower head (two kinds of layer)."""
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)) for _ in range(4)]
    return nn.Sequential(*blocks, nn.Linear(16, 8)), torch.randn(4, 16)


class Pair(nn.Module):
    """A layer that hands on two tensors: no pipeline layer."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x


def two_outputs() -> tuple[nn.Sequential, torch.Tensor]:
    return nn.Sequential(nn.Linear(8, 8), Pair(), nn.Linear(8, 8)), torch.randn(2, 8)


def not_layers() -> tuple[nn.Module, torch.Tensor]:
    return nn.Linear(8, 8), torch.randn(2, 8)


def mismatched() -> tuple[nn.Sequential, torch.Tensor]:
    return nn.Sequential(nn.Linear(8, 8), nn.Linear(4, 8)), torch.randn(2, 8)


class Bottleneck(nn.Module):
    """A residual block with torchvision's attribute names where it matters (none here): any module chains."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, stride, 1)
        self.short = nn.Conv2d(c_in, c_out, 1, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x) + self.short(x))


class TinyResNet(nn.Module):
    """torchvision's ResNet layout (conv1, bn1, relu, maxpool, layer1-4, avgpool, fc), tiny: a stand-in where
    torchvision is not installed (CI's CPU torch has no matching torchvision)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1, self.relu = nn.Conv2d(3, 4, 3, 2, 1), nn.BatchNorm2d(4), nn.ReLU()
        self.maxpool = nn.MaxPool2d(2)
        self.layer1 = nn.Sequential(Bottleneck(4, 4, 1), Bottleneck(4, 4, 1))
        self.layer2 = nn.Sequential(Bottleneck(4, 8, 2))
        self.layer3 = nn.Sequential(Bottleneck(8, 8, 1))
        self.layer4 = nn.Sequential(Bottleneck(8, 8, 1))
        self.avgpool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # torchvision's ResNet.forward
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class Encoder(nn.Module):
    def __init__(self, tokens: int, width: int, blocks: int):
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.randn(1, tokens, width) * 0.02)
        self.dropout = nn.Dropout(0.0)
        self.layers = nn.Sequential(*[nn.TransformerEncoderLayer(width, 2, 2 * width, 0.0, batch_first=True)
                                      for _ in range(blocks)])
        self.ln = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(self.layers(self.dropout(x + self.pos_embedding)))


class TinyViT(nn.Module):
    """torchvision's VisionTransformer layout (conv_proj, class_token, encoder, heads) and forward, tiny."""

    def __init__(self, side: int = 16, patch: int = 4, width: int = 16):
        super().__init__()
        self.conv_proj = nn.Conv2d(3, width, patch, patch)
        self.class_token = nn.Parameter(torch.zeros(1, 1, width))
        self.encoder = Encoder((side // patch) ** 2 + 1, width, 2)
        self.heads = nn.Sequential(nn.Linear(width, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_proj(x).reshape(x.shape[0], self.class_token.shape[-1], -1).permute(0, 2, 1)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.heads(self.encoder(x)[:, 0])


def resnet() -> tuple[list[nn.Module], torch.Tensor]:
    """TinyResNet split as hw splits torchvision's ResNets."""
    from hw.usermodel.sources import resnet_layers

    torch.manual_seed(0)
    return [m for _, m in resnet_layers(TinyResNet())], torch.randn(2, 3, 16, 16)
