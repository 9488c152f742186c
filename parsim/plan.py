"""Search configurations for a model and GPU count; rank them by predicted step time.

Candidates: every runtime the profile can cost, every schedule it runs, power-of-two micro-batch counts,
virtual stages 2 and 4 for the schedules that take them, every tensor-parallel degree of 1, 2, 4 and 8 that
divides the GPUs, a node's GPUs and the model's heads and widths, every data-parallel degree that divides the
rest, and each split asked for (equal layer counts, balanced by time, or both).

The search simulates only what can win. Each configuration's floor (parsim.sim.bounds: a step time no
simulation of it can beat, from closed forms) orders the search; once the top K are known, a
configuration whose floor is above the K-th best's time cannot enter them and is not simulated, so the
top K are the exhaustive search's. A configuration over the memory limit is screened out before it is
simulated. Configurations are simulated in parallel, one process per core.

Memory per GPU is its weights, gradients and optimizer state (mixed-precision Adam by default:
16 bytes per parameter, bf16 weights and gradients, fp32 master weights and two moments) plus the
most activations and working memory its program holds at once (parsim.workload.memory).
"""

from __future__ import annotations

import bisect
import heapq
import os
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any, cast

from parsim.budget import MAX_ACTIONS, actions, check_plan, cpu_cores, stages_per_rank
from parsim.configuration import Configuration, prepare
from parsim.errors import ParsimError, ProfileError, ScheduleError
from parsim.interrupts import default_signals, die_with_parent
from parsim.profile import Profile
from parsim.runtimes import RUNTIMES, Runtime
from parsim.runtimes.eager import EAGER
from parsim.schedules import VIRTUAL, Schedule
from parsim.sim.bounds import step_floor_s
from parsim.sim.grad_allreduce import gradient_buckets
from parsim.sim.predict import Prediction, StepAbove
from parsim.workload import Model, StageCost, partitioned, stage_costs, stage_layers
from parsim.workload.recompute import splits_backward
from parsim.workload.tensor_parallel import DEGREES, TensorParallel, check_tensor_parallel, split_model, tp_view
from parsim.workload.tensor_parallel import RUNTIMES as TP_RUNTIMES
from parsim.workload.timed import priced

OPTIMIZER_BYTES_PER_PARAM = 16  # mixed-precision Adam (see parsim.workload.memory)
SPLITS = {"equal": ("equal",), "time": ("time",), "both": ("equal", "time")}


@dataclass(frozen=True)
class Candidate:
    schedule: str
    microbatches: int
    virtual_stages: int
    data_parallel: int
    prediction: Prediction | None  # None: screened out by memory, not simulated
    memory_bytes: int  # the most any one GPU needs
    balance: tuple[int, ...] | None = None  # layers per stage, where not an equal split
    runtime: str = "hw"  # what runs it (parsim.runtimes)
    recompute: str = "never"  # what it fits with only by recomputing (parsim.workload.recompute)
    tensor_parallel: int = 1
    sequence_parallel: bool = False

    @property
    def label(self) -> str:
        v = f", v={self.virtual_stages}" if self.schedule in VIRTUAL else ""
        dp = f", dp={self.data_parallel}" if self.data_parallel > 1 else ""
        if self.tensor_parallel > 1:
            dp = f", tp={self.tensor_parallel}{'+sp' * self.sequence_parallel}{dp}"
        split = f" [{'/'.join(map(str, self.balance))}]" if self.balance and len(self.balance) > 1 else ""
        redo = f", recompute {self.recompute}" if self.recompute != "never" else ""
        return f"{self.schedule} m={self.microbatches}{v}{dp}{redo}{split}"

    def configuration(self, model: Model, gpus: int, copy_streams: bool = False) -> Configuration:
        """This candidate as a configuration of `model` on `gpus` GPUs, to predict again (a timeline)."""
        return Configuration(model, self.schedule, gpus, self.microbatches,
                             self.virtual_stages if self.schedule in VIRTUAL else None, self.data_parallel,
                             self.runtime, copy_streams, self.balance or "equal", self.recompute,
                             self.tensor_parallel, self.sequence_parallel)


