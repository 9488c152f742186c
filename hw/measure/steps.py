"""`python -m hw measure`: run the real pipeline, time it, and report what `parsim predict` predicts.

Warm-up steps first, then N timed steps, each between barriers with the device synchronised:
median and spread of the step time, and peak memory per GPU; then one more step with a timer around
each compute action (CUDA events; wall clock on the CPU) for per-stage forward and backward times.
The speedup is over the same model on one device running the whole batch in one step.
--runtime picks what runs the schedule (hw.run.runtimes: hw's runner, or torch.distributed.pipelining's);
jobs can also be timed in turns, one step of each per round (hw validate --runtimes), so that the
host's drift hits them alike.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
from tqdm import tqdm

from hw.run.cuda_graphs import GraphRunner
from hw.run.observers import ActionTimer
from hw.run.ranks import host_pinned, kill_point, local_rank, release_unused, spawn
from hw.run.runtimes import Runner, job_groups, pins_host, runner_factory, runner_options
from hw.run.stage_runner import Groups, replica_batch
from hw.run.tensor_parallel import local
from hw.timing import sync
from parsim.errors import ParsimError
from parsim.files import record_kept
from parsim.schedules import Action, Schedule, gpipe
from parsim.workload import Model, stage_layers

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64}
Observer = Callable[[Action, str], None]  # called around each action of a step: (action, "start" | "end")


@dataclass(frozen=True)
class Config:
    steps: int
    warmup: int
    dtype: str
    trace: str | None = None
    trace_token: str = ""  # each rank writes its trace to staged_trace(..., token) until the run has succeeded






@dataclass(frozen=True)
class Job:
    """One thing to time: a schedule on a model. Ranks beyond the schedule's wait for the next job."""

    schedule: Schedule
    model: Model
    config: Config
    data_parallel: int = 1  # replicas of the pipeline, each on its own ranks and share of the batch
    copy_streams: bool = False  # messages posted on a dedicated CUDA stream (torchgpipe's copy streams)
    runtime: str = "hw"  # what runs the schedule (hw.run.runtimes; parsim's runtime of that name built the schedule)
    recompute: str = "never"  # which micro-batches' forwards are checkpointed (parsim.workload.recompute)
    tensor_parallel: int = 1  # processes splitting each pipeline rank's stages (hw.run.tensor_parallel)

    @property
    def ranks(self) -> int:
        return self.schedule.num_ranks * self.data_parallel * self.tensor_parallel


Turn = tuple[Job, ...]  # jobs on the same ranks, timed in turns: one step of each per round


@dataclass(frozen=True)
class RankTiming:
    """One job's timings on one rank (time_turn), sent back to the parent pickled: what report() reads."""

    times: list[float]  # each timed sample's seconds per step: the mean of its block's steps
    blocks: list[list[float]]  # each timed sample's steps, seconds
    per_op: dict[str, float]  # "stage:op" (e.g. "0:F") -> mean seconds of that compute in the per-action timed step
    timeline: list[tuple[str, float, float]]  # (action, start, end) of each compute in that step (ActionTimer)
    peak_memory_bytes: int | None  # the job's own peak on the GPU (own_peak); None on the CPU
    graph_pool_bytes: dict[str, int] | None  # a graphed runner's pool ("reserved", "allocated", "peak"); else None
    loops: list[list[float]] = field(default_factory=list)  # per sample, each step's host loop (the runner's call)


def jobs_worker(rank: int, world: int, device: torch.device, turns: list[Turn]) -> list[list[RankTiming | None]]:
    """Time every turn's jobs in this one process group, turn after turn, so a grid pays for start-up once."""
    groups = Groups()
    out: list[list[RankTiming | None]] = []
    for jobs in tqdm(turns, desc="measuring", file=sys.stderr,  # rank 0's, on a terminal only
                     disable=True if rank != 0 or len(turns) < 3 else None):
        made = [job_groups(job.runtime, job.schedule, groups, job.data_parallel, job.tensor_parallel) for job in jobs]
        ranks = jobs[0].ranks
        team = groups(tuple(range(ranks))) if ranks > 1 else None
        if rank >= ranks:
            out.append([None for _ in jobs])
        else:
            with _step_bar(jobs, rank == 0 and len(turns) < 3) as bar:  # few turns (hw measure): count their steps
                out.append([*time_turn(rank, device, jobs, made, team, bar.update)])
        release_unused(device)  # the turn's runners, before the next turn's are built
        if world > 1:
            dist.barrier()
    return out


