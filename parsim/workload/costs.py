"""What a model costs per micro-batch, layer by layer and stage by stage, priced by the profile; and the split
balanced by those costs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, NamedTuple

from parsim.errors import ModelError
from parsim.profile import ACCUMULATE, AUTOGRAD_ACCUMULATE, LAYER_OPS, LayerCosts, OpCost, Profile
from parsim.workload.layers import KINDS, Part
from parsim.workload.models import Model
from parsim.workload.partition import partition_by_time, stage_layers
from parsim.workload.recompute import loss_kept_bytes_per_token
from parsim.workload.tensor_parallel import collective_s


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
    layers: int = 0  # how many layers the stage holds
    # selective recomputation (parsim.workload.recompute): its attention cores' forward, which each backward runs
    # again (chunks: how many cores), and the stash bytes it frees
    core_forward: Work = Work(0.0, 0.0, 0)
    core_freed_bytes: int = 0
    loss_bytes: int = 0  # what its loss keeps outside a checkpoint of the stage (parsim.workload.recompute)
    # tensors its layers' forwards save, checkpointing's hooks running per tensor, and its attention cores'
    # (selective's checkpoints); None: unknown, each layer (or core) taken as an MLP block
    saved_tensors: int | None = None
    core_saved_tensors: int | None = None

    @cached_property
    def backward(self) -> Work:
        return self.backward_input + self.backward_weight


OPS = LAYER_OPS  # a layer's ops, in the order StageCost and LayerCosts hold them


def gradient_add_s(profile: Profile, cost: StageCost) -> float | None:
    """GPU time to add one micro-batch's weight gradients into a stage's (each gradient action after the stage's
    first), or None where the profile does not price it: a runtime's own add over the whole stage (CUDA graphs:
    one multi-tensor kernel), else autograd's `.grad += g`, one kernel per parameter tensor (its fixed part per
    layer). Either moves 3x the gradients' bytes (read both, write one)."""
    whole = profile.kernels.get(ACCUMULATE)
    if whole is not None:
        return whole.time_s(3 * cost.grad_bytes)
    each = profile.kernels.get(AUTOGRAD_ACCUMULATE)
    if each is not None:
        return cost.layers * each.fixed_s + 3 * cost.grad_bytes / each.rate
    return None


def gradient_adds(profile: Profile, costs: list[StageCost]) -> list[float] | None:
    """gradient_add_s of each stage, or None where the profile prices no gradient add."""
    adds = [gradient_add_s(profile, c) for c in costs]
    known = [a for a in adds if a is not None]
    return known if len(known) == len(adds) else None


# a kind a profile may lack -> the measured kind that prices it instead, said beside each prediction (stand_ins): a
# GPT-2 block (LayerNorm, GELU, biases) as a Llama block (RMSNorm, SwiGLU): the same GEMMs at their FLOPs
STAND_INS = {"gpt": "llama"}


def _own_costs(profile: Profile, part: Part) -> LayerCosts | None:
    for key in part.keys:
        costs = profile.layers.get(key) or width_blend(profile, key)
        if costs is not None:
            return costs
    return None


def part_costs(profile: Profile, part: Part) -> LayerCosts:
    """The profile's costs for a layer's part at its shape ("mlp@2048", "attention@d128") if it has them; for an
    MLP width between two calibrated ones, theirs blended (width_blend); else its kind's ("mlp", "attention"); else
    its stand-in kind's (STAND_INS)."""
    costs = _own_costs(profile, part)
    if costs is not None:
        return costs
    stand_in = profile.layers.get(STAND_INS.get(part.keys[-1], ""))
    if stand_in is not None:
        return stand_in
    raise ModelError(f"the profile has no costs for layer kind {part.keys[-1]!r} ({part.keys[0]}); it knows: "
                     f"{', '.join(sorted(profile.layers))}{part.hint}")


@dataclass(frozen=True)
class BlendedCost(OpCost):
    """An op at a width between two calibrated ones: at the same samples, log time runs linearly in log width
    from the narrower shape's time to the wider's (FLOPs per sample grow as the width squared)."""

    lower: OpCost = field(kw_only=True)
    upper: OpCost = field(kw_only=True)
    lower_scale: float = 1.0  # the narrower shape's FLOPs for the same samples, over this width's
    upper_scale: float = 1.0
    weight: float = 0.0  # 0 at the narrower width, 1 at the wider

    def gpu_s(self, flops: float) -> float:
        a, b = self.lower.gpu_s(flops * self.lower_scale), self.upper.gpu_s(flops * self.upper_scale)
        return math.exp((1 - self.weight) * math.log(a) + self.weight * math.log(b)) if a > 0 and b > 0 else a + b


