"""A user's model as a pipeline's layers: a Hugging Face causal LM (its embedding, decoder layers and head), a
torchvision ResNet (its stem, bottleneck or basic blocks and head) or ViT, a timm ViT, ResNet or ConvNeXt
(hw.usermodel.timm_models), or `package.module:function` returning layers."""

from __future__ import annotations

import copy
import functools
import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hw.nets.transformer import lm_loss
from hw.usermodel.timm_models import SPLIT, timm_named
from parsim.errors import ModelError
from parsim.workload.configs import preset_config
from parsim.workload.models import PRESETS
from parsim.workload.timed import Source

SPECS = ("hf:PRESET_OR_CONFIG.json (a Hugging Face causal LM; presets: " + ", ".join(PRESETS) + "), "
         "torchvision:NAME (a ResNet or a ViT, e.g. torchvision:resnet50, torchvision:vit_b_16), "
         f"timm:NAME (a {SPLIT.replace(' and ', ' or ')}, e.g. timm:vit_base_patch16_224, timm:resnet50) or "
         "package.module:function (returning an nn.Sequential or a list of modules, and a batch of sample inputs)")
NOT_SPLIT = "cannot be split into a pipeline's layers"


@dataclass
class Layers:
    """A user's model as named layers in order, the source hw rebuilds it from, and a batch of its inputs."""

    named: list[tuple[str, nn.Module]]
    source: Source
    sample: torch.Tensor  # inputs: at least one sample, in the dtype the first layer takes


def source_of(spec: str, seq_len: int = 0, layers: int = 0, image_size: int = 0) -> Source:
    """The Source `hw profile MODEL` names (its loss and sample kind found by building it: see user_layers)."""
    spec = spec.strip()
    kind, _, name = spec.partition(":")
    if not name:
        raise ModelError(f"model {spec!r}: expected {SPECS}")
    if kind != "hf" and (seq_len or layers):
        raise ModelError(f"--seq-len and --layers go with a Hugging Face model (hf:...), not {spec}")
    if kind not in ("torchvision", "timm") and image_size:
        raise ModelError(f"--image-size goes with a torchvision or timm model (torchvision:..., timm:...), not {spec}")
    return Source(spec, seq_len=seq_len, layers=layers, image_size=image_size)


def user_layers(source: Source, seed: int = 0, device: torch.device | str = "cpu") -> Layers:
    """The model `source` names, built on `device` from `seed` (every rank's CPU build gets the same weights), as
    layers."""
    kind, _, name = source.model.partition(":")
    torch.manual_seed(seed)
    with torch.device(device):
        if kind == "hf":
            return hf_layers(source, name)
        if kind == "torchvision":
            return torchvision_layers(source, name)
        if kind == "timm":
            return timm_layers(source, name)
        return function_layers(source)


@functools.lru_cache(maxsize=2)
def _built(source: Source, seed: int, device: str) -> Layers:
    return user_layers(source, seed, device)


def user_layer(source: Source, index: int, seed: int = 0, device: torch.device | str = "cpu") -> nn.Module:
    """Layer `index` of the model `source` names, a copy of its own: the whole model is built once per process and
    device (on a GPU in seconds where a 1B-parameter model's CPU build took a minute; the same weights on every
    GPU of a kind, as on every CPU)."""
    return copy.deepcopy(_built(replace(source, file=""), seed, str(torch.device(device))).named[index][1])