class Stepper:
    """One job's runner on this rank, with its batch: a call runs one training step."""

    def __init__(self, rank: int, device: torch.device, job: Job, made: object):
        schedule, model, dtype = job.schedule, job.model, DTYPES[job.config.dtype]
        self.job = job
        self.runner: Runner
        self.runner, stages, replica = runner_factory(job.runtime, job.tensor_parallel)(
            schedule, model, rank, device, dtype, made, job.data_parallel, job.copy_streams,
            **runner_options(job.runtime, job.recompute))
        self.io = replica_batch(model, schedule, replica, job.data_parallel, device, dtype)
        self.params = [p for module in stages.values() for p in module.parameters()]
        self.pinned = pins_host(self.runner)

    def resident_bytes(self) -> int:
        """What this job holds allocated between its steps: its weights, their gradients (this rank's shards of split
        ones); for a graphed runner on a GPU, its static tensors outside its pool and what the pool has allocated
        (its gradients among them)."""
        pools = self.graph_pool_bytes()
        grads = [] if pools else [p.grad for p in self.params if p.grad is not None]
        held = sum(t.numel() * t.element_size() for t in (local(t) for t in self.params + grads))
        if pools and isinstance(self.runner, GraphRunner):
            held += self.runner.static_bytes() + pools["allocated"]
        return held

    def captured_bytes(self) -> int:
        """A graphed runner's graphs' intermediates: the most its pool had allocated at its captures beyond what stays
        allocated, which every replay writes into again although the allocator counts it free (0 for others)."""
        pools = self.graph_pool_bytes()
        return pools["peak"] - pools["allocated"] if pools else 0

    def graph_pool_bytes(self) -> dict[str, int] | None:
        """A graphed runner's pool on a GPU (hw.run.cuda_graphs.GraphRunner.graph_pool_bytes); None for the
        others."""
        return self.runner.graph_pool_bytes if isinstance(self.runner, GraphRunner) else None

    def __call__(self, observe: Observer | None = None) -> None:
        for p in self.params:
            p.grad = None
        self.runner.step(self.io, observe)


def _step_bar(jobs: Turn, show: bool) -> tqdm:
    """A progress line on stderr (where it is a terminal) counting the steps of a turn's jobs on this rank."""
    total = sum(steps_per_job(j.config.steps, j.config.warmup, j.config.trace) for j in jobs)
    name = " + ".join("the one-device baseline" if j.schedule.num_ranks == 1 else j.schedule.name for j in jobs)
    return tqdm(total=total, desc=f"measuring {name}", unit="step", file=sys.stderr, delay=1.0, leave=False,
                disable=None if show else True)