def width_blend(profile: Profile, key: str) -> LayerCosts | None:
    """Costs of an uncalibrated width of a vector kind ("mlp@1536") blended from the calibrated widths just below and
    above it, or None (not such a key, or outside the calibrated widths: the kind's own fit applies there)."""
    kind, _, width = key.partition("@")
    if kind not in KINDS or KINDS[kind].spatial or not width.isdigit():
        return None
    h = int(width)
    widths = sorted(int(w) for k in profile.layers if k.startswith(kind + "@") and (w := k[len(kind) + 1:]).isdigit())
    below, above = [w for w in widths if w < h], [w for w in widths if w > h]
    if not below or not above:
        return None
    lo, hi = below[-1], above[0]
    weight = math.log(h / lo) / math.log(hi / lo)

    def blend(a: OpCost, b: OpCost) -> BlendedCost:
        fixed = math.exp((1 - weight) * math.log(max(a.fixed_s, 1e-30)) + weight * math.log(max(b.fixed_s, 1e-30)))
        rate = math.exp((1 - weight) * math.log(a.flops_per_s) + weight * math.log(b.flops_per_s))
        return BlendedCost(a.host_s + weight * (b.host_s - a.host_s), fixed, rate, (), (lo / h) ** 2, (hi / h) ** 2,
                           weight, lower=a, upper=b)

    low, high = profile.layers[f"{kind}@{lo}"], profile.layers[f"{kind}@{hi}"]
    return LayerCosts(*(blend(getattr(low, op), getattr(high, op)) for op in OPS))


def stand_ins(model: Model, profile: Profile) -> list[str]:
    """What of `model` the profile prices by a stand-in kind (STAND_INS), as a note: ["gpt layers as llama's"]."""
    kinds = {part.keys[-1] for layer in model.layers for part in layer.parts if _own_costs(profile, part) is None}
    return [f"{k} layers priced as {STAND_INS[k]}'s (no {k} costs measured)" for k in sorted(kinds)
            if STAND_INS.get(k, "") in profile.layers]


SHAPED_KINDS = ("llama", "gpt", "attention", "embed", "head")  # calibrate times them at the --transformer shapes


def kind_priced(model: Model, profile: Profile) -> list[str]:
    """The transformer shapes of `model` the profile did not time, priced by their kind's fit over the shapes it did
    time (a fit that extrapolates), as one note: ["priced by their kind's fit over other shapes: llama@4096x14336"]."""
    shapes = {part.keys[0]: part.keys[-1] for layer in model.layers for part in layer.parts
              if len(part.keys) > 1 and part.keys[-1] in SHAPED_KINDS}
    untimed = [shape for shape, kind in sorted(shapes.items())
               if shape not in profile.layers and kind in profile.layers]
    return [f"priced by their kind's fit over other shapes (not timed by hw calibrate --transformer): "
            f"{', '.join(untimed)}"] if untimed else []


def poor_fits(model: Model, profile: Profile) -> list[str]:
    """What of `model` the profile prices by a fit its calibration found failed and kept, or replaced by the base
    profile's (meta "fallbacks"; hw.calibrate.fallback), as notes: ["llama backward_weight: a poor fit (R^2 -0.3)"]."""
    said = {"kept": "a poor fit", "base": "carried from another calibration, this machine's fit failing"}
    leaning = {(f.get("key"), f.get("op")): f"{said[f['used']]} ({f.get('reason', '')})"
               for f in profile.meta.get("fallbacks") or [] if isinstance(f, dict) and f.get("used") in said}
    if not leaning:
        return []
    used = {next((k for k in part.keys if k in profile.layers), None) for layer in model.layers for part in layer.parts}
    return [f"{key} {op}: {what}" for (key, op), what in sorted(leaning.items()) if key in used]


