"""nn.DataParallel against DistributedDataParallel over 1-G GPUs, measured: the seed's claim that DDP wins because
DataParallel's threads share one GIL (parsim's `data-parallel` scenario predicts the same figures).

One process group of G ranks (a GPU each) does both, in turns: in every round each GPU count takes its turn, in
an order shuffled by the round, DDP first or DataParallel first likewise. DDP runs on a subgroup of the first n
ranks (the others wait); DataParallel runs in rank 0 alone over GPUs 0..n-1 while the others wait on a gloo barrier,
so no NCCL kernel is spinning on a GPU it uses. A step is forward, a sum as the loss, and backward (no optimizer
step, no data loading: as the model has it), timed between syncs of every GPU it uses; a point is the median of its
steps over the rounds.
"""

from __future__ import annotations

import contextlib
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hw.interfaces.step_costs import step_host_costs
from hw.nets.blocks import MlpBlock
from hw.timing import sync_all
from parsim.scenarios.interfaces import MLP_BLOCKS, MLP_HIDDEN, MLP_TOKENS, TEXT_BATCH

MLP = (MLP_BLOCKS, MLP_HIDDEN, MLP_TOKENS)  # blocks, hidden, tokens: the MLP stack of parsim's scenario
MODELS = ("text", "mlp")
WARMUP = 3  # untimed steps before a turn's timed ones
STEPS = 10  # timed steps a turn
ROUNDS = 5  # turns of every point
# DataParallel's calls as parsim.profile.GilCosts.calls holds them: each timed on one probe tensor (one chunk), and
# the coalesced two's cost per further chunk, from the same call on CHUNKS tensors of CHUNK_BYTES (a chunk each);
# and a probe model's backward over 1..N GPUs (autograd's device threads together: BackwardProbe)
CALLS = ("scatter", "parallel_apply", "gather", "broadcast", "reduce_add", "broadcast_chunk", "reduce_add_chunk",
         "backward")
CHUNKS, CHUNK_BYTES = 8, 6 << 20  # over half torch's 10 MiB coalescing buffer: no two tensors share a chunk
PROBE_ROWS, PROBE_WIDTH = 64, 64  # call_probes' tensor: neither scenario model's
PROBE_BLOCKS = 16  # BackwardProbe's MLP blocks a GPU (of PROBE_WIDTH, on PROBE_ROWS rows): ~160 small kernels each
DDP_LAYERS = 8  # DDP's cost per parameter tensor: a stack of this many Linears against one (2 tensors each)


def build(name: str, device: torch.device, tiny: bool = False) -> tuple[nn.Module, int, Callable[[int], torch.Tensor]]:
    """The model on `device` (seeded: every rank builds the same), its global batch, and an input of n rows."""
    torch.manual_seed(0)
    if name == "text":
        with device:
            return nn.Linear(5, 2), TEXT_BATCH, lambda n: torch.randn(n, 5, device=device)
    blocks, hidden, tokens = (2, 16, 64) if tiny else MLP
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with device:  # initialised where it runs: a CPU init of the full stack takes seconds
        model = nn.Sequential(*(MlpBlock(hidden) for _ in range(blocks))).to(dtype)
    return model, tokens, lambda n: torch.randn(n, hidden, device=device, dtype=dtype)


def timed_steps(step: Callable[[], None], devices: list[torch.device], steps: int) -> list[float]:
    """Seconds of each of `steps` steps, after WARMUP untimed ones, every GPU in `devices` synced around each."""
    out = []
    for k in range(WARMUP + steps):
        sync_all(devices)
        t0 = time.perf_counter()
        step()
        sync_all(devices)
        if k >= WARMUP:
            out.append(time.perf_counter() - t0)
    return out


def beside(collective: Callable[[], None], compute: Callable[[], None], side: torch.cuda.Stream | None) -> None:
    """`collective` issued first on the stream `side`, then `compute` on the current one: as much overlap as the GPU
    allows (without a side stream, on the CPU: one after the other)."""
    if side is not None:
        side.wait_stream(torch.cuda.current_stream(side.device))
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        collective()
    compute()