def time_turn(rank: int, device: torch.device, jobs: Turn, made: list[object], team: dist.ProcessGroup | None,
              stepped: Callable[[], object] = lambda: None) -> list[RankTiming]:
    """Warm every job up, then rounds of one timed sample of each job in turn, each between barriers, so that the host's
    drift hits them alike; then one more step of each with per-action timers, for per-stage times.

    On a GPU, where a turn has several jobs, each sample follows LEAD_S of untimed steps of the same job, so that it
    runs at the clock its own load holds; a sample is a block of steps lasting BLOCK_S at least, their mean (each
    sample's steps kept: `blocks`). The timers stay out of the timed steps. Runners that pin (hw's) step with the
    host thread pinned. A job's peak memory is its own: the process's peak during its step less what the turn's
    other jobs held when it began; a graphed job's adds its graphs' intermediates (Stepper.captured_bytes)."""
    steppers = [Stepper(rank, device, job, m) for job, m in zip(jobs, made, strict=True)]

    def settle() -> None:
        sync(device)
        if team is not None:
            dist.barrier(group=team)

    def pinned(stepper: Stepper) -> AbstractContextManager[None]:
        return host_pinned(device, local_rank(rank)) if stepper.pinned else contextlib.nullcontext()

    for stepper in steppers:
        for _ in range(stepper.job.config.warmup):
            stepper()
            stepped()
    blocks: list[list[list[float]]] = [[] for _ in steppers]
    loops: list[list[list[float]]] = [[] for _ in steppers]
    peaks = [0] * len(steppers)
    observe = _killer(rank)
    lead = len(steppers) > 1 and device.type == "cuda"
    paces = [pace(stepper, settle, team, device) if lead else Pace(0, 1) for stepper in steppers]
    for _ in range(max(job.config.steps for job in jobs)):
        for k, stepper in enumerate(steppers):
            if len(blocks[k]) == stepper.job.config.steps:
                continue
            with pinned(stepper):
                for _ in range(paces[k].lead):
                    stepper()
                _reset_peak(device)
                settle()
                others = _others_bytes(device, stepper)
                block: list[float] = []
                loop: list[float] = []
                for _ in range(paces[k].block):
                    t0 = time.perf_counter()
                    stepper(observe)
                    t1 = time.perf_counter()
                    settle()
                    block.append(time.perf_counter() - t0)
                    loop.append(t1 - t0)
                blocks[k].append(block)
                loops[k].append(loop)
            peaks[k] = max(peaks[k], own_peak(_peak(device), others) + stepper.captured_bytes())
            stepped()
    out: list[RankTiming] = []
    for k, stepper in enumerate(steppers):
        timer = ActionTimer(device)
        with pinned(stepper):
            _reset_peak(device)
            others = _others_bytes(device, stepper)
            stepper(timer)
            settle()
        peaks[k] = max(peaks[k], own_peak(_peak(device), others) + stepper.captured_bytes())
        stepped()
        config = stepper.job.config
        if config.trace:  # one more step, profiled on every rank: rank 0 writes FILE, rank r FILE's stem + .rank{r}
            _profile_one_step(stepper, device, trace_path(config.trace, rank), config.trace_token)
            stepped()
        per_op = {f"{s}:{op}": statistics.mean(v) for (s, op), v in timer.seconds().items()}
        out.append(RankTiming([statistics.mean(b) for b in blocks[k]], blocks[k], per_op, timer.timeline(),
                              peaks[k] if device.type == "cuda" else None, stepper.graph_pool_bytes(), loops[k]))
    return out


LEAD_S = 0.15  # untimed steps of a job before each of its timed samples in a turn: long enough to reach its power state
BLOCK_S = 0.05  # a timed sample in a turn: the mean of its steps lasting this long at least (one step at least)


@dataclass(frozen=True)
class Pace:
    """How a job is timed in a turn: `lead` untimed steps before each sample, a sample the mean of `block` steps."""

    lead: int
    block: int


def pace(stepper: Stepper, settle: Callable[[], None], team: dist.ProcessGroup | None, device: torch.device) -> Pace:
    """The steps that make LEAD_S and BLOCK_S (one at least), from one step timed now; the same on every rank of
    the team (the most any rank asks for), so that their steps stay matched."""
    settle()
    t0 = time.perf_counter()
    stepper()
    settle()
    step_s = time.perf_counter() - t0
    steps = torch.tensor([max(1, math.ceil(s / step_s)) for s in (LEAD_S, BLOCK_S)], device=device)
    if team is not None:
        dist.all_reduce(steps, op=dist.ReduceOp.MAX, group=team)
    return Pace(*map(int, steps.tolist()))


def _others_bytes(device: torch.device, stepper: Stepper) -> int:
    """Bytes allocated on the device now that are not `stepper`'s job's."""
    if device.type != "cuda":
        return 0
    return max(torch.cuda.memory_allocated(device) - stepper.resident_bytes(), 0)


def own_peak(peak_bytes: int, others_bytes: int) -> int:
    """A job's peak: the process's, less what other jobs held throughout its step."""
    return max(peak_bytes - others_bytes, 0)


def _reset_peak(device: torch.device) -> None:
    """Start the device's peak-memory count afresh (on a GPU)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device: torch.device) -> int:
    """The device's peak allocated bytes since the last _reset_peak (0 on the CPU)."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def _killer(rank: int) -> Observer | None:
    """The fault-injection hook of HW_KILL_AT (see hw.run.ranks.kill_point), or None."""
    point = kill_point()
    if point is None or point[0] != rank:
        return None
    seen = iter(range(10**9))

    def observe(action: Action, phase: str) -> None:
        if phase == "start" and next(seen) == point[1]:
            os.kill(os.getpid(), signal.SIGKILL)

    return observe