def layer_works(profile: Profile, layer: Any, samples: int) -> list[Work]:
    """One layer's forward, input-grad and weight-grad for a micro-batch of `samples`: each part's GPU time at
    its work (an op with no work runs nothing) and its host's time to launch it; a tensor-parallel layer's
    collectives (parsim.workload.tensor_parallel) on the compute stream, each launched as a message is posted, and
    its DTensors' dispatch on the host."""
    gpu, host = [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
    for part in layer.parts:
        costs = part_costs(profile, part)
        for i, op in enumerate(OPS):
            work = part.work[i] * samples
            if work:
                cost = getattr(costs, op)
                gpu[i] += cost.gpu_s(work)
                host[i] += cost.host_s
    for c in getattr(layer, "collectives", ()):
        gpu[c.op] += collective_s(profile, c.kind, c.bytes_per_token * samples, layer.tp.degree)
        host[c.op] += profile.host.p2p_s
    matrices = getattr(layer, "matrices", 0)  # a split layer's DTensors (parsim.workload.tensor_parallel.Split)
    host[0] += matrices * profile.host.tp_forward_s
    host[1] += matrices * profile.host.tp_backward_s
    return [Work(g, h, 1) for g, h in zip(gpu, host)]


def core_work(profile: Profile, layer: Any, samples: int) -> Work:
    """The forward of a layer's attention core (its `core_parts`), which selective recomputation runs again in the
    backward, for a micro-batch of `samples`: priced as the layer's forward prices the part; one chunk per core."""
    gpu = host = 0.0
    cores = 0
    for part in layer.core_parts:
        work = part.work[0] * samples
        if work:
            cost = part_costs(profile, part).forward
            gpu, host, cores = gpu + cost.gpu_s(work), host + cost.host_s, cores + 1
    return Work(gpu, host, cores)


def cores_work(profile: Profile, layers: list[Any], samples: int) -> Work:
    """core_work of a stage's layers, summed; a layer repeated (a transformer's blocks are one object) priced once."""
    gpu = host = 0.0
    cores = 0
    each, last = Work(0.0, 0.0, 0), None
    for layer in layers:
        if layer is not last:
            each, last = core_work(profile, layer, samples), layer
        gpu, host, cores = gpu + each.gpu_s, host + each.host_s, cores + each.chunks
    return Work(gpu, host, cores)


def saved_tensors(layers: list[Any]) -> int | None:
    """Tensors the layers' forwards save for autograd, or None where a layer's count is unknown (a profiled
    model's file from before hw profile counted them)."""
    counts = [layer.saved_tensors for layer in layers]
    return None if None in counts else sum(counts)


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
        works = layer_works(profile, layer, tokens)
        out.append(LayerTime(sum(w.gpu_s for w in works), sum(w.host_s for w in works)))
    return out


PARTITIONS = ("equal", "time")


def partitioned(model: Model, how: str, num_stages: int, num_microbatches: int, profile: Profile | None,
                data_parallel: int = 1) -> Model:
    """The model split `how` says: "equal" layer counts, or balanced by the profile's time per layer at this
    micro-batch size (torchgpipe's balance_by_time, from the profile instead of a timed run, each stage
    paced by the slower of its GPU and its host)."""
    if how == "equal":
        return replace(model, balance=None)
    if how != "time":
        raise ModelError(f"unknown partition {how!r}; choose from {', '.join(PARTITIONS)}")
    if profile is None:
        raise ModelError("a split by time needs a profile to price the layers")
    times = layer_times(model, microbatch_tokens(model, num_microbatches, data_parallel), profile)
    # per micro-batch a stage's host also pays a forward and a backward action, each with a message posted
    # (a receive or a send; inner stages post two)
    fixed_s = 2 * (profile.host.action_s + (num_stages > 1) * profile.host.p2p_s)
    balance = partition_by_time([t.gpu_s for t in times], num_stages, [t.host_s for t in times], host_fixed_s=fixed_s)
    return replace(model, balance=balance)


def stage_costs(model: Model, num_stages: int, num_microbatches: int, profile: Profile,
                data_parallel: int = 1) -> list[StageCost]:
    """Per-stage costs of one micro-batch, for the model's split of layers (see stage_layers), and of the
    batch over data-parallel replicas and then micro-batches."""
    tokens = microbatch_tokens(model, num_microbatches, data_parallel)
    costs = []
    for layer_ids in stage_layers(model, num_stages):
        layers = [model.layers[i] for i in layer_ids]
        works = [Work(0.0, 0.0, 0)] * len(OPS)
        for layer in layers:
            works = [a + b for a, b in zip(works, layer_works(profile, layer, tokens))]
        costs.append(StageCost(
            works[0], works[1], works[2],
            send_bytes=layers[-1].out_bytes_per_token * tokens,
            stash_bytes=sum(layer.stash_bytes_per_token for layer in layers) * tokens,
            grad_bytes=sum(layer.params * layer.dtype_bytes for layer in layers),
            layers=len(layers),
            core_forward=cores_work(profile, layers, tokens),
            core_freed_bytes=sum(layer.core_freed_bytes_per_token for layer in layers) * tokens,
            loss_bytes=sum(loss_kept_bytes_per_token(layer) for layer in layers) * tokens,
            saved_tensors=saved_tensors(layers),
            core_saved_tensors=sum(layer.core_saved_tensors for layer in layers),
        ))
    return costs
