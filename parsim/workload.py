"""The workload: a model as a list of layers, its partition into stages, and per-stage costs.

The default model is the stack of MLP blocks that `hw measure` runs, so a default prediction can be
checked on hardware; `conv_model` is the ResNet-like conv net it also runs (`--conv`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import NamedTuple

from parsim.errors import ModelError
from parsim.profile import LayerCosts, OpCost, Profile


@dataclass(frozen=True)
class Kind:
    """A layer kind's formulas, per sample, for a residual block on a C x S x S map (an MLP token is a 1 x 1 map).

    Forward multiply-adds are `macs` C^2 S^2; input-grad and weight-grad each cost the same again.
    """

    macs: int  # forward multiply-adds per C^2 S^2
    weights: int  # weights per C^2
    vectors: int  # biases and norm scales and shifts per C
    stash: int  # elements autograd keeps from forward to backward, per C S^2
    shrink: int = 1  # the input has C / shrink channels on a (shrink S)^2 map: 2 for a downsampling block
    spatial: bool = True  # has a side S (profile key "kind@CxS"); False: vectors of C (key "kind@C")
    sample: str = "image"  # what one sample is, for reports


KINDS = {
    # x + W2 gelu(W1 layernorm(x)), 4x expansion: two C x 4C matmuls; biases 4C + C, layernorm 2C;
    # kept: layernorm input and output (C each), fc1 output and gelu output (4C each)
    "mlp": Kind(macs=8, weights=8, vectors=7, stash=10, spatial=False, sample="token"),
    # x + conv3x3(relu(bn(conv3x3(relu(bn(x)))))), no conv bias: two 9 C^2 convs, two batch norms' affine (2C each);
    # kept: bn1 input, relu1 output (conv1's input), conv1 output (bn2's input), relu2 output (conv2's input)
    "conv": Kind(macs=18, weights=18, vectors=4, stash=4),
    # C/2 x 2S x 2S -> C x S x S: a = relu(bn(x)); conv3x3/2(a) (4.5 C^2) -> bn-relu -> conv3x3 (9 C^2), plus the
    # shortcut conv1x1/2(a) (0.5 C^2); batch norms over C/2 and C; kept: bn1 input and a (2 C S^2 each),
    # conv1 output and relu2 output (C S^2 each)
    "down": Kind(macs=14, weights=14, vectors=3, stash=6, shrink=2),
}


@dataclass(frozen=True)
class Layer:
    """One layer's work per sample (a token for "mlp", an image for "conv" and "down"); the profile's
    costs for its kind turn FLOPs into seconds. `hidden` is the width: hidden size, or channels C."""

    kind: str
    hidden: int
    dtype_bytes: int = 2
    side: int = 1  # the feature map's side S for conv kinds; 1 for an MLP

    def __post_init__(self) -> None:
        k = KINDS.get(self.kind)
        if k is None:
            raise ModelError(f"unknown layer kind {self.kind!r}; parsim knows: {', '.join(sorted(KINDS))}")
        if min(self.hidden, self.dtype_bytes, self.side) < 1:
            raise ModelError(f"a {self.kind} layer needs hidden, side and dtype_bytes >= 1, got "
                             f"{self.hidden}, {self.side}, {self.dtype_bytes}")
        if self.hidden % k.shrink or (not k.spatial and self.side != 1):
            raise ModelError(f"a {self.kind} layer needs " + (f"channels divisible by {k.shrink}, got {self.hidden}"
                                                               if k.spatial else f"no side, got {self.side}"))

    @property
    def formulas(self) -> Kind:
        return KINDS[self.kind]

    @property
    def flops_per_token(self) -> float:
        """FLOPs of the forward (and of each of input-grad, weight-grad) per sample: 2 per multiply-add."""
        return 2.0 * self.formulas.macs * self.hidden**2 * self.side**2

    @property
    def params(self) -> int:
        return self.formulas.weights * self.hidden**2 + self.formulas.vectors * self.hidden

    @property
    def in_shape(self) -> tuple[int, ...]:
        """One sample's input: (C,) for an MLP, (channels, side, side) for a conv kind."""
        k = self.formulas
        return (self.hidden // k.shrink, self.side * k.shrink, self.side * k.shrink) if k.spatial else (self.hidden,)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.hidden, self.side, self.side) if self.formulas.spatial else (self.hidden,)

    @property
    def out_bytes_per_token(self) -> int:
        return self.hidden * self.side**2 * self.dtype_bytes

    @property
    def stash_bytes_per_token(self) -> int:
        """Activations kept for the backward (see KINDS)."""
        return self.formulas.stash * self.hidden * self.side**2 * self.dtype_bytes

    @property
    def cost_key(self) -> str:
        """The profile key of costs fitted at this layer's shape: "mlp@2048", "conv@64x56"."""
        return f"{self.kind}@{self.hidden}" + (f"x{self.side}" if self.formulas.spatial else "")


@dataclass(frozen=True)
class Model:
    """A sequential model, the batch it is trained on, and optionally how its layers split into stages."""

    layers: tuple[Layer, ...]
    tokens: int  # samples per training step (tokens, or images for a conv net), all micro-batches
    balance: tuple[int, ...] | None = None  # layers per stage (torchgpipe's term); None: equal counts

    def __post_init__(self) -> None:
        for i, (a, b) in enumerate(zip(self.layers, self.layers[1:])):
            if a.out_shape != b.in_shape:
                raise ModelError(f"layer {i + 1} ({b.cost_key}) takes {_shape(b.in_shape)} per sample but "
                                 f"layer {i} ({a.cost_key}) gives {_shape(a.out_shape)}")
        if self.balance is not None:
            check_balance(self.balance, len(self.layers))

    @property
    def sample(self) -> str:
        """What one sample is: "token" or "image"."""
        return self.layers[0].formulas.sample

    @property
    def name(self) -> str:
        kinds = sorted({layer.kind for layer in self.layers})
        h = sorted({layer.hidden for layer in self.layers})
        sides = sorted({layer.side for layer in self.layers}, reverse=True)
        shape = f"h={'/'.join(map(str, h))}" if self.sample == "token" else \
            f"C={'/'.join(map(str, h))}, S={'/'.join(map(str, sides))}"
        split = f", balance {'/'.join(map(str, self.balance))}" if self.balance else ""
        return f"{len(self.layers)} x {'+'.join(kinds)}({shape}), {self.tokens} {self.sample}s{split}"


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))


