"""A timm model as a pipeline's layers: a VisionTransformer as [embedding, its blocks..., head], a ResNet as [stem,
its blocks..., head], a ConvNeXt as [stem, its stages' downsamplings and blocks..., head]; each layer computes what
the model's own forward_features and forward_head compute there (timm is imported by the caller, who built `net`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from parsim.errors import ModelError

SPLIT = "VisionTransformer, ResNet and ConvNeXt"  # the timm classes hw splits, exactly (not their subclasses)


class TimmVitEmbedding(nn.Module):
    """Images -> tokens, as timm's VisionTransformer.forward_features makes them before its blocks: patches embedded,
    class and register tokens first, position embeddings added (after the tokens with no_embed_class, resampled to
    the image's grid with dynamic_img_size), pos_drop (where there are position embeddings), patch_drop, norm_pre."""

    def __init__(self, net: Any):
        super().__init__()
        self.patch_embed, self.pos_drop = net.patch_embed, net.pos_drop
        self.patch_drop, self.norm_pre = net.patch_drop, net.norm_pre
        self.cls_token, self.reg_token, self.pos_embed = net.cls_token, net.reg_token, net.pos_embed
        self.no_embed_class, self.dynamic_img_size = bool(net.no_embed_class), bool(net.dynamic_img_size)
        self.num_prefix_tokens = int(net.num_prefix_tokens)
        from timm.layers import resample_abs_pos_embed

        self.resample: Callable[..., torch.Tensor] = resample_abs_pos_embed

    def tokens(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The class and register tokens present, one of each per image."""
        return [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        first = self.tokens(x)
        if self.pos_embed is None:  # no position embeddings: no pos_drop either, as timm's _pos_embed
            x = torch.cat([*first, x.view(x.shape[0], -1, x.shape[-1])], dim=1)
        else:
            pos = self.pos_embed
            if self.dynamic_img_size:  # patches come as (b, h, w, c): the position table resampled to (h, w)
                pos = self.resample(pos, new_size=x.shape[1:3], old_size=self.patch_embed.grid_size,
                                    num_prefix_tokens=0 if self.no_embed_class else self.num_prefix_tokens)
                x = x.view(x.shape[0], -1, x.shape[-1])
            if self.no_embed_class:
                x = torch.cat([*first, x + pos], dim=1)
            else:
                x = torch.cat([*first, x], dim=1) + pos
            x = self.pos_drop(x)
        return self.norm_pre(self.patch_drop(x))


class TimmVitHead(nn.Module):
    """Tokens -> logits, as forward_features' final norm and forward_head make them: norm, pooling (attention pooling,
    or timm's global_pool_nlc: the class token, or an average or maximum over the tokens), fc_norm, head_drop, head."""

    def __init__(self, net: Any):
        super().__init__()
        self.norm, self.attn_pool, self.fc_norm = net.norm, net.attn_pool, net.fc_norm
        self.head_drop, self.head = net.head_drop, net.head
        self.global_pool, self.num_prefix_tokens = net.global_pool, int(net.num_prefix_tokens)
        self.include_prefix = bool(getattr(net, "pool_include_prefix", False))
        from timm.models.vision_transformer import global_pool_nlc

        self.pool: Callable[..., torch.Tensor] = global_pool_nlc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        if self.attn_pool is not None:
            x = self.attn_pool(x if self.include_prefix else x[:, self.num_prefix_tokens:])
        else:
            x = self.pool(x, pool_type=self.global_pool, num_prefix_tokens=self.num_prefix_tokens,
                          reduce_include_prefix=self.include_prefix)
        return self.head(self.head_drop(self.fc_norm(x)))


def vit_layers(net: Any) -> list[tuple[str, nn.Module]]:
    """timm's VisionTransformer: [embed, blocks.0, ..., head]."""
    blocks = net.get_submodule("blocks")
    return [("embed", TimmVitEmbedding(net)), *((f"blocks.{i}", b) for i, b in enumerate(blocks.children())),
            ("head", TimmVitHead(net))]


def resnet_layers(net: Any) -> list[tuple[str, nn.Module]]:
    """timm's ResNet: [stem (conv1, bn1, act1, maxpool), layer1.0, ..., layer4.N, head (global_pool, its dropout,
    fc)]."""
    stem = nn.Sequential(*(net.get_submodule(p) for p in ("conv1", "bn1", "act1", "maxpool")))
    named: list[tuple[str, nn.Module]] = [("stem", stem)]
    for group in ("layer1", "layer2", "layer3", "layer4"):
        named += [(f"{group}.{i}", block) for i, block in enumerate(net.get_submodule(group).children())]
    drop = float(net.drop_rate or 0.0)  # forward_head's F.dropout(x, drop_rate, training), as a module
    head = nn.Sequential(net.global_pool, *([nn.Dropout(drop).train(net.training)] if drop else []), net.fc)
    return [*named, ("head", head)]


def convnext_layers(net: Any) -> list[tuple[str, nn.Module]]:
    """timm's ConvNeXt: [stem, stages.0.blocks.0, ..., stages.1.downsample, stages.1.blocks.0, ..., head (norm_pre,
    head)]; a stage's downsampling a layer of its own where it has one."""
    named: list[tuple[str, nn.Module]] = [("stem", net.stem)]
    for i, stage in enumerate(net.get_submodule("stages").children()):
        if not isinstance(stage.downsample, nn.Identity):
            named.append((f"stages.{i}.downsample", stage.downsample))
        named += [(f"stages.{i}.blocks.{j}", block) for j, block in enumerate(stage.blocks.children())]
    return [*named, ("head", nn.Sequential(net.norm_pre, net.head))]


def timm_named(name: str, net: Any) -> list[tuple[str, nn.Module]]:
    """The layers of a timm model `name` built as `net`; ModelError in one line for a class hw does not split."""
    from timm.models.convnext import ConvNeXt
    from timm.models.resnet import ResNet
    from timm.models.vision_transformer import VisionTransformer

    split = {VisionTransformer: vit_layers, ResNet: resnet_layers, ConvNeXt: convnext_layers}.get(type(net))
    if split is None:
        raise ModelError(f"timm:{name} ({type(net).__name__}) cannot be split into a pipeline's layers: hw splits "
                         f"timm's {SPLIT} models")
    return split(net)
