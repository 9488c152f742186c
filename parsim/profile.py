"""The profile: a versioned JSON document of measured hardware and per-layer costs.

`hw calibrate` writes it; `parsim` reads it. Loading checks every field, so a corrupt or
old profile fails with one message that says what is wrong.
"""

from __future__ import annotations

import math
import os
from bisect import bisect_left
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from parsim.errors import ProfileError
from parsim.files import Outputs, json_text, nonfinite_to_null
from parsim.inputs import flag, load_json, number, parse_json, shipped_text, text_field, whole

SCHEMA = "parsim.profile"
VERSION = 1
LINK_NAMES = ("nvlink", "network", "h2d_pinned", "h2d_pageable", "d2h_pinned", "d2h_pageable")
LAYER_OPS = ("forward", "backward_input", "backward_weight")
ACCUMULATE = "accumulate"  # profile.kernels' gradient add: `.grad += g` over a stage, 3x its gradients' bytes moved
AUTOGRAD_ACCUMULATE = "autograd_accumulate"  # autograd's: an add kernel per parameter tensor; fixed_s per layer


@dataclass(frozen=True)
class LinkSpec:
    """A link's alpha-beta cost: a message of n bytes holds it for latency_s + n / bandwidth_Bps."""

    latency_s: float
    bandwidth_Bps: float
    measured: bool = True

    def time_s(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth_Bps


@dataclass(frozen=True)
class OpCost:
    """Cost of one layer's forward, input-grad or weight-grad for a micro-batch.

    GPU time is fixed_s + flops / flops_per_s (launch and small kernels, then the matmuls), times the measured
    time over that fit where calibrate sampled the shape (`corrections`: (flops, ratio) pairs, rising; between
    them the ratio is interpolated in log flops, beyond them the nearest is held): matmul efficiency is not affine
    in the micro-batch size (tile and wave quantisation), and a shape's samples say how. host_s is the front
    end's time to issue the layer's kernels.
    """

    host_s: float
    fixed_s: float
    flops_per_s: float
    corrections: tuple[tuple[float, float], ...] = ()

    def gpu_s(self, flops: float) -> float:
        fit = self.fixed_s + flops / self.flops_per_s
        return fit * correction_at(self.corrections, flops) if self.corrections else fit


def correction_at(points: tuple[tuple[float, float], ...], work: float) -> float:
    """The measured-over-fit ratio at `work`: interpolated in log work between the points around it."""
    i = bisect_left(points, (work,))
    if i == 0:
        return points[0][1]
    if i == len(points):
        return points[-1][1]
    (w0, r0), (w1, r1) = points[i - 1], points[i]
    if work <= 0 or w0 <= 0:
        return r1
    t = math.log(work / w0) / math.log(w1 / w0)
    return r0 + t * (r1 - r0)


@dataclass(frozen=True)
class LayerCosts:
    forward: OpCost
    backward_input: OpCost
    backward_weight: OpCost

    def host_slower(self, factor: float) -> LayerCosts:
        """These costs with the host's time of each op times `factor`."""
        return LayerCosts(*(replace(op, host_s=op.host_s * factor)
                            for op in (self.forward, self.backward_input, self.backward_weight)))


@dataclass(frozen=True)
class HostCosts:
    """Front-end costs that do not belong to one layer."""

    action_s: float  # per compute action: the call, autograd set-up, bookkeeping
    p2p_s: float  # to post one send or receive
    launch_s: float | None = None  # to launch one simple op such as `y = x + 1` (scenarios)
    sync_s: float | None = None  # torch.cuda.synchronize() on an idle GPU (scenarios)
    step_s: float = 0.0  # once per step and rank, after its last action (a runtime's bookkeeping; 0 for hw's)
    # per layer, for a micro-batch whose backward is split into input-grad and weight-grad, beyond what its
    # forward and a fused backward cost the host (hw's forward hooks, a wider autograd.grad, one backward call
    # per weighted module); charged to its weight-grad action
    split_backward_s: float = 0.0
    begin_s: float = 0.0  # once per step and rank, before its first action (a runtime's: the batch into its buffers)
    # per layer, what a gradient action pays to add its weight gradients into .grad (autograd's AccumulateGrad, a
    # kernel per parameter tensor): the layers' host_s include it; a stage's first gradient action of a step finds
    # .grad None, takes its gradients as they are, and pays this much less per layer
    grad_add_s: float = 0.0
    # per forward action that comes right after a backward in its rank's program (1F1B's steady state): the
    # dispatching thread, back from waiting on autograd's worker, runs its first Python slower (docs/model.md)
    after_backward_s: float = 0.0
    batch_s: float = 0.0  # per batch of messages posted together, beyond p2p_s per message (torch's batch_isend_irecv)
    # a rank's host loop, sd over mean from step to step: the step waits for the slowest of its ranks' loops, so
    # with n ranks every host runs at 1 + E[max of n standard normals] x rank_spread of its own pace (sim.ranks)
    rank_spread: float = 0.0
    # what checkpointing a micro-batch (parsim.workload.recompute) costs the host, its forward's hooks and the forward
    # run again in the backward: recompute_call_s per micro-batch plus recompute_s per layer of it; both 0: the
    # forward's launches alone (uncalibrated)
    recompute_s: float = 0.0
    recompute_call_s: float = 0.0
    # per weight matrix split by tensor parallelism, what torch's DTensor costs the host beyond the unsplit layer's
    # launches (its dispatch, sharding propagation and redistribution) in the forward and in the backward; both 0:
    # uncalibrated (`hw calibrate --tp-collectives` times them: hw.calibrate.tp_host)
    tp_forward_s: float = 0.0
    tp_backward_s: float = 0.0


@dataclass(frozen=True)
class RuntimeCosts:
    """A pipeline runtime's own host costs, where they differ from hw's runner's (`host` and the layers' host_s).

    Per compute action and per message posted; layer_host is the share of the layers' per-layer host
    cost it pays (1: it launches their kernels one by one, as eager PyTorch does; 0: it replays a
    stage's kernels in one graph launch); gpu_scale, its layers' GPU time against eager PyTorch's, and
    gpu_fixed_scale, their fixed part's besides (CUDA graphs shorten the gaps, not the matmuls).
    `unmeasured` names the fields carried from elsewhere, not measured for this runtime.
    """

    action_s: float
    p2p_s: float
    layer_host: float = 1.0
    gpu_scale: float = 1.0
    step_s: float = 0.0  # once per step and rank: splitting the batch, resetting state, scaling gradients
    unmeasured: tuple[str, ...] = ()
    gpu_fixed_scale: float = 1.0
    accumulate_s: float = 0.0  # GPU time of one gradient add over a stage: accumulate_s + 3 x its gradient
    accumulate_Bps: float = 0.0  # bytes / accumulate_Bps, after the stage's first gradient action (0: not modelled)
    # per layer shape it was measured at ("mlp@512"), per op ("forward", "backward"): its GPU time over eager
    # PyTorch's at each measured FLOPs, (flops, ratio) rising; those shapes take these instead of the two scales
    gpu_ratios: dict[str, dict[str, tuple[tuple[float, float], ...]]] = field(default_factory=dict)
    begin_s: float = 0.0  # once per step and rank, before its first action: copying the batch in (the GPU waits)
    after_backward_s: float = 0.0  # as HostCosts.after_backward_s, for this runtime's loop
    batch_s: float = 0.0  # as HostCosts.batch_s


@dataclass(frozen=True)
class CollectiveSpec:
    """A ring all-reduce of n bytes over d GPUs: latency_s + 2(d-1)/d * n / busbw_Bps (NCCL's bus bandwidth).

    compute_share: the share of an all-reduce's time that its GPUs' compute loses to it even when the two could
    overlap (NCCL's kernels take SMs and memory bandwidth from the matmuls; `hw calibrate` on several GPUs times
    matmuls alone, all-reduces alone and both, the all-reduces issued first on a stream of their own). 0 where
    unmeasured: full overlap.
    """

    latency_s: float
    busbw_Bps: float
    measured: bool = True
    compute_share: float = 0.0

    def allreduce_s(self, nbytes: float, ranks: int) -> float:
        if ranks < 2:
            return 0.0
        return self.latency_s + 2 * (ranks - 1) / ranks * nbytes / self.busbw_Bps


@dataclass(frozen=True)
class KernelCost:
    """A standalone kernel: fixed_s + work / rate, work in FLOPs (matmul) or bytes moved (elementwise)."""

    fixed_s: float
    rate: float

    def time_s(self, work: float) -> float:
        return self.fixed_s + work / self.rate


@dataclass(frozen=True)
class GilCosts:
    """How Python threads of one process share its interpreter lock while they launch (`hw calibrate --interfaces`).

    launch_s: one thread's time per launch alone; released_s: the part of it run without the GIL (the same op
    issued from C++, by TorchScript; None: not measured, all of it held). wake: (slept_s, cost_s) pairs: what
    waking a thread whose CPU core has been idle slept_s costs the thread that wakes it, from two threads
    launching with the GIL held longer per launch (`parsim.sim.gil.wake_points`). cores: the CPU cores the
    process may use. DataParallel's Python costs beside them: a thread started and joined, one module replicated,
    and (measured on 2+ GPUs) its own calls' host time by GPU count, `calls`: name -> ((gpus, seconds), ...) rising,
    for scatter, parallel_apply (its threads alone), gather, broadcast and reduce_add (one chunk each), the last two's
    cost per further chunk (broadcast_chunk, reduce_add_chunk) and a probe model's backward over 1..N GPUs
    (backward: autograd's device threads together; hw.interfaces.data_parallel.call_probes).
    A plain step's host costs beyond an elementwise launch's (hw.interfaces.step_costs; None where not measured, before
    2026-11-27): calling a module (module_call_s), loss.backward() (backward_call_s) and a small matrix product's
    launch (matmul_launch_s); since 2026-11-27 afternoon also zero_grad(set_to_none=True) of a module with one
    parameter tensor (zero_grad_s), each further module and parameter tensor (zero_grad_module_s,
    zero_grad_param_s), the loss `.float().sum()` (loss_s), a small nn.Linear's forward call (linear_forward_s),
    its autograd nodes' share of loss.backward() beyond backward_call_s and the seed's launch (linear_backward_s),
    and a small step's final sync (step_sync_s: its last kernels' tail and the wake-up; host.sync_s is an idle
    GPU's).
    DistributedDataParallel's own host costs beyond the module's (hw.interfaces.data_parallel, a process group of one
    rank; 2+ GPU calibrations only): its forward's wrapper (ddp_forward_s), its backward's hooks, bucket copies and
    all-reduce call for one parameter tensor (ddp_backward_s) and each further one (ddp_param_s).
    handoff_share: of the launches of two threads launching together, the share that followed the other thread's
    (the GIL went to the thread its release woke, not back to the releaser); None before 2026-11-27: 0.
    launch_curve: ((threads, seconds), ...) rising: 1-8 threads launching small kernels together, the time per launch
    of all of them (`hw calibrate --interfaces` since 2026-11-28); where present, the GIL model's contended launches
    follow it (parsim.sim.gil.Gil.stretched), and the GIL experiment only checks it.
    """

    launch_s: float
    thread_s: float
    released_s: float | None = None
    wake: tuple[tuple[float, float], ...] = ()
    cores: int | None = None
    replicate_module_s: float | None = None
    source: str = ""
    calls: dict[str, tuple[tuple[int, float], ...]] = field(default_factory=dict)
    module_call_s: float | None = None
    backward_call_s: float | None = None
    matmul_launch_s: float | None = None
    zero_grad_s: float | None = None
    zero_grad_module_s: float | None = None
    zero_grad_param_s: float | None = None
    loss_s: float | None = None
    linear_forward_s: float | None = None
    linear_backward_s: float | None = None
    ddp_forward_s: float | None = None
    ddp_backward_s: float | None = None
    ddp_param_s: float | None = None
    step_sync_s: float | None = None
    handoff_share: float | None = None
    launch_curve: tuple[tuple[int, float], ...] = ()

    @property
    def held_s(self) -> float:
        """The part of a launch that holds the GIL (argument parsing, wrapping the result)."""
        return self.launch_s - (self.released_s or 0.0)

    @property
    def held_share(self) -> float:
        return self.held_s / self.launch_s


# GilCosts' plain-step and DDP costs: optional, absent from a profile's file where None
GIL_STEP_KEYS = ("module_call_s", "backward_call_s", "matmul_launch_s", "zero_grad_s", "zero_grad_module_s",
                 "zero_grad_param_s", "loss_s", "linear_forward_s", "linear_backward_s", "step_sync_s",
                 "ddp_forward_s", "ddp_backward_s", "ddp_param_s")


@dataclass(frozen=True)
class CpuCosts:
    """The CPU's cores and memory, and one Hogwild training step on them (`hw calibrate --interfaces`).

    core_speed: processes -> a core's speed against one process alone, measured with `core_speed_probe` ("step": the
    Hogwild model's own step; "matmul": a private matrix product, in older profiles); step_s: one process's step of
    `step_model` alone, one intra-op thread."""

    cores: int
    core_speed: dict[int, float]
    core_bandwidth_Bps: float  # one core streaming alone
    bandwidth_Bps: float  # every core streaming at once
    step_s: float
    step_model: str
    source: str = ""
    core_speed_probe: str = "matmul"


@dataclass(frozen=True)
class ResidentComm:
    """Compute's speed while a communication kernel sits on its GPU waiting for its peer (`hw calibrate`).

    NCCL runs a send-receive as tens of CTAs that hold their SMs until the data has moved; the matmuls beside them
    cannot use those SMs, so compute runs at `rate` of its speed alone (0 < rate <= 1) for as long as one waits
    (parsim.sim.sharing). source: what measured it, beside what.
    """

    rate: float
    source: str = ""


@dataclass(frozen=True)
class Profile:
    """Everything the simulator needs to know about one node type and the model's layers."""

    gpus_per_node: int
    links: dict[str, LinkSpec]
    host: HostCosts
    layers: dict[str, LayerCosts]
    provisional: bool = False
    meta: dict[str, Any] = field(default_factory=dict)
    kernels: dict[str, KernelCost] = field(default_factory=dict)  # optional: for the scenarios
    collectives: dict[str, CollectiveSpec] = field(default_factory=dict)  # optional: for data parallelism
    runtimes: dict[str, RuntimeCosts] = field(default_factory=dict)  # optional: runtimes other than hw's runner
    gpu_memory_bytes: int | None = None  # optional: one GPU's memory (torch's total_memory), plan's default limit
    gil: GilCosts | None = None  # optional: for the data-parallel scenario
    cpu: CpuCosts | None = None  # optional: for the hogwild scenario
    resident_comm: ResidentComm | None = None  # optional: compute beside a waiting message kernel (1.0 without)
    # how much slower than calibrated its host costs are (with_host_slower's factors, never saved): a profiled model's
    # own layer costs, which join the profile later (parsim.workload.timed.priced), are scaled alike
    host_scale: float = 1.0

    def describe(self) -> str:
        """One line naming the profile's origin, shown with every prediction."""
        m = self.meta
        seen = f", calibrated on {m['gpu_count']}" if m.get("gpu_count") else ""
        origin = (f"{m.get('gpu', '?')}, {self.gpus_per_node}-GPU node{seen}, {str(m.get('date', 'undated'))[:10]}, "
                  f"{m.get('source', '?')}")
        carried = m.get("carried_from_base") or [n for n, link in self.links.items() if not link.measured]
        notes = (["PROVISIONAL"] if self.provisional else []) + ([f"carried or unmeasured: {', '.join(carried)}"]
                                                                   if carried else [])
        return origin + (f" [{'; '.join(notes)}]" if notes else "")

    def with_host_slower(self, factor: float) -> Profile:
        """This profile with every host cost (per action, per message, per layer, per step) times `factor`."""
        host = replace(self.host, action_s=self.host.action_s * factor, p2p_s=self.host.p2p_s * factor,
                       step_s=self.host.step_s * factor, split_backward_s=self.host.split_backward_s * factor,
                       begin_s=self.host.begin_s * factor, grad_add_s=self.host.grad_add_s * factor,
                       after_backward_s=self.host.after_backward_s * factor, batch_s=self.host.batch_s * factor,
                       recompute_s=self.host.recompute_s * factor,
                       recompute_call_s=self.host.recompute_call_s * factor,
                       tp_forward_s=self.host.tp_forward_s * factor, tp_backward_s=self.host.tp_backward_s * factor)
        layers = {k: c.host_slower(factor) for k, c in self.layers.items()}
        runtimes = {k: replace(r, action_s=r.action_s * factor, p2p_s=r.p2p_s * factor, step_s=r.step_s * factor,
                               begin_s=r.begin_s * factor, after_backward_s=r.after_backward_s * factor,
                               batch_s=r.batch_s * factor)
                    for k, r in self.runtimes.items()}
        return replace(self, host=host, layers=layers, runtimes=runtimes, host_scale=self.host_scale * factor)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"schema": SCHEMA, "version": VERSION}
        doc.update(asdict(self))
        del doc["host_scale"]
        for key in ("gil", "cpu", "gpu_memory_bytes", "resident_comm"):  # optional: absent, not null, where unmeasured
            if doc[key] is None:
                del doc[key]
        if "gil" in doc:  # measured since 2026-11-27 (calls on 2+ GPUs only): absent where not
            for key in ("calls", "handoff_share", "launch_curve", *GIL_STEP_KEYS):
                if doc["gil"][key] in ({}, None, ()):
                    del doc["gil"][key]
        for costs in (doc["host"], *doc["runtimes"].values()):  # measured for some runtimes only: absent where 0
            for key in ("begin_s", "after_backward_s", "batch_s"):  # the last two measured since 2026-11-28
                if not costs[key]:
                    del costs[key]
        for key in ("grad_add_s", "rank_spread", "recompute_s", "recompute_call_s", "tp_forward_s", "tp_backward_s"):
            # absent in older profiles
            if not doc["host"][key]:
                del doc["host"][key]
        for spec in doc["collectives"].values():  # measured since 2026-11-27: absent where it was not
            if not spec["compute_share"]:
                del spec["compute_share"]
        return doc