@dataclass(frozen=True)
class Shape:
    """A configuration before it is built: where it sits in the search, and the floor under its step time."""

    index: int  # in enumeration order: ties in step time go to the earlier
    runtime: str
    schedule: str
    num_ranks: int
    microbatches: int
    virtual_stages: int
    data_parallel: int
    balance: tuple[int, ...] | None
    floor_s: float
    tensor_parallel: int = 1
    sequence_parallel: bool = False

    def configuration(self, model: Model) -> Configuration:
        """This shape as a configuration of `model`."""
        return Configuration(model, self.schedule, self.num_ranks * self.data_parallel * self.tensor_parallel,
                             self.microbatches, self.virtual_stages if self.schedule in VIRTUAL else None,
                             self.data_parallel, self.runtime, partition=self.balance or "equal",
                             tensor_parallel=self.tensor_parallel, sequence_parallel=self.sequence_parallel)


@dataclass(frozen=True)
class Search:
    """What plan found, and what it took."""

    fits: list[Candidate]  # under the memory limit, fastest first: the top K (all of them where K is None)
    too_big: list[Candidate]  # over the memory limit, not simulated
    considered: int
    pruned: int  # not simulated: their floor is above the K-th best step time
    cannot_run: int  # the schedule (or the runtime) refuses these sizes
    simulated: int
    seconds: float
    jobs: int
    too_large: int = 0  # not considered: past what parsim simulates at once (parsim.budget)
    degrees: tuple[int, ...] = (1,)  # the tensor-parallel degrees tried (tp_degrees)


def params_per_gpu(model: Model, num_ranks: int, num_stages: int, stage_to_rank: tuple[int, ...]) -> list[int]:
    """Parameters each rank of one pipeline holds."""
    per_layer = [layer.params for layer in model.layers]
    held = [0] * num_ranks
    for stage, layers in enumerate(stage_layers(model, num_stages)):
        held[stage_to_rank[stage]] += sum(per_layer[i] for i in layers)
    return held


RECOMPUTE_ORDER = ("except-last", "always")  # what plan tries where a configuration does not fit: the cheaper first


def can_recompute(runtime: str, schedule: Schedule) -> bool:
    """Whether plan may offer `schedule` recomputed: run by hw's runner (the runtime hw recomputes under, whose host
    cost calibrate measures), its backward not split (hw.run.stage_runner.check_recompute)."""
    return runtime == "hw" and not splits_backward(schedule)


def microbatch_counts(tokens: int, gpus: int, most: int = 256) -> list[int]:
    """Powers of two from 1 to `most` that split the batch evenly (none for an empty batch)."""
    return [m for m in (1 << k for k in range(most.bit_length())) if m <= most and tokens and tokens % m == 0]


def costed_runtimes(profile: Profile) -> list[Runtime]:
    """Every registered runtime whose costs the profile has (hw's runner always)."""
    out = []
    for runtime in RUNTIMES.values():
        try:
            runtime.costs(profile)
        except ProfileError:
            continue
        out.append(runtime)
    return out


# (runtime, data-parallel degree, schedule, micro-batches, virtual stages or None, stages, tensor-parallel degree)
Layout = tuple[Runtime, int, str, int, int | None, int, int]


def tp_degrees(model: Model, gpus: int, profile: Profile, degrees: tuple[int, ...] = DEGREES,
               sequence: bool = False) -> list[int]:
    """The tensor-parallel degrees plan tries: those of `degrees` that divide the GPUs and a node's, and split every
    layer of the model (heads, key/value heads, widths, vocabulary); above 1 only where the profile can cost a
    collective."""
    out = []
    for t in degrees:
        if gpus % t or (t > 1 and "allreduce" not in profile.collectives and "tp_allreduce" not in profile.collectives):
            continue
        try:
            check_tensor_parallel(model, TensorParallel(t, sequence and t > 1), profile.gpus_per_node)
        except ParsimError:
            continue
        out.append(t)
    return out