def _import(package: str, extra: str) -> Any:
    try:
        return importlib.import_module(package)
    except ImportError as e:
        if e.name is not None and e.name.partition(".")[0] != package.partition(".")[0]:
            raise ModelError(f"this model needs {package}, which needs {e.name}, not installed here") from None
        raise ModelError(f"this model needs {package}, which is not installed here; install it with: "
                         f"pip install {extra}") from None
    except (RuntimeError, OSError) as e:  # installed but broken: PyPI's torchvision beside a CPU build of torch
        raise ModelError(f"this model needs {package}, which is installed here but does not import "
                         f"({e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None


def _config_doc(name: str) -> dict[str, Any]:
    """A preset's config, a config.json's, or (with the hub reachable) a hub model's, as a dict."""
    if name.lower() in PRESETS:
        return preset_config(name.lower())
    path = Path(name)
    if path.suffix == ".json" or path.exists():
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ModelError(f"hf:{name}: not a readable config.json ({e})") from None
        if not isinstance(doc, dict):
            raise ModelError(f"hf:{name}: a config.json holds an object")
        return doc
    try:  # a hub name such as meta-llama/Llama-3.2-1B: its config alone, no weights
        return dict(_import("transformers", "transformers").AutoConfig.from_pretrained(name).to_dict())
    except (OSError, ValueError) as e:
        raise ModelError(f"hf:{name}: not a preset ({', '.join(PRESETS)}), a config.json, nor a hub model whose "
                         f"config transformers could fetch ({str(e).splitlines()[0]})") from None


def hf_config(name: str, layers: int) -> Any:
    """The transformers config of a preset, a config.json or a hub model, with `layers` decoder layers (0: its own),
    its word embeddings untied (a pipeline holds the embedding and the head on different GPUs) and torch's SDPA
    attention."""
    transformers = _import("transformers", "transformers")
    doc = {k: v for k, v in _config_doc(name).items() if not k.startswith("_")}
    model_type = doc.pop("model_type", None)
    if model_type not in ("llama", "gpt2"):
        raise ModelError(f"hf:{name}: model_type {model_type!r} {NOT_SPLIT} here; hw splits llama and gpt2 models")
    config = transformers.AutoConfig.for_model(model_type, **doc)
    if layers:
        config.num_hidden_layers = layers
    config.tie_word_embeddings = False
    config._attn_implementation = "sdpa"
    return config


class HfEmbedding(nn.Module):
    """Token ids (b, s) -> hidden states: the token embedding, and GPT-2's learned positions and dropout."""

    def __init__(self, tokens: nn.Embedding, positions: nn.Embedding | None = None, drop: nn.Module | None = None):
        super().__init__()
        self.tokens, self.positions, self.drop = tokens, positions, drop or nn.Identity()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids)
        if self.positions is not None:
            x = x + self.positions(torch.arange(ids.shape[1], device=ids.device))
        return self.drop(x)


class HfDecoder(nn.Module):
    """One Hugging Face decoder layer as a pipeline layer: hidden states in, hidden states out, causal (no mask),
    with the rotary embeddings it needs made once per sequence length (as the model's forward makes them once)."""

    def __init__(self, layer: nn.Module, rotary: nn.Module | None):
        super().__init__()
        self.layer, self.rotary = layer, rotary
        self._tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kwargs: dict[str, Any] = {}
        if self.rotary is not None:
            key = (x.shape[1], x.device, x.dtype)
            if key not in self._tables:
                with torch.no_grad():
                    positions = torch.arange(x.shape[1], device=x.device)[None]
                    self._tables[key] = self.rotary(x, positions)
            kwargs["position_embeddings"] = self._tables[key]
        out = self.layer(x, attention_mask=None, **kwargs)
        return out[0] if isinstance(out, tuple) else out


def hf_layers(source: Source, name: str) -> Layers:
    """A llama or gpt2 causal LM: [embedding, decoder layers..., final norm + LM head], trained on next tokens."""
    if source.seq_len < 1:
        raise ModelError(f"hf:{name}: give the tokens per sequence (--seq-len)")
    transformers = _import("transformers", "transformers")
    config = hf_config(name, source.layers)
    net = transformers.AutoModelForCausalLM.from_config(config)
    if config.model_type == "llama":
        body = net.model
        first: nn.Module = HfEmbedding(body.embed_tokens)
        blocks = [(f"model.layers.{i}", HfDecoder(b, body.rotary_emb)) for i, b in enumerate(body.layers)]
        head = nn.Sequential(body.norm, net.lm_head)
    else:
        body = net.transformer
        if source.seq_len > config.n_positions:
            raise ModelError(f"hf:{name} has {config.n_positions} positions, fewer than --seq-len {source.seq_len}")
        first = HfEmbedding(body.wte, body.wpe, body.drop)
        blocks = [(f"transformer.h.{i}", HfDecoder(b, None)) for i, b in enumerate(body.h)]
        head = nn.Sequential(body.ln_f, net.lm_head)
    vocab = config.vocab_size
    source = replace(source, sample="sequence", input_high=vocab, target="classes", classes=vocab)
    sample = torch.randint(vocab, (1, source.seq_len))
    return Layers([("embed", first), *blocks, ("head", head)], source, sample)