# Every number's sane range, by what it measures: within them no prediction overflows to inf or NaN (a rate of
# 5e-324 FLOP/s or a latency of 1e308 s would). A fit's rate reaches 1e30 where a cost does not grow with the work.
SECONDS = (0.0, 86_400.0)  # any one cost: up to a day
RATES = (1e-3, 1e40)  # FLOPs, bytes or elements per second (0 where the profile allows "not modelled")
HOST_OPTIONAL_ZERO = ("step_s", "split_backward_s", "begin_s", "grad_add_s", "after_backward_s", "batch_s",
                      "rank_spread", "recompute_s", "recompute_call_s", "tp_forward_s",
                      "tp_backward_s")  # host costs a profile may give as 0
SCALES = (0.0, 1e6)  # factors against hw's runner's costs (0 where allowed)
CORE_SPEEDS = (1e-6, 1e6)  # a core's speed with n busy against one alone: a rate, so bounded below
MAX_COUNT = 10**6  # GPUs per node, threads, cores
WORK = (0.0, 1e30)  # FLOPs of one op at a measured size (a correction's abscissa)
SPREAD = (0.0, 10.0)  # a loop's spread over its mean: a loaded CPU's delays are heavy-tailed, so it may pass 1


def _bounds(key: str) -> tuple[float, float]:
    if key in ("flops_per_s", "rate") or key.endswith("_Bps"):
        return RATES
    if key == "flops":
        return WORK
    if key == "rank_spread":
        return SPREAD
    return SECONDS if key.endswith("_s") else SCALES