def trace_path(path: str, rank: int) -> str:
    """Where rank `rank` writes its profiler trace: `path` itself for rank 0."""
    if rank == 0:
        return path
    base, dot, ext = path.rpartition(".")
    return f"{base}.rank{rank}.{ext}" if dot and "/" not in ext else f"{path}.rank{rank}"


def staged_trace(path: str, token: str) -> str:
    """Where a rank writes its trace until the whole run has succeeded: a hidden file beside it."""
    folder, _, name = path.rpartition("/")
    return f"{folder}/" * bool(folder) + f".{name[:64]}.{token}.tmp"


def keep_traces(paths: list[str], token: str, keep: bool) -> None:
    """Move every rank's staged trace into place (`keep`), or remove them all: a failed run leaves none."""
    for path in paths:
        staged = staged_trace(path, token)
        if os.path.exists(staged) and keep:
            os.replace(staged, path)
            record_kept(path)
        elif os.path.exists(staged):
            os.unlink(staged)


class ProfilerLabels:
    """Each action of a profiled step as a span named `hw:<action>` (e.g. `hw:F(s0,m1)`) on the host and, on a GPU,
    over the kernels it launched: every runtime's trace names its actions alike (scripts/trace_summary.py)."""

    PREFIX = "hw:"

    def __init__(self) -> None:
        self.open: dict[Action, torch.profiler.record_function] = {}

    def __call__(self, action: Action, phase: str) -> None:
        if phase == "start":
            self.open[action] = torch.profiler.record_function(f"{self.PREFIX}{action}").__enter__()
        else:
            self.open.pop(action).__exit__(None, None, None)


@contextmanager
def native_stderr_quiet() -> Iterator[None]:
    """File descriptor 2 on /dev/null while the block runs, where stderr is no terminal: the profiler's C++ side
    (Kineto) logs its start and stop there, below any Python or environment setting (torch 2.13's "USDT: ...
    profiler_start"), and a log or a pipe should hold what hw says, not that."""
    if sys.stderr is not None and sys.stderr.isatty():
        yield
        return
    if sys.stderr is not None:
        sys.stderr.flush()
    saved = os.dup(2)
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _profile_one_step(one_step: Stepper, device: torch.device, path: str, token: str = "") -> None:
    """A torch.profiler Chrome trace of one more step, its actions labelled (ProfilerLabels), written to
    staged_trace (moved into place by keep_traces), or without a token, atomically into place."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    prof = profile(activities=activities)
    with native_stderr_quiet():
        prof.start()
    try:
        one_step(ProfilerLabels())
        sync(device)
    finally:
        with native_stderr_quiet():
            prof.stop()
    tmp = staged_trace(path, token or str(os.getpid()))
    prof.export_chrome_trace(tmp)
    if not token:
        os.replace(tmp, path)


def measure_jobs(jobs: list[Job], world: int, device: str, timeout_s: float) -> list[list[RankTiming | None]]:
    """Run `jobs` on `world` ranks, one after another; per job, each rank's timings (None on ranks it does not use)."""
    return [results for (results,) in measure_turns([(job,) for job in jobs], world, device, timeout_s)]


def measure_turns(turns: list[Turn], world: int, device: str, timeout_s: float,
                  ) -> list[list[list[RankTiming | None]]]:
    """Run each turn's jobs in turns (see time_turn) on `world` ranks, turn after turn; per turn, per job, each
    rank's timings (None on ranks it does not use)."""
    if any(len({job.ranks for job in jobs}) != 1 for jobs in turns):
        raise ValueError("the jobs of a turn run on the same ranks")
    jobs = sum(len(t) for t in turns)
    per_rank = spawn(jobs_worker, world, (turns,), device, timeout_s, deadline_s=deadline_s(timeout_s, jobs))
    return [[[per_rank[r][t][j] for r in range(world)] for j in range(len(turn))] for t, turn in enumerate(turns)]


def deadline_s(timeout_s: float, jobs: int) -> float:
    """How long a run of `jobs` jobs may take in all: start-up and each job, each up to a --timeout."""
    return timeout_s * (4 + jobs)


MAX_STEPS = 10_000  # --steps and --warmup of one job: past this a run is a soak test, not a measurement