def resnet_layers(net: nn.Module) -> list[tuple[str, nn.Module]]:
    """A torchvision-style ResNet (conv1, bn1, relu, maxpool, layer1-4, avgpool, fc) as [stem, its blocks..., head]."""
    parts = ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4", "avgpool", "fc")
    if not all(hasattr(net, p) for p in parts):
        raise ModelError(f"{type(net).__name__} {NOT_SPLIT}: hw splits ResNets (conv1 ... layer4, avgpool, fc)")
    part = {p: net.get_submodule(p) for p in parts}
    named: list[tuple[str, nn.Module]] = [("stem", nn.Sequential(*(part[p] for p in parts[:4])))]
    for group in parts[4:8]:
        named += [(f"{group}.{i}", block) for i, block in enumerate(part[group].children())]
    return named + [("head", nn.Sequential(part["avgpool"], nn.Flatten(1), part["fc"]))]


class VitEmbedding(nn.Module):
    """Images -> tokens, as torchvision's VisionTransformer makes them: patches projected, the class token first,
    position embeddings added, dropout."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.proj, self.class_token = net.get_submodule("conv_proj"), net.get_parameter("class_token")
        self.positions, self.drop = net.get_parameter("encoder.pos_embedding"), net.get_submodule("encoder.dropout")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.drop(x + self.positions)


class ClassTokenHead(nn.Module):
    """The final norm, the class token taken, and the classifier."""

    def __init__(self, norm: nn.Module, heads: nn.Module):
        super().__init__()
        self.norm, self.heads = norm, heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.heads(self.norm(x)[:, 0])


def vit_layers(net: nn.Module) -> list[tuple[str, nn.Module]]:
    """A torchvision-style VisionTransformer (conv_proj, class_token, encoder: pos_embedding, dropout, layers, ln;
    heads) as [embedding, its encoder blocks..., head]."""
    named: list[tuple[str, nn.Module]] = [("embed", VitEmbedding(net))]
    named += [(f"encoder.layers.{i}", block) for i, block in enumerate(net.get_submodule("encoder.layers").children())]
    return named + [("head", ClassTokenHead(net.get_submodule("encoder.ln"), net.get_submodule("heads")))]


def torchvision_layers(source: Source, name: str) -> Layers:
    """A torchvision classification model by name (a ResNet or a VisionTransformer), on `image_size` images
    (default 224)."""
    models = _import("torchvision.models", "torchvision")
    try:
        net = models.get_model(name, weights=None, **({"image_size": source.image_size}
                                                        if source.image_size and name.startswith("vit") else {}))
    except (ValueError, KeyError, TypeError) as e:
        raise ModelError(f"torchvision:{name}: {e}") from None
    return vision_layers(source, net)


def vision_layers(source: Source, net: nn.Module) -> Layers:
    """A ResNet's or a VisionTransformer's layers, classifying `image_size` images (default 224)."""
    side = source.image_size or 224
    if all(hasattr(net, p) for p in ("conv_proj", "class_token", "encoder", "heads")):
        named = vit_layers(net)
    else:
        named = resnet_layers(net)
    classes = [m for m in named[-1][1].modules() if isinstance(m, nn.Linear)][-1].out_features
    source = replace(source, sample="image", image_size=side, target="classes", classes=classes)
    return Layers(named, source, torch.randn(1, 3, side, side))


def timm_layers(source: Source, name: str) -> Layers:
    """A timm classification model by name, untrained (no download), on `image_size` images (default: its default
    config's input size); a VisionTransformer is built for that size."""
    timm = _import("timm", "timm")
    try:
        net = timm.create_model(name, pretrained=False)
        side = source.image_size or _square(name, tuple(getattr(net, "pretrained_cfg", {}).get("input_size", ())))
        if _fixed_size(net) not in (None, (side, side)):  # a ViT's position table is made for its image size
            net = timm.create_model(name, pretrained=False, img_size=side)
    except (RuntimeError, ValueError, TypeError, KeyError) as e:  # timm's "Unknown model (...)"
        raise ModelError(f"timm:{name}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    named = timm_named(name, net)
    classes = int(getattr(net, "num_classes", 0))
    source = replace(source, sample="image", image_size=side, target="classes", classes=classes)
    return Layers(named, source, torch.randn(1, 3, side, side))


def _fixed_size(net: nn.Module) -> tuple[int, int] | None:
    """The image size a model with patches takes alone (timm's ViT without dynamic_img_size); None for any size."""
    embed = getattr(net, "patch_embed", None)
    if embed is None or getattr(net, "dynamic_img_size", False) or getattr(embed, "img_size", None) is None:
        return None
    return (int(embed.img_size[0]), int(embed.img_size[1]))


def _square(name: str, input_size: tuple[int, ...]) -> int:
    """The side of a model's default input, which hw's image samples take square."""
    if len(input_size) != 3 or input_size[1] != input_size[2]:
        raise ModelError(f"timm:{name}'s default input is {'x'.join(map(str, input_size)) or 'not known'}, not a "
                         "square image: give --image-size")
    return int(input_size[1])


def function_layers(source: Source) -> Layers:
    """`package.module:function`: it returns (layers, sample inputs), layers an nn.Sequential or a list of modules;
    trained with mean squared error against random targets."""
    module_name, _, attr = source.model.partition(":")
    try:
        fn: Callable[[], Any] = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ModelError(f"model {source.model!r}: cannot import it ({e}); expected {SPECS}") from None
    made = fn()
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[1], torch.Tensor) and made[1].ndim >= 1):
        raise ModelError(f"{source.model} must return (layers, a batch of sample inputs), got {type(made).__name__}")
    layers, sample = made
    if isinstance(layers, nn.Sequential):
        named = [(n, m) for n, m in layers.named_children()]
    elif isinstance(layers, (list, tuple)) and all(isinstance(m, nn.Module) for m in layers):
        named = [(str(i), m) for i, m in enumerate(layers)]
    else:
        raise ModelError(f"{source.model}'s layers {NOT_SPLIT}: it returned {type(layers).__name__}, not an "
                         "nn.Sequential or a list of modules")
    if not named:
        raise ModelError(f"{source.model} returned no layers")
    integer = not sample.is_floating_point()
    high = int(sample.max()) + 1 if integer else 0
    return Layers(named, replace(source, input_high=high), sample[:1])


def loss_of(source: Source) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loss on the last layer's output: cross-entropy over classes (on fp32 logits), else mean squared error."""
    return lm_loss if source.target == "classes" else nn.functional.mse_loss


def timed_batch(source: Source, in_shape: tuple[int, ...], out_shape: tuple[int, ...], samples: int,
                generator: torch.Generator, device: torch.device | str, dtype: torch.dtype,
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Random inputs (token ids below input_high, else values) and targets (a class id per row of logits, else
    values) for `samples` samples of a model of `source`, whose first layer takes `in_shape` and last gives
    `out_shape` per sample."""
    if source.input_high:
        x = torch.randint(source.input_high, (samples, *in_shape), generator=generator).to(device)
    else:
        x = torch.randn((samples, *in_shape), generator=generator).to(device, dtype)
    if source.target == "classes":
        y = torch.randint(source.classes, (samples, *out_shape[:-1]), generator=generator).to(device)
    else:
        y = torch.randn((samples, *out_shape), generator=generator).to(device, dtype)
    return x, y
