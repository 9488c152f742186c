"""Timed layers: a user's own model, each layer priced by what `python -m hw profile` measured of it on a GPU.

A timed layer brings its own costs (forward, input-grad and weight-grad GPU time against the samples in a micro-batch,
and its host's launch time) and its own bytes (parameters, output, what autograd keeps, working memory), all per
sample. Its costs join the profile's layer table under its cost key (`priced`), so every runtime's and host's
adjustment of the profile applies to them as to any calibrated layer. Work is counted in samples, not FLOPs.
A profiled model file is `{"profiled": {...provenance}, "source": {...}, "samples": N, "layers": [...]}` (FILE_FORMAT).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, TypeGuard

from parsim.errors import ModelError, ProfileError
from parsim.inputs import MAX_LAYERS, MAX_SIZE, text_field, whole
from parsim.profile import LayerCosts, Profile, layer_costs_from_json
from parsim.workload.layers import MAX_DTYPE_BYTES, Part

TARGETS = ("mse", "classes")  # the loss on the last layer's output: mean squared error, or cross-entropy over classes
DTYPES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
FILE_FORMAT = ('a profiled model file, as `python -m hw profile` writes it: {"profiled": {...}, "source": {"model": '
               '...}, "samples": N, "layers": [{"name": ..., "costs": {...}, ...}]}')


@dataclass(frozen=True)
class Source:
    """Where a profiled model comes from, as hw rebuilds it: the model `hw profile` was given and what its batch is."""

    model: str  # "hf:llama-3.2-1b", "hf:PATH/config.json", "torchvision:resnet50", "package.module:function"
    sample: str = "sample"  # what one sample is: "sequence", "image", "sample"
    seq_len: int = 0  # a Hugging Face model's tokens per sequence
    layers: int = 0  # a Hugging Face model's decoder layers, where fewer than its config's (0: the config's)
    image_size: int = 0  # a vision model's input side
    input_high: int = 0  # the inputs are integers (token ids) below this; 0: floating point
    target: str = "mse"  # TARGETS
    classes: int = 0  # with target "classes": how many (a vocabulary, or image classes)
    dtype: str = "bfloat16"  # the parameters' and activations' dtype
    file: str = ""  # the model file this was read from (what a results CSV names); "" where built in memory
    timed_on: str = ""  # the device `hw profile` timed it on, as its file's "profiled" says

    def __post_init__(self) -> None:
        if self.target not in TARGETS or self.dtype not in DTYPES or (self.target == "classes") != (self.classes > 0):
            raise ModelError(f"a profiled model's source needs target {' or '.join(TARGETS)} (classes > 0 with "
                             f"\"classes\") and a dtype of {', '.join(DTYPES)}, got {self.target!r}, "
                             f"{self.classes!r}, {self.dtype!r}")


@dataclass(frozen=True)
class TimedLayer:
    """One layer of a user's model and what it was measured to cost and hold, per sample (see the module doc)."""

    name: str  # the module's path in the user's model ("model.layers.3"), unique in its model
    source: Source
    costs: LayerCosts  # GPU time against samples (fixed_s + samples / flops_per_s, corrected), host time per op
    in_shape: tuple[int, ...]  # one sample's input
    out_shape: tuple[int, ...]
    params: int
    dtype_bytes: int
    out_bytes_per_token: int
    stash_bytes_per_token: int
    forward_workspace_bytes_per_token: int = 0
    backward_workspace_bytes_per_token: int = 0
    flops_per_token: float = 0.0  # forward FLOPs per sample, as torch's FlopCounterMode counts them (for reports)
    saved_tensors: int | None = None  # tensors its forward saved for autograd (files before 2026-11-28: unknown)

    kind = "timed"
    captured_bytes_per_token = 0  # a split backward's extra memory: not measured
    weight_grad_held_bytes_per_token = 0
    early_freed_bytes_per_token = 0  # nothing counted freed before a split backward's weight-grad ends
    core_freed_bytes_per_token = 0  # timed whole: no attention core apart (recompute.check_layers refuses selective)
    core_saved_tensors = 0

    @property
    def core_parts(self) -> tuple[Part, ...]:
        return ()
    unweighted_stash_bytes_per_token = 0  # what of the stash only ops without weights keep: not measured

    @property
    def sample(self) -> str:
        return self.source.sample

    @property
    def hidden(self) -> int:
        """Its width: the last size of what it passes on (a results CSV's "hidden")."""
        return self.out_shape[-1]

    @property
    def cost_key(self) -> str:
        """The key its costs join the profile under: "timed:model.layers.3"."""
        return f"timed:{self.name}"

    @property
    def parts(self) -> tuple[Part, ...]:
        """One part, priced by its own costs: a sample of work in each op (no weight-grad without parameters)."""
        return (Part((self.cost_key,), (1.0, 1.0, 1.0 if self.params else 0.0)),)


def is_timed(model_layers: tuple[Any, ...]) -> bool:
    """Whether a model's layers are a profiled model's."""
    return bool(model_layers) and isinstance(model_layers[0], TimedLayer)


def priced(profile: Profile, model_layers: tuple[Any, ...]) -> Profile:
    """`profile` with the timed layers' own costs in its layer table (their host's at the profile's host_scale), so
    that every later adjustment of the profile (a runtime's, a slower host's) applies to them too; the profile
    itself where the model has none."""
    own = {layer.cost_key: layer.costs for layer in model_layers if isinstance(layer, TimedLayer)}
    if not own:
        return profile
    if profile.host_scale != 1.0:
        own = {k: c.host_slower(profile.host_scale) for k, c in own.items()}
    return replace(profile, layers={**profile.layers, **own})


