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

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hw.models import MlpBlock
from hw.opcosts import sync_all
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
    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(x).float().sum().backward()
    return step


def dp_step(name: str, n: int, rank_device: torch.device, tiny: bool) -> tuple[Callable[[], None], list]:
    """nn.DataParallel over GPUs 0..n-1 (on the CPU: the module itself, as DataParallel does without GPUs), and
    the devices a step uses."""
    model, batch, data = build(name, rank_device, tiny)
    if rank_device.type != "cuda":
        return forward_backward(model, data(batch)), [rank_device]
    wrapped = nn.DataParallel(model, device_ids=list(range(n)))
    return forward_backward(wrapped, data(batch)), [torch.device("cuda", d) for d in range(n)]


def ddp_step(name: str, n: int, group, rank_device: torch.device, tiny: bool) -> tuple[Callable[[], None], list]:
    """DDP over the first n ranks (25 MiB buckets, its default), each with ceil(batch / n) rows; one rank: the
    module alone."""
    model, batch, data = build(name, rank_device, tiny)
    if n > 1:
        ids = [rank_device.index] if rank_device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=ids, process_group=group)
    return forward_backward(model, data(math.ceil(batch / n))), [rank_device]


class BackwardProbe:
    """One backward over GPUs 0..n-1 of a probe model (PROBE_BLOCKS small MLP blocks on each GPU, their losses summed
    on GPU 0), which autograd runs in a device thread per GPU at once, as it runs DataParallel's replicas' backward;
    prepare() runs the forward (not timed)."""

    def __init__(self, n: int):
        from hw.models import MlpBlock

        self.models = [nn.Sequential(*(MlpBlock(PROBE_WIDTH) for _ in range(PROBE_BLOCKS))).to(f"cuda:{d}")
                       for d in range(n)]
        self.inputs = [torch.randn(PROBE_ROWS, PROBE_WIDTH, device=f"cuda:{d}") for d in range(n)]
        self.loss: torch.Tensor | None = None

    def prepare(self) -> None:
        self.loss = sum(m(x).sum().to("cuda:0") for m, x in zip(self.models, self.inputs))

    def __call__(self) -> None:
        self.loss.backward()
        self.loss = None


def call_probes(n: int) -> dict[str, Callable[[], object]]:
    """nn.DataParallel's own calls over GPUs 0..n-1, each on probe tensors and a module of its own (not the
    scenario's models), for what each costs the host: scatter and gather (forward; Gather's backward is a scatter
    too), parallel_apply over identity replicas (its threads' cost, no forward in them), replicate's broadcast of
    the parameters and the gradients' reduction onto GPU 0 (Broadcast's backward), these two on one chunk and
    (`<name>_x<CHUNKS>`) on CHUNKS chunks; and a probe model's backward over the n GPUs (one GPU: that alone)."""
    from torch.nn.parallel import comm, parallel_apply, replicate
    from torch.nn.parallel.scatter_gather import gather, scatter_kwargs

    if n == 1:
        return {"backward": BackwardProbe(1)}
    ids = list(range(n))
    x = torch.randn(PROBE_ROWS, PROBE_WIDTH, device="cuda:0")
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
            if one is not None and (not per_chunk or many is not None):
                points.append((n, max((many - one) / (CHUNKS - 1), 0.0) if per_chunk else one))
        if points:
            out[call] = tuple(points)
    return out


def timed_calls(calls: dict[str, Callable[[], object]], devices: list[torch.device], repeat: int) -> dict:
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
           steps: int, rounds: int, tiny: bool, calls: bool = False) -> dict:
    """One rank's part (hw.workers.spawn): every (model, GPU count, interface) point's step times, in turns; with
    calls (GPUs only), DataParallel's calls over each count of 2+ GPUs and a probe's backward over each count too,
    timed by rank 0 in the same turns."""
    groups = {n: dist.new_group(list(range(n))) for n in counts if n > 1}  # every rank makes every group
    barrier = dist.new_group(backend="gloo")  # waits on the CPU, leaving the GPUs alone
    times: dict[str, list[float]] = {}
    built: dict[tuple, tuple] = {}  # each point's model, built at its first turn
    probed = [("calls", "probe", n) for n in counts] if calls else []
    for r in range(rounds):
        order = [(kind, name, n) for name in names for n in counts for kind in ("ddp", "dp")] + probed
        random.Random(r).shuffle(order)  # the same order on every rank
        for point in order:
            kind, name, n = point
            dist.barrier(group=barrier)
            got: list[float] | dict = []
            if kind == "calls" and rank == 0:
                got = timed_calls(built.setdefault(point, call_probes(n)),
                                  [torch.device("cuda", d) for d in range(n)], steps)
            elif (kind == "ddp" and rank < n) or (kind == "dp" and rank == 0):
                if point not in built:
                    built[point] = (ddp_step(name, n, groups.get(n), device, tiny) if kind == "ddp"
                                    else dp_step(name, n, device, tiny))
                got = timed_steps(*built[point], steps)
            dist.barrier(group=barrier)
            if kind == "calls":
                for call, t in (got or {}).items():
                    times.setdefault(f"call_{call}_{n}gpus", []).extend(t)
            else:
                times.setdefault(f"{kind}_{name}_{n}gpus", []).extend(got)
    return times


def slowest_steps(per_rank: list[dict[str, list[float]]], key: str) -> list[float]:
    """Step by step, the slowest of the ranks that timed `key` (a step across ranks ends when its last rank's does)."""
    return [max(step) for step in zip(*(r[key] for r in per_rank if r.get(key)))]


def measure(counts: tuple[int, ...], device: str, steps: int, rounds: int, tiny: bool = False,
            timeout_s: float = 120.0, calls: bool = False) -> dict:
    """Every point's median step time (DDP: the slowest rank's step, step by step) and the raw times; with calls
    (on GPUs), DataParallel's calls' median host times by GPU count (`GilCosts.calls`) timed in the same turns."""
    from hw.workers import spawn

    world = max(counts)
    calls = calls and device == "cuda"
    per_rank = spawn(worker, world, (counts, MODELS, steps, rounds, tiny, calls), device, timeout_s=timeout_s,
                     deadline_s=600.0)
    figures, raw, medians = {}, {}, {}
    for key in per_rank[0]:
        slowest = raw[key] = slowest_steps(per_rank, key)
        if key.startswith("call_"):
            medians[key] = statistics.median(slowest)
        else:
            figures[f"{key}_s"] = statistics.median(slowest)
    return {"figures": figures, "raw": raw, "calls": call_costs(medians, counts)}