def check_balance(balance: tuple[int, ...], num_layers: int, num_stages: int | None = None) -> None:
    """A balance names every layer once, in stages of at least one (and, if given, num_stages of them)."""
    text = ",".join(map(str, balance))
    if not balance or min(balance) < 1 or sum(balance) != num_layers:
        raise ModelError(f"balance {text} must be positive layer counts that add up to the model's "
                         f"{num_layers} layers")
    if num_stages is not None and len(balance) != num_stages:
        raise ModelError(f"balance {text} gives {len(balance)} stages but the schedule has {num_stages}")


MODEL_SPECS = ("LAYERSxHIDDENxTOKENS (an MLP stack, e.g. 16x2048x8192), conv:IMAGES (the conv net, e.g. conv:256) "
               "or conv:IMAGES:WIDTHS:BLOCKS:SIDE (a custom conv net, e.g. conv:8:4-8:1-2:8)")
CONV_DEFAULTS = ((64, 128, 256, 512), (3, 4, 6, 3), 56)  # the conv net's widths, blocks and side (ResNet-34's)


def model_from_spec(text: str) -> Model:
    """A model from its one-word spec, as `hw validate --models` and results CSVs name it.

    `LxHxT`: L MLP blocks of hidden size H, T tokens per step (mlp_model). `conv:N`: the conv net
    (conv_model) on N images per step. `conv:N:W1-W2:B1-B2:S`: a conv net of groups of B1, B2, ...
    blocks of W1, W2, ... channels on an S x S input map (conv_model(N, widths, blocks, S)), e.g.
    conv:8:4-8:1-2:8 for a tiny one. ModelError naming these forms if the text is none of them.
    """
    try:
        return _from_spec(text.strip().lower())
    except ModelError as e:
        raise ModelError(f"model spec {text!r}: {e}") from None
    except ValueError:
        raise ModelError(f"bad model spec {text!r}; expected {MODEL_SPECS}") from None


def _from_spec(text: str) -> Model:
    """model_from_spec without its error wording: ValueError for a malformed spec."""
    if not text.startswith("conv:"):
        layers, hidden, tokens = _whole_numbers(text, "x", 3)
        return mlp_model(layers, hidden, tokens)
    parts = text.split(":")[1:]
    if len(parts) == 1:
        return conv_model(int(parts[0]))
    if len(parts) != 4:
        raise ValueError(text)
    widths, blocks = _whole_numbers(parts[1], "-"), _whole_numbers(parts[2], "-")
    return conv_model(int(parts[0]), widths, blocks, int(parts[3]))