def _number(doc: dict[str, Any], key: str, where: str, positive: bool = True) -> float:
    """doc[key]: a finite number in its sane range (_bounds); 0 too unless `positive`."""
    value = doc.get(key) if isinstance(doc, dict) else None
    lo, hi = _bounds(key)
    return number(value, f"{where}.{key}", lo, hi, ProfileError, above=lo == 0, zero=not positive)


def _core_speed(speeds: dict[str, Any], n: str, where: str) -> tuple[int, float]:
    count = whole(int(n), f"{where}'s busy-core count", 1, MAX_COUNT, ProfileError)
    return count, number(speeds[n], f"{where}.{n}", *CORE_SPEEDS, ProfileError)


def _section(doc: Any, key: str, where: str) -> dict[str, Any]:
    value = doc.get(key) if isinstance(doc, dict) else None
    if not isinstance(value, dict):
        raise ProfileError(f"{where}.{key} is missing or not an object")
    return value


def _measured(doc: dict[str, Any], where: str) -> bool:
    return flag(doc.get("measured", True), f"{where}.measured", ProfileError)


def _link(doc: dict[str, Any], where: str) -> LinkSpec:
    return LinkSpec(_number(doc, "latency_s", where, positive=False),
                    _number(doc, "bandwidth_Bps", where), _measured(doc, where))