def steps_per_job(steps: int, warmup: int, trace: str | None = None) -> int:
    """Steps a job runs on each of its ranks: warm-up, timed, one with per-action timers, one profiled (--trace)."""
    return warmup + steps + 1 + (trace is not None)


def baseline_job(model: Model, config: Config) -> Job:
    """The whole model on one device, the whole batch in one step: what speedup is measured against."""
    return Job(gpipe(1, 1), replace(model, balance=None), Config(config.steps, config.warmup, config.dtype))


def on_rank(results: list[RankTiming | None], rank: int) -> RankTiming:
    """Rank `rank`'s timings of a job that uses it: one clear error where that rank did not time it."""
    timing = results[rank]
    if timing is None:
        raise ParsimError(f"rank {rank} has no timings of a job that runs on it")
    return timing


def report(job: Job, results: list[RankTiming | None], baseline: RankTiming | None, device: str) -> dict:
    """The report of one measured job as plain data (speedup None where no baseline was run)."""
    schedule, model, config = job.schedule, job.model, job.config
    first = on_rank(results, 0)
    times = first.times
    step = statistics.median(times)
    base = None if baseline is None else statistics.median(baseline.times)
    per_stage = []
    t = job.tensor_parallel
    for s, q in enumerate(schedule.stage_to_rank):
        rank = q * t  # TP index 0 of the pipeline rank (hw.run.tensor_parallel.place); its peak, the group's most
        timing = on_rank(results, rank)
        ops = timing.per_op
        split = f"{s}:I" in ops  # a split backward is its input-grad plus its weight-grad
        backward = ops[f"{s}:I"] + ops.get(f"{s}:W", 0.0) if split else ops.get(f"{s}:B")
        peaks = [on_rank(results, rank + i).peak_memory_bytes for i in range(t)]
        per_stage.append({"stage": s, "rank": rank, "forward_s": ops.get(f"{s}:F"), "backward_s": backward,
                          "peak_memory_bytes": None if None in peaks else max(b for b in peaks if b is not None),
                          "graph_pool_bytes": timing.graph_pool_bytes})
    return {
        "step_time_s": step, "step_time_min_s": min(times), "step_time_max_s": max(times),
        "step_blocks_s": first.blocks,  # each timed sample's steps (rank 0's): a sample is their mean
        "single_device_step_s": base, "speedup": None if base is None else base / step, "per_stage": per_stage,
        "timeline": [{"rank": rank * t, "actions": on_rank(results, rank * t).timeline}
                     for rank in sorted(set(schedule.stage_to_rank))],
        "config": {"schedule": schedule.name, "gpus": job.ranks, "data_parallel": job.data_parallel,
                   "tensor_parallel": t, "runtime": job.runtime,
                   "copy_streams": job.copy_streams, "recompute": job.recompute,
                   "microbatches": schedule.num_microbatches,
                   "stages": schedule.num_stages, "model": model.name, "layers": len(model.layers),
                   "balance": [len(r) for r in stage_layers(model, schedule.num_stages)],
                   "hidden": model.layers[0].hidden, "tokens": model.tokens, "dtype": config.dtype,
                   "device": _device_name(device), "torch": torch.__version__, "steps": config.steps,
                   "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")},
    }


def run(schedule: Schedule, model: Model, config: Config, device: str, timeout_s: float,
        data_parallel: int = 1, copy_streams: bool = False, runtime: str = "hw", recompute: str = "never",
        tensor_parallel: int = 1, baseline: bool = True) -> dict:
    """Measure `schedule` (on `data_parallel` replicas, each rank `tensor_parallel` GPUs) run by `runtime`, and,
    with `baseline`, the one-device baseline (hw's runner, no recomputation); the report as plain data."""
    job = Job(schedule, model, config, data_parallel, copy_streams, runtime, recompute, tensor_parallel)
    if not baseline:
        return report(job, measure_jobs([job], job.ranks, device, timeout_s)[0], None, device)
    measured, base = measure_jobs([job, baseline_job(model, config)], job.ranks, device, timeout_s)
    return report(job, measured, on_rank(base, 0), device)


def _device_name(device: str) -> str:
    """The GPU's name, or "cpu"."""
    return torch.cuda.get_device_name(0) if device == "cuda" else "cpu"