def _whole_numbers(text: str, sep: str, count: int | None = None) -> tuple[int, ...]:
    """'4-8' -> (4, 8); ValueError unless every item is a whole number (and there are `count` of them)."""
    values = tuple(int(v) for v in text.split(sep))
    if count is not None and len(values) != count:
        raise ValueError(text)
    return values


def model_spec(model: Model) -> str:
    """The spec model_from_spec turns back into `model`: what a results CSV's `model` column holds."""
    first = model.layers[0]
    if first.kind == "mlp":
        spec = f"{len(model.layers)}x{first.hidden}x{model.tokens}"
    else:
        starts = [i for i, layer in enumerate(model.layers) if i == 0 or layer.kind == "down"]
        widths = tuple(model.layers[i].hidden for i in starts)
        blocks = tuple(b - a for a, b in zip(starts, starts[1:] + [len(model.layers)]))
        custom = (widths, blocks, first.side) != CONV_DEFAULTS
        spec = f"conv:{model.tokens}" + (f":{_dashed(widths)}:{_dashed(blocks)}:{first.side}" if custom else "")
    try:
        same = _from_spec(spec) == replace(model, balance=None)
    except (ModelError, ValueError):
        same = False
    if not same:
        raise ModelError(f"{model.name} has no model spec; specs name {MODEL_SPECS}")
    return spec


def _dashed(values: tuple[int, ...]) -> str:
    return "-".join(map(str, values))


def model_label(model: Model) -> str:
    """A short readable name for tables and plots: '16x h=2048, 8192 tokens' for an MLP stack, else Model.name."""
    first = model.layers[0]
    if first.kind == "mlp" and all(layer == first for layer in model.layers) and model.balance is None:
        return f"{len(model.layers)}x h={first.hidden}, {model.tokens} tokens"
    return model.name


def mlp_model(layers: int = 16, hidden: int = 2048, tokens: int = 8192, dtype_bytes: int = 2) -> Model:
    """The default model: `layers` identical MLP blocks."""
    for name, value in (("layers", layers), ("hidden", hidden), ("tokens", tokens)):
        if value < 1:
            raise ModelError(f"--{name} must be at least 1, got {value}")
    return Model(tuple(Layer("mlp", hidden, dtype_bytes) for _ in range(layers)), tokens)


def conv_model(images: int = 256, widths: tuple[int, ...] = CONV_DEFAULTS[0], blocks: tuple[int, ...] = CONV_DEFAULTS[1],
               side: int = CONV_DEFAULTS[2], dtype_bytes: int = 2) -> Model:
    """A ResNet-34-like net of pre-activation basic blocks: group g has blocks[g] blocks of widths[g] channels,
    its first a `down` block (half the side) in every group after the first.

    The stem (7x7 conv, pooling) and the classifier stay out of the pipelined layers: the model's input is
    the stem's output, widths[0] x side x side per image.
    """
    if images < 1:
        raise ModelError(f"--images must be at least 1, got {images}")
    if len(widths) != len(blocks) or not blocks or min(blocks) < 1:
        raise ModelError(f"a conv net needs a width and at least one block per group, got {widths} and {blocks}")
    layers = []
    for g, (width, count) in enumerate(zip(widths, blocks)):
        if g:
            if side % 2:
                raise ModelError(f"side {side} cannot halve at group {g}: use a side divisible by "
                                 f"{2 ** (len(widths) - 1)}")
            side //= 2
        first = Layer("down" if g else "conv", width, dtype_bytes, side)
        layers += [first] + [Layer("conv", width, dtype_bytes, side)] * (count - 1)
    return Model(tuple(layers), images)


MODEL_FILE = ('{"tokens": N, "layers": [{"kind": "mlp", "hidden": H, "count": C}]} or, for a conv net, '
              '{"images": N, "layers": [{"kind": "conv" or "down", "hidden": CHANNELS, "side": S, "count": C}]}')