def layouts(model: Model, gpus: int, profile: Profile, runtimes: list[Runtime], schedules: list[str] | None = None,
            max_microbatches: int = 256, data_parallel: bool = True, degrees: tuple[int, ...] = (1,),
            sequence: bool = False) -> list[Layout]:
    """Every configuration to consider, in enumeration order (runtimes, tensor-parallel degrees (tp_degrees of
    `degrees`), data-parallel degrees where the profile can cost an all-reduce, schedules, micro-batch counts,
    virtual stages), by arithmetic alone: no more stages than layers, and several stages per GPU only where there
    are several GPUs. Cheap however many GPUs: a pipeline is never longer than the model, so only degrees that
    leave at most a rank a layer are tried."""
    dp_ok = data_parallel and "allreduce" in profile.collectives
    layers = len(model.layers)
    out: list[Layout] = []
    for runtime in runtimes:
        names = [n for n in (schedules or runtime.schedules()) if n in runtime.schedules()]
        for t in tp_degrees(model, gpus, profile, degrees if runtime.name in TP_RUNTIMES else (1,), sequence):
            groups = gpus // t
            ranks = [pp for pp in range(min(groups, layers), 0, -1) if groups % pp == 0] if dp_ok else \
                [groups] if groups <= layers else []
            for pp in ranks:
                dp = groups // pp
                for name in names:
                    for m in microbatch_counts(model.tokens // dp if model.tokens % dp == 0 else 0, pp,
                                               max_microbatches):
                        for v in ((2, 4) if name in VIRTUAL else (None,)):
                            stages = pp * stages_per_rank(name, v)
                            if stages <= layers and not (pp == 1 and stages > 1):
                                out.append((runtime, dp, name, m, v, stages, t))
    return out