def timed_elsewhere(model_layers: tuple[Any, ...], profile: Profile) -> list[str]:
    """A note where a profiled model was timed on another device than the profile's: its layers' costs are that
    device's, the rest the profile's."""
    if not is_timed(model_layers):
        return []
    timed_on, gpu = model_layers[0].source.timed_on, str(profile.meta.get("gpu", ""))
    if not timed_on or timed_on == gpu:
        return []
    return [f"layers timed on {timed_on}, the rest priced by the profile's {gpu or 'unnamed device'}"]


def describe(model_layers: tuple[Any, ...], samples: int) -> str:
    """A profiled model's name in reports: "hf:llama-3.2-1b (18 layers), 32 sequences"."""
    source = model_layers[0].source
    return f"{source.model} ({len(model_layers)} layers), {samples} {source.sample}s"


def is_profiled(doc: object) -> TypeGuard[dict[str, Any]]:
    """Whether a model file is a profiled model's (it has "profiled")."""
    return isinstance(doc, dict) and "profiled" in doc


def profiled_layers(doc: dict[str, Any], where: str, path: str) -> tuple[tuple[TimedLayer, ...], int]:
    """A profiled model file's layers (each entry's `count` copies) and its samples per step, each field checked."""
    profiled = doc.get("profiled")
    timed_on = profiled.get("gpu") if isinstance(profiled, dict) else None
    source = replace(_source(doc.get("source"), f"{where}: source", path),
                     timed_on=timed_on if isinstance(timed_on, str) else "")
    specs = doc.get("layers")
    if not isinstance(specs, list) or not specs:
        raise ModelError(f"{where} needs a non-empty \"layers\" list; expected {FILE_FORMAT}")
    layers: list[TimedLayer] = []
    names: set[str] = set()
    for i, spec in enumerate(specs):
        layer, count = _timed(spec, f"{where}: layers[{i}]", source)
        if layer.name in names:
            raise ModelError(f"{where}: layers[{i}] is named {layer.name!r} as an earlier entry is; names key costs")
        names.add(layer.name)
        whole(len(layers) + count, f"{where}: the layers' counts in all", 1, MAX_LAYERS, ModelError)
        layers += [layer] * count
    return tuple(layers), whole(doc.get("samples"), f"{where}: samples", 1, MAX_SIZE, ModelError)


def _source(doc: Any, where: str, path: str) -> Source:
    if not isinstance(doc, dict):
        raise ModelError(f"{where} must be an object naming the profiled model; expected {FILE_FORMAT}")
    known = {f.name for f in fields(Source)} - {"file", "timed_on"}
    extra = sorted(set(doc) - known)
    if extra:
        raise ModelError(f"{where} has unknown fields {', '.join(extra)}; it takes {', '.join(sorted(known))}")
    values: dict[str, Any] = {}
    for key in ("model", "sample", "target", "dtype"):
        if key in doc:
            values[key] = text_field(doc[key], f"{where}.{key}", ModelError)
    for key in ("seq_len", "layers", "image_size", "input_high", "classes"):
        if key in doc:
            values[key] = whole(doc[key], f"{where}.{key}", 0, MAX_SIZE, ModelError)
    if "model" not in values:
        raise ModelError(f"{where} lacks \"model\"")
    return Source(**values, file=path)


def _shape(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > 8:
        raise ModelError(f"{where} must be a list of at most 8 sizes, got {value!r}")
    return tuple(whole(v, where, 1, MAX_SIZE, ModelError) for v in value)


def _timed(spec: Any, where: str, source: Source) -> tuple[TimedLayer, int]:
    """A layer entry's TimedLayer and its count."""
    if not isinstance(spec, dict):
        raise ModelError(f"{where} must be an object; expected {FILE_FORMAT}")
    costs_doc = spec.get("costs")
    if not isinstance(costs_doc, dict):
        raise ModelError(f"{where} lacks its \"costs\" (forward, backward_input, backward_weight)")
    try:
        costs = layer_costs_from_json(costs_doc, f"{where}.costs")
    except ProfileError as e:
        raise ModelError(str(e)) from None
    sizes = {k: whole(spec.get(k, 0), f"{where}.{k}", 0, 10**15, ModelError)
             for k in ("params", "out_bytes_per_token", "stash_bytes_per_token", "forward_workspace_bytes_per_token",
                       "backward_workspace_bytes_per_token")}
    saved = spec.get("saved_tensors")
    saved = None if saved is None else whole(saved, f"{where}.saved_tensors", 0, 10**9, ModelError)
    flops = spec.get("flops_per_token", 0.0)
    if isinstance(flops, bool) or not isinstance(flops, (int, float)) or not 0 <= flops < 1e30:
        raise ModelError(f"{where}.flops_per_token must be a number >= 0, got {flops!r}")
    layer = TimedLayer(text_field(spec.get("name"), f"{where}.name", ModelError), source, costs,
                       _shape(spec.get("in_shape"), f"{where}.in_shape"),
                       _shape(spec.get("out_shape"), f"{where}.out_shape"),
                       dtype_bytes=whole(spec.get("dtype_bytes", DTYPES[source.dtype]), f"{where}.dtype_bytes", 1,
                                         MAX_DTYPE_BYTES, ModelError),
                       flops_per_token=float(flops), saved_tensors=saved, **sizes)
    return layer, whole(spec.get("count", 1), f"{where}.count", 1, MAX_LAYERS, ModelError)