def forward_backward(model: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    """A plain step of `model` on x: zero_grad, forward, a sum as the loss, backward."""
    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(x).float().sum().backward()
    return step


Step = tuple[Callable[[], None], list[torch.device]]  # one training step, and the devices it uses (synced around it)


def dp_step(name: str, n: int, rank_device: torch.device, tiny: bool) -> Step:
    """nn.DataParallel over GPUs 0..n-1 (on the CPU: the module itself, as DataParallel does without GPUs), and
    the devices a step uses."""
    model, batch, data = build(name, rank_device, tiny)
    if rank_device.type != "cuda":
        return forward_backward(model, data(batch)), [rank_device]
    wrapped = nn.DataParallel(model, device_ids=list(range(n)))
    return forward_backward(wrapped, data(batch)), [torch.device("cuda", d) for d in range(n)]


def ddp_step(name: str, n: int, group: dist.ProcessGroup | None, rank_device: torch.device, tiny: bool) -> Step:
    """DDP over the first n ranks (25 MiB buckets, its default), each with ceil(batch / n) rows; one rank: the
    module alone."""
    model, batch, data = build(name, rank_device, tiny)
    if n > 1:
        ids = [rank_device.index] if rank_device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=ids, process_group=group)
    return forward_backward(model, data(math.ceil(batch / n))), [rank_device]


def prepared(loss: torch.Tensor | None) -> torch.Tensor:
    """The loss a probe's prepare() made: one clear error where the probe is called without it."""
    if loss is None:
        raise RuntimeError("a backward probe was called before its prepare()")
    return loss


class BackwardProbe:
    """One backward over GPUs 0..n-1 of a probe model (PROBE_BLOCKS small MLP blocks on each GPU, their losses summed
    on GPU 0), which autograd runs in a device thread per GPU at once, as it runs DataParallel's replicas' backward;
    prepare() runs the forward (not timed)."""

    def __init__(self, n: int):
        self.models = [nn.Sequential(*(MlpBlock(PROBE_WIDTH) for _ in range(PROBE_BLOCKS))).to(f"cuda:{d}")
                       for d in range(n)]
        self.inputs = [torch.randn(PROBE_ROWS, PROBE_WIDTH, device=f"cuda:{d}") for d in range(n)]
        self.loss: torch.Tensor | None = None

    def prepare(self) -> None:
        self.loss = sum(m(x).sum().to("cuda:0") for m, x in zip(self.models, self.inputs, strict=True))

    def __call__(self) -> None:
        prepared(self.loss).backward()
        self.loss = None


class StepProbe:
    """A probe model's forward or its backward alone (`part`), as a plain step runs them; prepare() sets the step
    up untimed: zero_grad, and for the backward the forward and the loss."""

    def __init__(self, model: nn.Module, x: torch.Tensor, part: str):
        self.model, self.x, self.part = model, x, part
        self.loss: torch.Tensor | None = None

    def prepare(self) -> None:
        self.model.zero_grad(set_to_none=True)
        if self.part == "backward":
            self.loss = self.model(self.x).float().sum()

    def __call__(self) -> None:
        if self.part == "forward":
            self.model(self.x)
        else:
            prepared(self.loss).backward()
            self.loss = None


def ddp_probes(device: torch.device, group: dist.ProcessGroup | None) -> dict[str, StepProbe]:
    """DDP's own host costs on one device in a process group of one rank (its hooks, bucket copies and all-reduce
    call run as at any size): a Linear's forward and backward plain and under DDP, and the backward of DDP_LAYERS
    Linears both ways (`_x<DDP_LAYERS>`)."""
    probes = {}
    for layers in (1, DDP_LAYERS):
        tag = f"_x{layers}" if layers > 1 else ""
        for wrap in ("module", "ddp"):
            torch.manual_seed(0)
            model: nn.Module = nn.Sequential(*(nn.Linear(PROBE_WIDTH, PROBE_WIDTH) for _ in range(layers))).to(device)
            if wrap == "ddp":
                ids = [device.index] if device.type == "cuda" else None
                model = DistributedDataParallel(model, device_ids=ids, process_group=group)
            x = torch.randn(PROBE_ROWS, PROBE_WIDTH, device=device)
            for part in ("forward", "backward") if layers == 1 else ("backward",):
                probes[f"{wrap}_{part}{tag}"] = StepProbe(model, x, part)
    return probes


def ddp_costs(medians: dict[str, float]) -> dict[str, float]:
    """GilCosts' DDP fields from ddp_probes' median host times at one GPU ("call_<probe>_1gpus"), each DDP's time
    less the plain module's (at least 0); {} where they were not timed."""
    names = ("module_forward", "ddp_forward", "module_backward", "ddp_backward", f"module_backward_x{DDP_LAYERS}",
             f"ddp_backward_x{DDP_LAYERS}")
    at: dict[str, float] = {}
    for name in names:
        median = medians.get(f"call_{name}_1gpus")
        if median is None:
            return {}
        at[name] = median
    one = at["ddp_backward"] - at["module_backward"]
    many = at[f"ddp_backward_x{DDP_LAYERS}"] - at[f"module_backward_x{DDP_LAYERS}"]
    return {"ddp_forward_s": max(at["ddp_forward"] - at["module_forward"], 0.0), "ddp_backward_s": max(one, 0.0),
            "ddp_param_s": max(many - one, 0.0) / (2 * DDP_LAYERS - 2)}