def layer_costs_from_json(doc: Any, where: str) -> LayerCosts:
    """One layer kind's costs from their JSON (a profile's "layers" entry, or a profiled model's layer's), checked."""
    return LayerCosts(*(_op_cost(_section(doc, op, where), f"{where}.{op}") for op in LAYER_OPS))


def _op_cost(doc: dict[str, Any], where: str) -> OpCost:
    return OpCost(_number(doc, "host_s", where, positive=False),
                  _number(doc, "fixed_s", where, positive=False), _number(doc, "flops_per_s", where),
                  _corrections(doc.get("corrections", []), f"{where}.corrections"))


def _corrections(doc: Any, where: str) -> tuple[tuple[float, float], ...]:
    """(flops, ratio) pairs of positive numbers, flops rising."""
    pairs = doc if isinstance(doc, (list, tuple)) else None
    if pairs is None or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs):
        raise ProfileError(f"{where} must be a list of [flops, ratio] pairs, got {doc!r}")
    out = tuple((_number({"flops": w}, "flops", where), _number({"ratio": r}, "ratio", where)) for w, r in pairs)
    if any(a[0] >= b[0] for a, b in zip(out, out[1:])):
        raise ProfileError(f"{where} must list its flops rising, got {[w for w, _ in out]}")
    return out