def too_large(layout: Layout, gpus: int) -> bool:
    """Whether a configuration is past what parsim simulates at once (parsim.budget): plan leaves it out."""
    _, _, name, m, v, _, t = layout
    return actions(name, gpus // t, m, v) > MAX_ACTIONS


def shapes(model: Model, gpus: int, profile: Profile, runtimes: list[Runtime], schedules: list[str] | None = None,
           max_microbatches: int = 256, data_parallel: bool = True, partition: str = "equal",
           tick: Callable[[], None] | None = None, degrees: tuple[int, ...] = (1,),
           sequence: bool = False) -> list[Shape]:
    """Every configuration to consider (layouts, less those too large to simulate), with its floor, in enumeration
    order; each split `partition` asks for once, where they differ. Nothing is built; `tick` is called after each
    configuration (a progress line). Refuses a plan too large to weigh (parsim.budget)."""
    todo = [layout for layout in layouts(model, gpus, profile, runtimes, schedules, max_microbatches, data_parallel,
                                         degrees, sequence)
            if not too_large(layout, gpus)]
    keys = {(runtime.name, stages, m * dp, t) for runtime, dp, _, m, _, stages, t in todo}  # one split per key
    cells = sum(key[1] for key in keys) * len(model.layers) if "time" in SPLITS[partition] else 0
    check_plan([layout[5] for layout in todo], cells, gpus, len(model.layers))
    out: list[Shape] = []
    splits_of: dict[tuple[str, int, int, int], list[tuple[tuple[int, ...] | None, list[StageCost]]]] = {}
    run_profiles = {(runtime.name, t): tp_view(runtime.costs(profile), t) for runtime in runtimes
                    for t in {layout[6] for layout in todo}}
    for layout in todo:
        runtime, dp, name, m, v, stages, t = layout
        if tick is not None:
            tick()
        pp, run_profile = gpus // (dp * t), run_profiles[runtime.name, t]
        owner = runtime.placement(name, pp, v)
        key = (runtime.name, stages, m * dp, t)  # a micro-batch's samples (batch / (m x dp)): all a split needs
        if key not in splits_of:
            tp = TensorParallel(t, sequence and t > 1)
            splits_of[key] = _splits(split_model(model, tp), partition, stages, m, run_profile, dp)
        for balance, costs in splits_of[key]:
            floor = step_floor_s(owner, costs, m, run_profile, dp, runtime.splits_backward(name),
                                 gradient_buckets(costs) if dp > 1 else None)
            out.append(Shape(len(out), runtime.name, name, pp, m, v or 1, dp, balance, floor, t, sequence and t > 1))
    return out


def _splits(model: Model, partition: str, stages: int, m: int, profile: Profile, dp: int
            ) -> list[tuple[tuple[int, ...] | None, list[StageCost]]]:
    """(balance, stage costs) of each split `partition` asks for, once per layer counts (a time split may be the
    equal one: the first asked for is kept)."""
    out: dict[tuple[int, ...], tuple[tuple[int, ...] | None, list[StageCost]]] = {}
    for how in SPLITS[partition]:
        split = partitioned(model, how, stages, m, profile, dp)
        counts = tuple(map(len, stage_layers(split, stages)))
        if counts not in out:
            out[counts] = split.balance, stage_costs(split, stages, m, profile, dp)
    return list(out.values())


_CONTEXT: tuple[Model, Profile, float | None, str, bool] | None = None  # a worker's: what every configuration shares


def _start_worker(parent: int, model: Model, profile: Profile, memory_limit_bytes: float | None,
                  optimizer: str, recompute: bool) -> None:
    """A worker process: Ctrl-C is the parent's to handle (it stops the workers); SIGTERM ends it at once; it dies
    with its parent, however that ends (SIGKILL included)."""
    global _CONTEXT
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    default_signals()  # forked with the parent's handler, which would unwind the worker instead of ending it
    _CONTEXT = model, profile, memory_limit_bytes, optimizer, recompute


@dataclass(frozen=True)
class Beyond:
    """What evaluate returns for a configuration its simulation proved slower than the bound it was given."""

    floor_s: float


def evaluate(shape: Shape, model: Model, profile: Profile, memory_limit_bytes: float | None = None,
             optimizer: str = "adam", recompute: bool = True, bound_s: float | None = None,
             ) -> Candidate | Beyond | None:
    """Build, screen by memory, simulate: the candidate (its prediction None if over the limit), or None if its
    schedule refuses these sizes, or Beyond where the simulation found a floor that ranks it after a step of
    `bound_s` (the top K's slowest when it was sent: such a configuration cannot enter them). Where it is over the
    limit and `recompute`, the first mode of RECOMPUTE_ORDER that fits it is taken: recomputing only lengthens a
    step, so its floor still holds, and of the modes that fit the first is the fastest."""
    try:
        prepared = prepare(shape.configuration(model), profile)
    except ScheduleError:
        return None  # e.g. interleaving with m not a multiple of pp, DualPipeV with m < 2pp
    memory = prepared.runtime.peak_bytes(prepared.run_model, prepared.schedule, shape.data_parallel, optimizer)
    if recompute and memory_limit_bytes is not None and memory > memory_limit_bytes \
            and can_recompute(shape.runtime, prepared.schedule):
        for mode in RECOMPUTE_ORDER:  # over the limit even so: the last, the least memory, is what it is shown with
            memory = prepared.runtime.peak_bytes(prepared.run_model, prepared.schedule, shape.data_parallel,
                                                 optimizer, mode)
            prepared = replace(prepared, config=replace(prepared.config, recompute=mode))
            if memory <= memory_limit_bytes:
                break
    prediction = None
    if memory_limit_bytes is None or memory <= memory_limit_bytes:
        try:
            prediction, _ = prepared.predict(None if bound_s is None else lambda floor_s: ranks_after(floor_s, bound_s))
        except StepAbove as above:
            return Beyond(above.floor_s)
    return Candidate(shape.schedule, shape.microbatches, shape.virtual_stages, shape.data_parallel, prediction,
                     memory, prepared.model.balance, shape.runtime, prepared.config.recompute,
                     shape.tensor_parallel, shape.sequence_parallel)


def _evaluate_in_worker(shape: Shape, bound_s: float | None) -> Candidate | Beyond | None:
    assert _CONTEXT is not None
    return evaluate(shape, *_CONTEXT, bound_s=bound_s)


def rank_key(step_s: float, memory_bytes: int, index: int) -> tuple[float, int, int]:
    """How plan orders what fits: fastest first; of equally fast ones (to the nanosecond: a host-bound GPipe and
    1F1B issue the same host program), the one needing less memory; then as configurations are enumerated."""
    return round(step_s, 9), memory_bytes, index


def ranks_after(floor_s: float, step_s: float) -> bool:
    """Whether any configuration whose step is at least `floor_s` ranks after one of `step_s` (rank_key), however
    little memory it needs."""
    return round(floor_s, 9) > round(step_s, 9)


def search(model: Model, gpus: int, profile: Profile, memory_limit_bytes: float | None = None,
           schedules: list[str] | None = None, partition: str = "equal", runtimes: list[Runtime] | None = None,
           top: int | None = None, jobs: int = 1, progress: bool = False, max_microbatches: int = 256,
           data_parallel: bool = True, optimizer: str = "adam", recompute: bool = True,
           degrees: tuple[int, ...] = (1,), sequence: bool = False) -> Search:
    """The `top` fastest configurations under the memory limit (all of them where top is None), simulating only
    those whose floor can beat the top-th best found so far, in order of floor, on `jobs` processes; a configuration
    over the limit recomputed where that fits it, if `recompute` (evaluate). Tensor-parallel degrees: those of
    `degrees` the GPUs, a node and the model allow (tp_degrees), with sequence parallelism where `sequence`."""
    start = time.perf_counter()
    profile = priced(profile, model.layers)
    runtimes = runtimes or costed_runtimes(profile)
    every = layouts(model, gpus, profile, runtimes, schedules, max_microbatches, data_parallel, degrees, sequence)
    left_out = sum(too_large(layout, gpus) for layout in every)
    with _progress(len(every) - left_out, progress) as bar:
        bar.set_description("plan: weighing", refresh=False)
        todo = shapes(model, gpus, profile, runtimes, schedules, max_microbatches, data_parallel, partition,
                      bar.update, degrees, sequence)
        bar.set_description("plan", refresh=False)
        bar.n, bar.total = 0, len(todo)
        fits, too_big, counts = _search(todo, bar, top, (model, profile, memory_limit_bytes, optimizer, recompute),
                                        jobs)
    fits.sort(key=lambda f: rank_key(f[0], f[2].memory_bytes, f[1]))
    ranked = [c for _, _, c in fits][:top]
    return Search(ranked, too_big, len(todo), counts["pruned"], counts["cannot_run"], len(fits),
                  time.perf_counter() - start, jobs, left_out,
                  tuple(sorted({layout[6] for layout in every})))


def _search(todo: list[Shape], bar: Any, top: int | None, context: tuple[Model, Profile, float | None, str, bool],
            jobs: int) -> tuple[list[tuple[float, int, Candidate]], list[Candidate], dict[str, int]]:
    """Simulate what can still enter the top `top` (search's loop): (step, index, candidate) of those that fit,
    those over the memory limit, and how many were pruned or cannot run."""
    fits: list[tuple[float, int, Candidate]] = []
    too_big: list[Candidate] = []
    best: list[float] = []  # the top fastest step times so far, negated (a max-heap)
    counts = {"pruned": 0, "cannot_run": 0}

    def can_win(shape: Shape) -> bool:
        return top is None or len(best) < top or shape.floor_s <= -best[0]

    def bound() -> float | None:  # the top's slowest step so far, once there are `top` of them
        return -best[0] if top is not None and len(best) == top else None

    def record(shape: Shape, found: Candidate | None) -> None:
        if found is None:
            counts["cannot_run"] += 1
        elif found.prediction is None:
            too_big.append(found)
        else:
            step = found.prediction.step_time_s
            fits.append((step, shape.index, found))
            if top is not None:
                (heapq.heappush if len(best) < top else heapq.heappushpop)(best, -step)

    ordered = sorted(todo, key=lambda s: (s.floor_s, s.index))
    floors = [s.floor_s for s in ordered]
    for shape, found in _run(ordered, can_win, bound, context, jobs):
        if found is _PRUNED or isinstance(found, Beyond):
            counts["pruned"] += 1
            continue
        record(shape, cast("Candidate | None", found))
        if top is not None and len(best) == top:  # the bar counts to what may still win, not to everything
            bar.total = bisect.bisect_right(floors, -best[0])
        bar.update()
    return fits, too_big, counts


_PRUNED = object()  # _run's mark for a configuration it did not simulate


def _run(ordered: list[Shape], can_win: Callable[[Shape], bool], bound: Callable[[], float | None],
         context: tuple[Model, Profile, float | None, str, bool], jobs: int) -> Iterator[tuple[Shape, object]]:
    """(shape, evaluate's answer or _PRUNED) for each shape: evaluated where `can_win` says it still can when its
    turn comes (checked again before a queued one starts), with `bound()` then, on `jobs` worker processes (1: in
    this one); `context`: evaluate's arguments after the shape."""
    if jobs <= 1:
        for k, shape in enumerate(ordered):
            if not can_win(shape):  # floors only rise from here: nothing after it can win either
                for rest in ordered[k:]:
                    yield rest, _PRUNED
                return
            yield shape, evaluate(shape, *context, bound_s=bound())
        return
    pool = ProcessPoolExecutor(jobs, initializer=_start_worker, initargs=(os.getpid(), *context))
    try:
        pending: dict[Future[Candidate | Beyond | None], Shape] = {}
        queue = iter(ordered)
        stopped = False
        while pending or not stopped:
            while not stopped and len(pending) < 2 * jobs:
                upcoming = next(queue, None)
                if upcoming is None or not can_win(upcoming):
                    stopped = True
                    for rest in ([upcoming] if upcoming is not None else []) + list(queue):
                        yield rest, _PRUNED
                    break
                pending[pool.submit(_evaluate_in_worker, upcoming, bound())] = upcoming
            if not pending:
                break
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield pending.pop(future), future.result()
            for future in [f for f, s in pending.items() if not can_win(s)]:
                if future.cancel():  # queued, not started: the best found since rules it out
                    yield pending.pop(future), _PRUNED
    except BaseException:
        stop_workers(pool)
        raise
    pool.shutdown()


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """Cancel what is queued and end the worker processes now, rather than after their current configuration."""
    kill = getattr(pool, "kill_workers", None)  # Python 3.14: kills them and shuts the pool down
    if kill is not None:
        kill()
        return
    # killed before the shutdown, which drops the pool's list of them (killed after it, they were left running);
    # the shutdown then waits for the pool's thread to see them gone, so that none of it is left for the exit
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.kill()  # SIGKILL: one still starting has no handler of its own yet, and must not wait for one
    pool.shutdown(wait=True, cancel_futures=True)


class _NoBar:
    total = n = 0

    def update(self, n: int = 1) -> None:
        pass

    def set_description(self, desc: str, refresh: bool = True) -> None:
        pass


def _progress(total: int, show: bool) -> AbstractContextManager[Any]:
    """A progress bar on stderr for a search that takes more than a second, where stderr is a terminal."""
    if not show:
        from contextlib import nullcontext

        return nullcontext(_NoBar())
    from tqdm import tqdm

    tqdm.monitor_interval = 0  # no monitor thread: the worker processes are forked while the bar is up
    bar: AbstractContextManager[Any] = tqdm(total=total, unit="config", desc="plan", delay=1.0, leave=False,
                                            disable=None)
    return bar


def default_jobs() -> int:
    """The cores this process may run on."""
    return cpu_cores()


def candidates(model: Model, gpus: int, profile: Profile, schedules: list[str] | None = None,
               max_microbatches: int = 256, data_parallel: bool = True, partition: str = "equal",
               optimizer: str = "adam", runtime: Runtime | None = EAGER) -> list[Candidate]:
    """Every configuration that can run, predicted (the exhaustive search), fastest first; those that cannot are
    skipped, not errors. runtime None: every runtime the profile can cost.

    Data-parallel degrees are tried only where the profile can cost an all-reduce; each configuration's
    layers are split as `partition` says ("equal", "time": balanced at its micro-batch size, or "both",
    each once where they differ). Memory per GPU holds the optimizer's state (see parsim.workload.memory).
    """
    return search(model, gpus, profile, None, schedules, partition, [runtime] if runtime else None,
                  max_microbatches=max_microbatches, data_parallel=data_parallel, optimizer=optimizer).fits


def plan(model: Model, gpus: int, profile: Profile, memory_limit_bytes: float | None = None,
         schedules: list[str] | None = None, partition: str = "equal", optimizer: str = "adam",
         runtime: Runtime | None = EAGER) -> tuple[list[Candidate], list[Candidate]]:
    """(fitting, too big): every configuration under the memory limit, fastest first, and the rest (not simulated).
    runtime None: every runtime the profile can cost."""
    found = search(model, gpus, profile, memory_limit_bytes, schedules, partition, [runtime] if runtime else None,
                   optimizer=optimizer)
    if not found.fits and not found.too_big:
        raise ParsimError("no configuration can run this model on these GPUs")
    return found.fits, found.too_big