def load_model(path: str | Path) -> Model:
    """A model file (see MODEL_FILE); "images" is another name for "tokens"."""
    try:
        doc = json.loads(Path(path).read_text())
        layers = []
        for spec in doc["layers"]:
            layer = Layer(str(spec.get("kind", "mlp")), int(spec["hidden"]), int(spec.get("dtype_bytes", 2)),
                          int(spec.get("side", 1)))
            layers += [layer] * int(spec.get("count", 1))
        tokens = int(doc["tokens"] if "tokens" in doc else doc["images"])
        if not layers or tokens < 1:
            raise ValueError("it needs at least one layer and tokens (or images) >= 1")
        return Model(tuple(layers), tokens)
    except OSError as e:
        raise ModelError(f"cannot read model file {path}: {e.strerror or e}") from None
    except ModelError as e:
        raise ModelError(f"model file {path}: {e}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ModelError(f"model file {path} is malformed ({type(e).__name__}: {e}); expected {MODEL_FILE}") from None


def partition(num_layers: int, num_stages: int) -> list[range]:
    """Split layers into contiguous stages of equal count (the first stages take the remainder)."""
    _check_stages(num_layers, num_stages)
    size, extra = divmod(num_layers, num_stages)
    return _ranges([size + (1 if s < extra else 0) for s in range(num_stages)])


def _check_stages(num_layers: int, num_stages: int) -> None:
    if num_stages < 1:
        raise ModelError(f"need at least one stage, got {num_stages}")
    if num_stages > num_layers:
        raise ModelError(f"cannot split {num_layers} layers into {num_stages} stages: "
                         "use more layers or fewer GPUs")


def _ranges(balance: list[int] | tuple[int, ...]) -> list[range]:
    bounds = [0]
    for count in balance:
        bounds.append(bounds[-1] + count)
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def stage_layers(model: Model, num_stages: int) -> list[range]:
    """The layers of each stage: the model's balance if it has one, else equal counts.

    parsim's stage costs and hw's stages both come from here, so the simulated and the run split agree.
    """
    if model.balance is None:
        return partition(len(model.layers), num_stages)
    check_balance(model.balance, len(model.layers), num_stages)
    return _ranges(model.balance)


def partition_by_time(gpu: list[float], num_stages: int, host: list[float] | None = None,
                      host_fixed_s: float = 0.0) -> tuple[int, ...]:
    """Layers per stage (a balance) of contiguous stages whose slowest stage is as fast as it can be.

    A stage takes the sum of its layers' `gpu` times, or, given `host`, the slower of that and its
    host's time (host_fixed_s per stage plus its layers' launch times): within a stage the host
    launches while the GPU runs, so the two overlap, and a host-bound stage is slow however light
    its kernels. Exact, by dynamic programming over (stages, layers): O(stages x layers^2), instant
    at hundreds of layers. Where the equal split is already optimal it is kept: it is what
    `--partition equal` runs.
    """
    n = len(gpu)
    _check_stages(n, num_stages)
    gpu_sum, host_sum = _prefix(gpu), _prefix(host) if host is not None else None

    def stage_time(a: int, b: int) -> float:
        t = gpu_sum[b] - gpu_sum[a]
        return t if host_sum is None else max(t, host_fixed_s + host_sum[b] - host_sum[a])

    inf = float("inf")
    # best[k][i]: the slowest stage of the best split of the first i layers into k stages; cut[k][i]: its last cut
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, num_stages + 1):
        for i in range(k, n - (num_stages - k) + 1):
            for j in range(k - 1, i):
                slowest = max(best[k - 1][j], stage_time(j, i))
                if slowest < best[k][i]:
                    best[k][i], cut[k][i] = slowest, j
    equal = partition(n, num_stages)
    if max(stage_time(r.start, r.stop) for r in equal) <= best[num_stages][n] * (1 + 1e-12):
        return tuple(len(r) for r in equal)
    balance, i = [], n
    for k in range(num_stages, 0, -1):
        balance.append(i - cut[k][i])
        i = cut[k][i]
    return tuple(reversed(balance))


def _prefix(values: list[float]) -> list[float]:
    out = [0.0]
    for v in values:
        out.append(out[-1] + v)
    return out


@dataclass(frozen=True)
class Work:
    """GPU and host time of one compute action, and how finely the host feeds it to the GPU."""

    gpu_s: float
    host_s: float
    chunks: int  # kernels are issued layer by layer: the GPU may start after the first

    def __add__(self, other: Work) -> Work:
        return Work(self.gpu_s + other.gpu_s, self.host_s + other.host_s, self.chunks + other.chunks)


@dataclass(frozen=True)
class StageCost:
    """What one micro-batch costs on one stage."""

    forward: Work
    backward_input: Work
    backward_weight: Work
    send_bytes: int  # activation (or its gradient) crossing to the neighbouring stage
    stash_bytes: int  # activations kept from forward to backward
    grad_bytes: int = 0  # the stage's weight gradients, all-reduced across data-parallel replicas

    @cached_property
    def backward(self) -> Work:
        return self.backward_input + self.backward_weight