def from_json(doc: Any, origin: str = "profile") -> Profile:
    """Check a parsed document against the schema and build the Profile."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ProfileError(f"{origin} is not a parsim profile (no \"schema\": \"{SCHEMA}\")")
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version != VERSION:
        raise ProfileError(f"{origin} has schema version {version!r}; this parsim reads "
                           f"version {VERSION} (a whole number): re-run `python -m hw calibrate` to make a new one")
    gpus = whole(doc.get("gpus_per_node"), f"{origin}: gpus_per_node", 1, MAX_COUNT, ProfileError)
    links_doc = _section(doc, "links", origin)
    links = {n: _link(_section(links_doc, n, f"{origin}.links"), f"{origin}.links.{n}") for n in LINK_NAMES}
    host_doc = _section(doc, "host", origin)
    optional = {k: _number(host_doc, k, f"{origin}.host", positive=k not in HOST_OPTIONAL_ZERO)
                for k in ("launch_s", "sync_s", *HOST_OPTIONAL_ZERO) if host_doc.get(k) is not None}
    host = HostCosts(_number(host_doc, "action_s", f"{origin}.host", positive=False),
                     _number(host_doc, "p2p_s", f"{origin}.host", positive=False), **optional)
    kernels = {}
    if "kernels" in doc:
        for kind, cost in _section(doc, "kernels", origin).items():
            where = f"{origin}.kernels.{kind}"
            kernels[kind] = KernelCost(_number(cost, "fixed_s", where, positive=False), _number(cost, "rate", where))
    layers = {}
    for kind, costs in _section(doc, "layers", origin).items():
        where = f"{origin}.layers.{kind}"
        layers[kind] = layer_costs_from_json(costs, where)
    if not layers:
        raise ProfileError(f"{origin}.layers is empty: the profile costs no layer kind")
    meta = _meta(doc.get("meta", {}), f"{origin}.meta")
    collectives = {}
    if "collectives" in doc:
        for kind, spec in _section(doc, "collectives", origin).items():
            where = f"{origin}.collectives.{kind}"
            collectives[kind] = CollectiveSpec(_number(spec, "latency_s", where, positive=False),
                                               _number(spec, "busbw_Bps", where), _measured(spec, where),
                                               number(spec.get("compute_share", 0.0), f"{where}.compute_share",
                                                      0.0, 1.0, ProfileError))
    runtimes = {}
    if "runtimes" in doc:
        for name, spec in _section(doc, "runtimes", origin).items():
            runtimes[name] = _runtime_costs(spec, f"{origin}.runtimes.{name}")
    memory = doc.get("gpu_memory_bytes")
    memory = None if memory is None else int(number(memory, f"{origin}.gpu_memory_bytes", 1, 1e18, ProfileError))
    gil = _gil(_section(doc, "gil", origin), f"{origin}.gil") if "gil" in doc else None
    cpu = _cpu(_section(doc, "cpu", origin), f"{origin}.cpu") if "cpu" in doc else None
    resident = _resident_comm(_section(doc, "resident_comm", origin), f"{origin}.resident_comm") \
        if "resident_comm" in doc else None
    provisional = flag(doc.get("provisional", False), f"{origin}.provisional", ProfileError)
    return Profile(gpus, links, host, layers, provisional, meta, kernels, collectives, runtimes=runtimes,
                   gpu_memory_bytes=memory, gil=gil, cpu=cpu, resident_comm=resident)


def _meta(doc: Any, where: str) -> dict[str, Any]:
    """The provenance: free-form, but what describe() shows is checked (a name, a date, the GPUs, what was carried)."""
    if not isinstance(doc, dict):
        raise ProfileError(f"{where} must be an object, got {type(doc).__name__}")
    for key in ("gpu", "date", "source"):
        if doc.get(key) is not None:
            text_field(doc[key], f"{where}.{key}", ProfileError)
    if doc.get("gpu_count") is not None:
        whole(doc["gpu_count"], f"{where}.gpu_count", 0, MAX_COUNT, ProfileError)
    carried = doc.get("carried_from_base")
    if carried is not None and not (isinstance(carried, list) and all(isinstance(c, str) for c in carried)):
        raise ProfileError(f"{where}.carried_from_base must be a list of names, got {type(carried).__name__}")
    return doc


def _runtime_costs(doc: Any, where: str) -> RuntimeCosts:
    unmeasured = doc.get("unmeasured", []) if isinstance(doc, dict) else None
    if not isinstance(unmeasured, (list, tuple)) or not all(isinstance(u, str) for u in unmeasured):
        raise ProfileError(f"{where}.unmeasured must be a list of field names, got {unmeasured!r}")
    optional = {k: _number(doc, k, where, positive=False) for k in ("gpu_fixed_scale", "accumulate_s", "accumulate_Bps",
                                                                    "begin_s", "after_backward_s", "batch_s")
                if k in doc}
    ratios = doc.get("gpu_ratios", {})
    if not isinstance(ratios, dict) or not all(isinstance(v, dict) for v in ratios.values()):
        raise ProfileError(f"{where}.gpu_ratios must map layer shapes to {{op: [[flops, ratio], ...]}}, got {ratios!r}")
    ratios = {key: {op: _corrections(points, f"{where}.gpu_ratios.{key}.{op}") for op, points in ops.items()}
              for key, ops in ratios.items()}
    return RuntimeCosts(_number(doc, "action_s", where, positive=False), _number(doc, "p2p_s", where, positive=False),
                        _number(doc, "layer_host", where, positive=False), _number(doc, "gpu_scale", where),
                        _number(doc, "step_s", where, positive=False), tuple(unmeasured), gpu_ratios=ratios, **optional)


def _whole(doc: dict[str, Any], key: str, where: str) -> int:
    return whole(doc.get(key), f"{where}.{key}", 1, MAX_COUNT, ProfileError)


def _gil(doc: dict[str, Any], where: str) -> GilCosts:
    """The gil section; one calibrated before the wake-up probes (contended_launch_s, no wake) loads without them."""
    replicate, released = doc.get("replicate_module_s"), doc.get("released_s")
    launch = _number(doc, "launch_s", where)
    released = None if released is None else _number(doc, "released_s", where, positive=False)
    if released is not None and released > launch:
        raise ProfileError(f"{where}.released_s must be at most launch_s ({launch!r}), got {released!r}")
    wake = doc.get("wake", [])
    if not isinstance(wake, list) or not all(isinstance(w, list) and len(w) == 2 for w in wake):
        raise ProfileError(f"{where}.wake must be a list of [slept_s, cost_s] pairs, got {wake!r}")
    points = tuple(sorted((_number({"slept_s": a}, "slept_s", f"{where}.wake", positive=False),
                           _number({"cost_s": b}, "cost_s", f"{where}.wake", positive=False)) for a, b in wake))
    return GilCosts(launch, _number(doc, "thread_s", where, positive=False), released, points,
                    None if doc.get("cores") is None else _whole(doc, "cores", where),
                    None if replicate is None else _number(doc, "replicate_module_s", where, positive=False),
                    str(doc.get("source", "")), _calls(doc.get("calls", {}), f"{where}.calls"),
                    **{k: None if doc.get(k) is None else _number(doc, k, where, positive=False)
                       for k in GIL_STEP_KEYS},
                    handoff_share=None if doc.get("handoff_share") is None else
                    number(doc["handoff_share"], f"{where}.handoff_share", 0.0, 1.0, ProfileError),
                    launch_curve=() if doc.get("launch_curve") is None else
                    _count_times(doc["launch_curve"], f"{where}.launch_curve", "threads"))


def _calls(doc: Any, where: str) -> dict[str, tuple[tuple[int, float], ...]]:
    """DataParallel's calls' host times: name -> [[gpus, seconds], ...], at most one time per GPU count."""
    if not isinstance(doc, dict):
        raise ProfileError(f"{where} must map call names to [gpus, seconds] pairs, got {doc!r}")
    return {str(name): _count_times(points, f"{where}.{name}", "gpus") for name, points in doc.items()}


COUNT_NAMES = {"gpus": "GPU", "threads": "thread"}


def _count_times(points: Any, where: str, count: str) -> tuple[tuple[int, float], ...]:
    """[[count, seconds], ...] as sorted pairs, at most one time per count."""
    if not isinstance(points, list) or not points or not all(isinstance(q, list) and len(q) == 2 for q in points):
        raise ProfileError(f"{where} must be a list of [{count}, seconds] pairs, got {points!r}")
    pairs = sorted((_whole({count: n}, count, where), _number({"host_s": t}, "host_s", where)) for n, t in points)
    if len({n for n, _ in pairs}) < len(pairs):
        raise ProfileError(f"{where} gives one {COUNT_NAMES[count]} count twice: {points!r}")
    return tuple(pairs)


def _resident_comm(doc: dict[str, Any], where: str) -> ResidentComm:
    return ResidentComm(number(doc.get("rate"), f"{where}.rate", 0.0, 1.0, ProfileError, above=True),
                        str(doc.get("source", "")))


def _cpu(doc: dict[str, Any], where: str) -> CpuCosts:
    speeds = _section(doc, "core_speed", where)
    try:
        core_speed = dict(_core_speed(speeds, n, f"{where}.core_speed") for n in speeds)
    except ValueError:
        raise ProfileError(f"{where}.core_speed must map busy-core counts to speeds, got {speeds!r}") from None
    if 1 not in core_speed:
        raise ProfileError(f"{where}.core_speed has no speed for 1 busy core")
    return CpuCosts(_whole(doc, "cores", where), core_speed, _number(doc, "core_bandwidth_Bps", where),
                    _number(doc, "bandwidth_Bps", where), _number(doc, "step_s", where),
                    str(doc.get("step_model", "")), str(doc.get("source", "")),
                    str(doc.get("core_speed_probe", "matmul")))


def load_profile(path: str | os.PathLike[str] | None = None) -> Profile:
    """Read and check a profile file; None reads the package's shipped default."""
    if path is None:
        text = shipped_text("parsim.profiles", "default.json")
        return from_json(parse_json(text, "default profile", ProfileError), "default profile")
    doc = load_json(path, "profile", ProfileError, hint="; it may be truncated")
    return from_json(doc, f"profile {Path(path)}")


def profile_json(profile: Profile) -> str:
    """The profile as strict JSON text, checked as load_profile checks it, so that nothing parsim would refuse is
    written (a NaN or infinity in the free-form meta is written as null)."""
    doc = profile.to_json()
    doc["meta"] = nonfinite_to_null(doc["meta"])
    text = json_text(doc, indent=2, what="the profile") + "\n"
    from_json(parse_json(text, "the profile to write", ProfileError), "the profile to write")
    return text


def samples_path(path: str | os.PathLike[str]) -> Path:
    """Where a calibration's raw samples go, beside its profile: profile.json -> profile.samples.json."""
    p = Path(path)
    return p.with_name(p.stem + ".samples.json")


def save_profile(profile: Profile, path: str | os.PathLike[str], samples: dict[str, Any] | None = None) -> None:
    """Write the profile, and with `samples` the raw samples beside it (samples_path): atomically, both or neither."""
    with Outputs() as outputs:
        target = outputs.add(path, "profile")
        raw = outputs.add(samples_path(path), "samples") if samples is not None else None
        outputs.write(target, profile_json(profile))
        if raw:
            outputs.write(raw, json_text(nonfinite_to_null(samples), indent=2, what="the samples") + "\n")