def call_probes(n: int, solo: dist.ProcessGroup | None = None) -> dict[str, Callable[[], object]]:
    """nn.DataParallel's own calls over GPUs 0..n-1, each on probe tensors and a module of its own (not the
    scenario's models), for what each costs the host: scatter and gather (forward; Gather's backward is a scatter
    too), parallel_apply over identity replicas (its threads' cost, no forward in them), replicate's broadcast of
    the parameters and the gradients' reduction onto GPU 0 (Broadcast's backward), these two on one chunk and
    (`<name>_x<CHUNKS>`) on CHUNKS chunks; and a probe model's backward over the n GPUs. On one GPU: that backward,
    the scatter (DataParallel's forward scatters its input over one GPU too) and, given `solo` (a process group of
    this rank alone), DDP's own costs (ddp_probes)."""
    from torch.nn.parallel import comm, parallel_apply, replicate
    from torch.nn.parallel.scatter_gather import gather, scatter_kwargs

    ids = list(range(n))
    x = torch.randn(PROBE_ROWS, PROBE_WIDTH, device="cuda:0")
    if n == 1:
        alone: dict[str, Callable[[], object]] = {"backward": BackwardProbe(1),
                                                  "scatter": lambda: scatter_kwargs((x,), {}, ids)}
        return alone | (ddp_probes(torch.device("cuda", 0), solo) if solo is not None else {})
    inputs, kwargs = scatter_kwargs((x,), {}, ids)
    replicas = replicate(nn.Identity().to("cuda:0"), ids)
    outputs = [torch.randn(PROBE_ROWS // n, PROBE_WIDTH, device=f"cuda:{d}", requires_grad=True) for d in ids]
    grads = [[torch.ones(PROBE_WIDTH, device=f"cuda:{d}")] for d in ids]
    chunked = [[torch.ones(CHUNK_BYTES // 4, device=f"cuda:{d}") for _ in range(CHUNKS)] for d in ids]
    return {"scatter": lambda: scatter_kwargs((x,), {}, ids),
            "parallel_apply": lambda: parallel_apply(replicas, inputs, kwargs, ids),
            "gather": lambda: gather(outputs, 0),
            "broadcast": lambda: comm.broadcast_coalesced([x], ids),
            "reduce_add": lambda: comm.reduce_add_coalesced(grads, 0),
            f"broadcast_x{CHUNKS}": lambda: comm.broadcast_coalesced(chunked[0], ids),
            f"reduce_add_x{CHUNKS}": lambda: comm.reduce_add_coalesced(chunked, 0),
            "backward": BackwardProbe(n)}


def call_costs(medians: dict[str, float], counts: tuple[int, ...]) -> dict[str, tuple[tuple[int, float], ...]]:
    """GilCosts.calls from the probes' median host times ("call_<probe>_<n>gpus"): each call by GPU count, and a
    coalesced call's cost per further chunk, (its time on CHUNKS chunks - on one) / (CHUNKS - 1), at least 0."""
    def at(probe: str, n: int) -> float | None:
        return medians.get(f"call_{probe}_{n}gpus")

    out = {}
    for call in CALLS:
        name, per_chunk = call.removesuffix("_chunk"), call.endswith("_chunk")
        points = []
        for n in counts:
            one, many = at(name, n), at(f"{name}_x{CHUNKS}", n)
            if one is None:
                continue
            if not per_chunk:
                points.append((n, one))
            elif many is not None:
                points.append((n, max((many - one) / (CHUNKS - 1), 0.0)))
        if points:
            out[call] = tuple(points)
    return out


def timed_calls(calls: dict[str, Callable[[], object]], devices: list[torch.device], repeat: int,
                ) -> dict[str, list[float]]:
    """Each call's host time (the call alone, every GPU synced before it, not timed after it), `repeat` times each,
    the calls taking turns; a call with a prepare() has it run first, untimed."""
    out: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(WARMUP + repeat):
        for name, call in calls.items():
            if hasattr(call, "prepare"):
                call.prepare()
            sync_all(devices)
            t0 = time.perf_counter()
            call()
            out[name].append(time.perf_counter() - t0)
    return {name: t[WARMUP:] for name, t in out.items()}


def worker(rank: int, world: int, device: torch.device, counts: tuple[int, ...], names: tuple[str, ...],
           steps: int, rounds: int, tiny: bool, calls: bool = False, launch_s: float = 0.0) -> dict[str, list[float]]:
    """One rank's part (hw.run.ranks.spawn): every (model, GPU count, interface) point's step times, in turns; with
    calls (GPUs only), DataParallel's calls over each count of 2+ GPUs and a probe's backward over each count too,
    and on one GPU DDP's own costs and a plain step's (hw.interfaces.step_costs, given an elementwise launch's
    launch_s: one value of each a round, "plain_<field>"), timed by rank 0 in the same turns. Per point (its figure's
    name) or call, this rank's times."""
    groups = {n: dist.new_group(list(range(n))) for n in counts if n > 1}  # every rank makes every group
    solo = dist.new_group([0]) if calls else None  # DDP's own costs, timed by rank 0 in a group of its own
    barrier = dist.new_group(backend="gloo")  # waits on the CPU, leaving the GPUs alone
    times: dict[str, list[float]] = {}
    built: dict[tuple[str, str, int], Step] = {}  # each point's model, built at its first turn
    probes: dict[int, dict[str, Callable[[], object]]] = {}  # each GPU count's call probes, made at their first turn
    probed = [("calls", "probe", n) for n in counts] if calls else []
    for r in range(rounds):
        order = [(kind, name, n) for name in names for n in counts for kind in ("ddp", "dp")] + probed
        random.Random(r).shuffle(order)  # the same order on every rank
        for point in order:
            kind, name, n = point
            dist.barrier(group=barrier)
            got: list[float] = []
            called: dict[str, list[float]] = {}
            if kind == "calls" and rank == 0:
                if n not in probes:
                    probes[n] = call_probes(n, solo)
                called = timed_calls(probes[n], [torch.device("cuda", d) for d in range(n)], steps)
                if n == 1:  # in the steps' own process and turns: the host drifts between processes and minutes
                    called |= {f"plain_{k}": [v] for k, v in step_host_costs(device, launch_s, steps).items()}
            elif (kind == "ddp" and rank < n) or (kind == "dp" and rank == 0):
                if point not in built:
                    built[point] = (ddp_step(name, n, groups.get(n), device, tiny) if kind == "ddp"
                                    else dp_step(name, n, device, tiny))
                got = timed_steps(*built[point], steps)
            dist.barrier(group=barrier)
            if kind == "calls":
                for call, t in called.items():
                    times.setdefault(call if call.startswith("plain_") else f"call_{call}_{n}gpus", []).extend(t)
            else:
                times.setdefault(f"{kind}_{name}_{n}gpus", []).extend(got)
    return times


def slowest_steps(per_rank: list[dict[str, list[float]]], key: str) -> list[float]:
    """Step by step, the slowest of the ranks that timed `key` (a step across ranks ends when its last rank's does)."""
    return [max(step) for step in zip(*(r[key] for r in per_rank if r.get(key)), strict=False)]


@dataclass(frozen=True)
class Comparison:
    """nn.DataParallel against DDP as measure() took them: the scenario's figures, and the costs timed beside."""

    figures: dict[str, float]  # "<dp|ddp>_<model>_<n>gpus_s" -> median step seconds (DDP: its slowest rank's)
    raw: dict[str, list[float]]  # every point's and call's times, step by step the slowest rank's
    calls: dict[str, tuple[tuple[int, float], ...]]  # GilCosts.calls (call_costs); {} where not timed
    ddp: dict[str, float]  # GilCosts' ddp_ fields (ddp_costs); {} where not timed
    step: dict[str, float]  # GilCosts' plain-step fields (step_host_costs), median over rounds; {} where not timed


def measure(counts: tuple[int, ...], device: str, steps: int, rounds: int, tiny: bool = False,
            timeout_s: float = 120.0, calls: bool = False, launch_s: float = 0.0) -> Comparison:
    """Every point's median step time (DDP: the slowest rank's step, step by step) and the raw times; with calls
    (on GPUs), DataParallel's calls' median host times by GPU count (`GilCosts.calls`), DDP's own costs
    (`ddp_costs`: GilCosts' ddp_ fields) and a plain step's (`step`: GilCosts' plain-step fields, the median over
    rounds) timed in the same turns."""
    from hw.run.ranks import spawn

    world = max(counts)
    calls = calls and device == "cuda"
    per_rank = spawn(worker, world, (counts, MODELS, steps, rounds, tiny, calls, launch_s), device,
                     timeout_s=timeout_s, deadline_s=600.0)
    figures: dict[str, float] = {}
    raw: dict[str, list[float]] = {}
    medians: dict[str, float] = {}
    for key in per_rank[0]:
        slowest = raw[key] = slowest_steps(per_rank, key)
        if key.startswith(("call_", "plain_")):
            medians[key] = statistics.median(slowest)
        else:
            figures[f"{key}_s"] = statistics.median(slowest)
    step = {k.removeprefix("plain_"): v for k, v in medians.items() if k.startswith("plain_")}
    return Comparison(figures, raw, call_costs(medians, counts), ddp_costs(medians), step)