OPS = ("forward", "backward_input", "backward_weight")


def _work(cost: OpCost, flops: float) -> Work:
    return Work(cost.gpu_s(flops), cost.host_s, 1)


def layer_costs(profile: Profile, layer: Layer) -> LayerCosts:
    """The profile's costs fitted at this layer's shape ("mlp@2048", "conv@64x56") if it has them, else its kind's."""
    costs = profile.layers.get(layer.cost_key) or profile.layers.get(layer.kind)
    if costs is None:
        hint = "; calibrate them with `python -m hw calibrate --conv`" if layer.formulas.spatial else ""
        raise ModelError(f"the profile has no costs for layer kind {layer.kind!r} ({layer.cost_key}); it knows: "
                         f"{', '.join(sorted(profile.layers))}{hint}")
    return costs


def microbatch_tokens(model: Model, num_microbatches: int, data_parallel: int = 1) -> int:
    """Samples in one micro-batch: the batch split over replicas, then micro-batches, evenly."""
    if num_microbatches < 1 or data_parallel < 1:
        raise ModelError(f"need at least one micro-batch and replica, got {num_microbatches} and {data_parallel}")
    if model.tokens % (num_microbatches * data_parallel):
        units = f"{model.tokens} {model.sample}s"
        raise ModelError(f"{units} do not split into {data_parallel} replica(s) x {num_microbatches} equal "
                         f"micro-batches" if data_parallel > 1 else
                         f"{units} do not split into {num_microbatches} equal micro-batches")
    return model.tokens // (num_microbatches * data_parallel)


class LayerTime(NamedTuple):
    """One layer's forward plus backward for one micro-batch: the GPU's time and the host's to launch it."""

    gpu_s: float
    host_s: float


def layer_times(model: Model, tokens: int, profile: Profile) -> list[LayerTime]:
    """Each layer's GPU and host time for one micro-batch of `tokens` samples, forward plus backward."""
    out = []
    for layer in model.layers:
        lc = layer_costs(profile, layer)
        flops = layer.flops_per_token * tokens
        out.append(LayerTime(sum(getattr(lc, op).gpu_s(flops) for op in OPS),
                             sum(getattr(lc, op).host_s for op in OPS)))
    return out


PARTITIONS = ("equal", "time")


def partitioned(model: Model, how: str, num_stages: int, num_microbatches: int, profile: Profile,
                data_parallel: int = 1) -> Model:
    """The model split `how` says: "equal" layer counts, or balanced by the profile's time per layer at this
    micro-batch size (torchgpipe's balance_by_time, from the profile instead of a timed run, each stage
    paced by the slower of its GPU and its host)."""
    if how == "equal":
        return replace(model, balance=None)
    if how != "time":
        raise ModelError(f"unknown partition {how!r}; choose from {', '.join(PARTITIONS)}")
    times = layer_times(model, microbatch_tokens(model, num_microbatches, data_parallel), profile)
    balance = partition_by_time([t.gpu_s for t in times], num_stages, [t.host_s for t in times],
                                host_fixed_s=2 * profile.host.action_s)  # a forward and a backward action
    return replace(model, balance=balance)


def stage_costs(model: Model, num_stages: int, num_microbatches: int, profile: Profile,
                data_parallel: int = 1) -> list[StageCost]:
    """Per-stage costs of one micro-batch, for the model's split of layers (see stage_layers), and of the
    batch over data-parallel replicas and then micro-batches."""
    tokens = microbatch_tokens(model, num_microbatches, data_parallel)
    costs = []
    for layer_ids in stage_layers(model, num_stages):
        layers = [model.layers[i] for i in layer_ids]
        works = {op: Work(0.0, 0.0, 0) for op in OPS}
        for layer in layers:
            lc = layer_costs(profile, layer)
            flops = layer.flops_per_token * tokens
            for op in works:
                works[op] = works[op] + _work(getattr(lc, op), flops)
        costs.append(StageCost(
            works["forward"], works["backward_input"], works["backward_weight"],
            send_bytes=layers[-1].out_bytes_per_token * tokens,
            stash_bytes=sum(layer.stash_bytes_per_token for layer in layers) * tokens,
            grad_bytes=sum(layer.params * layer.dtype_bytes for layer in layers),
        ))
    return costs
