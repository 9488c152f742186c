"""A stand-in for timm where it does not import (CI: PyPI's torchvision beside torch's CPU build), for
tests/test_timm_models.py: modules named as timm's, put in sys.modules by `installed`, with a tiny VisionTransformer
of timm's layout and forward (timm 1.0's, class token and token pooling only), so that `hw profile timm:...` runs
its own code on it end to end; where timm imports, the tests there check the split against timm's own models."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch import nn


class PatchEmbed(nn.Module):
    """timm.layers.PatchEmbed's attributes and output (b, tokens, width), for a fixed image size."""

    def __init__(self, side: int, patch: int, width: int):
        super().__init__()
        self.img_size, self.grid_size = (side, side), (side // patch, side // patch)
        self.proj = nn.Conv2d(3, width, patch, patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


def global_pool_nlc(x: torch.Tensor, pool_type: str = "token", num_prefix_tokens: int = 1,
                    reduce_include_prefix: bool = False) -> torch.Tensor:
    """timm.models.vision_transformer.global_pool_nlc, for the class token and the average."""
    if pool_type == "token":
        return x[:, 0]
    return (x if reduce_include_prefix else x[:, num_prefix_tokens:]).mean(dim=1)


class VisionTransformer(nn.Module):
    """timm's VisionTransformer's attributes and forward (forward_features, then forward_head), tiny."""

    def __init__(self, img_size: int = 16, patch: int = 4, width: int = 16, depth: int = 3, num_classes: int = 10):
        super().__init__()
        self.patch_embed = PatchEmbed(img_size, patch, width)
        self.cls_token, self.reg_token = nn.Parameter(torch.randn(1, 1, width) * 0.02), None
        self.pos_embed = nn.Parameter(torch.randn(1, (img_size // patch) ** 2 + 1, width) * 0.02)
        self.no_embed_class, self.dynamic_img_size, self.num_prefix_tokens = False, False, 1
        self.pos_drop, self.patch_drop, self.norm_pre = nn.Dropout(0.0), nn.Identity(), nn.Identity()
        self.blocks = nn.Sequential(*[nn.TransformerEncoderLayer(width, 2, 2 * width, 0.0, batch_first=True)
                                      for _ in range(depth)])
        self.norm, self.attn_pool, self.global_pool, self.pool_include_prefix = nn.LayerNorm(width), None, "token", False
        self.fc_norm, self.head_drop, self.head = nn.Identity(), nn.Dropout(0.0), nn.Linear(width, num_classes)
        self.num_classes, self.pretrained_cfg = num_classes, {"input_size": (3, img_size, img_size)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(self.norm_pre(self.patch_drop(self.pos_drop(x)))))
        x = global_pool_nlc(x, self.global_pool, self.num_prefix_tokens, self.pool_include_prefix)
        return self.head(self.head_drop(self.fc_norm(x)))


class ResNet(nn.Module):
    """A name for hw's split table (stand-in tests build none)."""


class ConvNeXt(nn.Module):
    """A name for hw's split table (stand-in tests build none)."""


class EfficientNet(nn.Module):
    """A timm class hw does not split."""

    def __init__(self) -> None:
        super().__init__()
        self.conv_stem, self.num_classes = nn.Conv2d(3, 4, 3), 4
        self.pretrained_cfg = {"input_size": (3, 16, 16)}


def create_model(name: str, pretrained: bool = False, img_size: int = 16) -> nn.Module:
    """timm.create_model for the stand-ins: vit_stand_in, efficientnet_stand_in."""
    assert not pretrained
    if name == "vit_stand_in":
        return VisionTransformer(img_size)
    if name == "efficientnet_stand_in":
        return EfficientNet()
    raise RuntimeError(f"Unknown model ({name})")


def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Put the stand-in in sys.modules as timm (and the modules hw imports from it) for one test."""

    def module(name: str, **attrs: object) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, m)
        return m

    module("timm.layers", resample_abs_pos_embed=None)
    vit = module("timm.models.vision_transformer", VisionTransformer=VisionTransformer, global_pool_nlc=global_pool_nlc)
    resnet, convnext = module("timm.models.resnet", ResNet=ResNet), module("timm.models.convnext", ConvNeXt=ConvNeXt)
    models = module("timm.models", vision_transformer=vit, resnet=resnet, convnext=convnext)
    module("timm", create_model=create_model, models=models, __version__="stand-in")
