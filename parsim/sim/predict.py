"""Predicts one training step: simulate the schedule, then read step time, bubble and memory off it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING

from parsim.budget import check_actions, stages_per_rank
from parsim.errors import ParsimError, ProfileError
from parsim.profile import Profile
from parsim.runtimes import get_runtime
from parsim.runtimes.base import Runtime
from parsim.schedules import SCHEDULES, Action, Schedule, check_layout, gpipe
from parsim.sim.collector import gc_paused
from parsim.sim.grad_allreduce import add_gradient_allreduce, gradient_buckets
from parsim.sim.longest_path import Settled, replicas_alike, settle_step
from parsim.sim.lower import OpTable, compute_track, finish_step, kept_stash_bytes, lower, peak_held_bytes
from parsim.sim.sharing import (
    EarlyWaits,
    Observed,
    Slower,
    early_receives,
    early_waits,
    machine_observed,
    settle_sharing,
    waiting,
)
from parsim.sim.slowest import at_slowest_pace
from parsim.workload import (
    Model,
    StageCost,
    check_stages,
    kind_priced,
    microbatch_tokens,
    poor_fits,
    stage_costs,
    stand_ins,
)
from parsim.workload.tensor_parallel import NONE, TensorParallel, split_model, whole_nodes
from parsim.workload.timed import priced, timed_elsewhere

if TYPE_CHECKING:  # the machine model loads where a step is lowered onto it (lowered_machine): the walk needs none
    from parsim.sim.machine import HostThread, Machine, Task


@dataclass(frozen=True)
class GpuReport:
    rank: int
    stages: tuple[int, ...]
    busy_s: float  # time its compute stream runs kernels
    bubble_fraction: float  # 1 - busy_s / step_time_s
    peak_activation_bytes: int


@dataclass(frozen=True)
class Prediction:
    schedule: str
    gpus: int  # all of them: pipeline stages' GPUs times data-parallel replicas
    microbatches: int
    model: str
    step_time_s: float
    single_gpu_step_s: float
    tokens: int
    per_gpu: tuple[GpuReport, ...]
    profile: str
    data_parallel: int = 1
    sample: str = "token"  # what `tokens` counts: "token", or "image" for a conv net
    runtime: str = "hw"  # what ran the step (parsim.runtimes); the single-GPU baseline is always eager
    recompute: str = "never"  # which micro-batches' forwards run again (parsim.workload.recompute)
    tensor_parallel: int = 1  # GPUs per pipeline rank, splitting each layer; per_gpu has one row per such group
    sequence_parallel: bool = False

    @property
    def speedup(self) -> float:
        return self.single_gpu_step_s / self.step_time_s

    @property
    def throughput_tokens_per_s(self) -> float:
        return self.tokens / self.step_time_s

    @property
    def bubble_fraction(self) -> float:
        """Idle share of all GPUs' compute time over the step."""
        busy = sum(g.busy_s for g in self.per_gpu)  # a tensor-parallel group's GPUs are alike: one row each
        return 1.0 - busy / (len(self.per_gpu) * self.step_time_s)


@dataclass(frozen=True)
class Simulation:
    """The simulated step: its length and each GPU's busy time; every op and host launch with its times, for
    timelines, from the event-driven machine (run when first asked for, where the step was settled without it)."""

    step_time_s: float
    busy_s: tuple[float, ...]  # per GPU: time its compute stream runs kernels
    run_machine: Callable[[], Machine] = field(repr=False, compare=False)

    @cached_property
    def machine(self) -> Machine:
        return self.run_machine()

    @property
    def ops(self) -> list[Task]:
        return [op for s in self.machine.streams.values() for op in s.ops]

    @property
    def hosts(self) -> list[HostThread]:
        return self.machine.hosts

    @property
    def host_spans(self) -> dict[str, list[tuple[Task, float, float]]]:
        """Host name -> (op, start, end) of each launch: built when a timeline asks for it."""
        return {h.name: h.spans() for h in self.hosts}


ENGINES = ("auto", "longest-path", "events")  # simulate's: the walk where it applies, else the machine; or one


class StepAbove(Exception):
    """The step is no shorter than `floor_s`, which the caller's give_up said rules it out: not settled further."""

    def __init__(self, floor_s: float) -> None:
        super().__init__(floor_s)
        self.floor_s = floor_s


def simulate(schedule: Schedule, costs: list[StageCost], profile: Profile,
             copy_streams: bool = False, data_parallel: int = 1, engine: str = "auto",
             give_up: Callable[[float], bool] | None = None, recompute: str = "never") -> Simulation:
    """Run one step of `schedule` with per-stage `costs` on the machine `profile` describes,
    on `data_parallel` replicas of the pipeline whose gradients are all-reduced.

    The step is settled by one longest-path pass (parsim.sim.longest_path) where no link is shared, else on
    the event-driven machine; both give the same times, to the bit. `engine` forces one, for tests
    ("longest-path" raises where it does not apply). Where receives wait beside compute and the profile says
    that slows it, the step is settled again until the slowdowns agree (parsim.sim.sharing), on the walk where it
    applies; there the first settlement (no slowdown) is a floor under the step (slowing an op delays nothing
    earlier: max-plus, and rounding is monotone), and where `give_up(floor)` is true, StepAbove is raised instead.
    `recompute`: which backwards run their forward again (parsim.workload.recompute). The schedule is validated
    (check.validate) where the walk does not vouch for it (settle_step's check).
    """
    with gc_paused():
        try:
            return _simulated(schedule, costs, profile, copy_streams, data_parallel, engine, give_up, recompute)
        except (ParsimError, StepAbove):  # a schedule error named, or a profile's: as they are
            raise
        except Exception:  # what an invalid schedule can break before it is validated: named by validate if so
            _validate(schedule, copy_streams)
            raise


def _validate(schedule: Schedule, copy_streams: bool, order: bool = False) -> None:
    """check.validate as simulate needs it: deadlocks are found by the simulation itself, and channel order too unless
    `order` (checked after the rest). Loaded here: a step the walk vouches for needs no check."""
    from parsim.sim.check import check_channel_order, validate

    validate(schedule, copy_streams, check_deadlock=False, check_order=False)
    if order:
        check_channel_order(schedule)


def _simulated(schedule: Schedule, costs: list[StageCost], profile: Profile, copy_streams: bool, data_parallel: int,
               engine: str, give_up: Callable[[float], bool] | None, recompute: str) -> Simulation:
    """simulate's step: on the walk where it vouches for the schedule, else validated first."""
    check_layout(schedule)
    buckets = gradient_buckets(costs) if data_parallel > 1 else None
    gpus = schedule.num_ranks * data_parallel

    copies = data_parallel if engine != "events" and replicas_alike(profile, schedule, data_parallel) else 1

    def lowered(slower: Slower | None = None, walked: int | None = None) -> tuple[Machine, OpTable]:
        return lowered_machine(schedule, costs, profile, copy_streams, data_parallel, buckets, slower, walked,
                               recompute)

    def run_machine() -> Machine:
        return lowered()[0]

    rate = profile.resident_comm.rate if profile.resident_comm is not None else 1.0
    early = early_receives(schedule) if rate < 1 else None
    if early:
        _validate(schedule, copy_streams, order=True)
        walked = _settle_sharing_walked(schedule, costs, profile, copy_streams, data_parallel, buckets, early,
                                        rate, give_up, recompute) if engine != "events" else None
        if walked is not None:
            step, slower = walked
            return Simulation(step.step_time_s, step.busy_s, lambda: lowered(slower)[0])
        if engine == "longest-path":
            raise ValueError("the longest-path pass does not apply to this step (a shared link, or a deadlock)")
        waits = early_waits(schedule, early, copy_streams)
        machine, slower = settle_sharing(
            lambda slow: _observed_machine(lowered(slow, data_parallel // copies), schedule, early, waits), rate)
        return _simulation(machine, gpus, lambda: lowered(slower)[0], copies)
    settled = settle_step(schedule, costs, profile, copy_streams, data_parallel, buckets, recompute=recompute,
                          check=True) if engine != "events" else None
    if settled is not None:
        return Simulation(settled.step_time_s, settled.busy_s, run_machine)
    _validate(schedule, copy_streams, order=True)  # the walk may have stopped at messages out of order: named here
    if engine == "longest-path":
        raise ValueError("the longest-path pass does not apply to this step (a shared link, or a deadlock)")
    return _simulation(lowered(None, data_parallel // copies)[0], gpus, run_machine, copies)


def _observed_machine(run: tuple[Machine, OpTable], schedule: Schedule, early: frozenset[Action],
                      waits: EarlyWaits) -> tuple[Machine, Observed]:
    """A settlement on the event-driven machine, with what parsim.sim.sharing reads off it."""
    machine, table = run
    return machine, machine_observed(schedule, machine, table, early, waits)


def _settle_sharing_walked(schedule: Schedule, costs: list[StageCost], profile: Profile, copy_streams: bool,
                           data_parallel: int, buckets: dict[int, int] | None, early: frozenset[Action], rate: float,
                           give_up: Callable[[float], bool] | None = None, recompute: str = "never",
                           ) -> tuple[Settled, Slower] | None:
    """parsim.sim.sharing's rounds on the longest-path walk (the machine's times, to the bit, far sooner); None
    where the walk does not apply."""
    first = settle_step(schedule, costs, profile, copy_streams, data_parallel, buckets, observe=True,
                        recompute=recompute)
    if first is None:
        return None
    if give_up is not None and give_up(first.step_time_s):
        raise StepAbove(first.step_time_s)
    waits = early_waits(schedule, early, copy_streams)

    def run(slower: Slower) -> tuple[Settled, Observed]:
        settled = settle_step(schedule, costs, profile, copy_streams, data_parallel, buckets, slower, observe=True,
                              recompute=recompute) if slower else first
        if settled is None:
            raise _WalkStopped
        ends = settled.ends[0]
        windows = waiting(waits, settled.posted, lambda d: ends[d[0]][d[1]][d[2]])
        return settled, (list(settled.computes), windows)

    try:
        return settle_sharing(run, rate)
    except _WalkStopped:  # not expected (lengthened computes change no order the walk follows): the machine's
        return None


class _WalkStopped(Exception):
    """A round of the sharing loop that the walk could not settle."""


def _simulation(machine: Machine, gpus: int, run_machine: Callable[[], Machine], copies: int = 1) -> Simulation:
    """The Simulation of a machine already run: of all `gpus`, or of the first 1 / `copies` of them where those
    stand for the rest (their timeline then runs every replica, when asked for)."""
    busy = {compute_track(g): 0.0 for g in range(gpus // copies)}
    for stream in machine.streams.values():
        if stream.name in busy:
            for op in stream.ops:
                busy[stream.name] += op.end_s - op.start_s
    ends = [h.finished_at for h in machine.hosts if h.finished_at is not None]  # all of them: it ran to the end
    sim = Simulation(max(ends, default=0.0), tuple(busy.values()) * copies, run_machine)
    if copies == 1:
        sim.__dict__["machine"] = machine  # already run: cached_property's slot
    return sim


def lowered_machine(schedule: Schedule, costs: list[StageCost], profile: Profile, copy_streams: bool,
                     data_parallel: int, buckets: dict[int, int] | None, slower: Slower | None = None,
                     walked: int | None = None, recompute: str = "never") -> tuple[Machine, OpTable]:
    """The step lowered onto the event-driven machine (its computes lengthened by `slower`) and run; with the
    first replica's op table. `walked`: the replicas lowered (default all; 1 where the first stands for alike
    ones, parsim.sim.longest_path.replicas_alike)."""
    from parsim.sim.machine import Machine

    with gc_paused():
        machine = Machine()
        replicas = [lower(machine, schedule, costs, profile, copy_streams, r * schedule.num_ranks, buckets, slower,
                          recompute) for r in range(walked or data_parallel)]
        if data_parallel > 1:
            assert buckets is not None, "several replicas all-reduce their gradients by bucket"
            add_gradient_allreduce(machine, schedule, costs, profile, replicas, buckets, data_parallel)
        finish_step(machine, profile.host.step_s, profile.host.begin_s)
        machine.run()
    return machine, replicas[0].ops


def single_gpu_step_s(model: Model, profile: Profile) -> float:
    """The same model and batch on one GPU, one forward and one backward, no micro-batching."""
    return simulate(gpipe(1, 1), stage_costs(replace(model, balance=None), 1, 1, profile), profile).step_time_s


def check_sizes(model: Model, schedule: str, num_ranks: int, microbatches: int, virtual_stages: int | None = None,
                data_parallel: int = 1) -> None:
    """What building `schedule` would find wrong, found first and cheaply: a batch that does not split evenly, more
    stages than layers (for parsim's own schedules: a torch one's stages are known once it is read), a step past
    what parsim simulates (parsim.budget). A large schedule takes seconds to build; these take microseconds."""
    microbatch_tokens(model, microbatches, data_parallel)
    if schedule.lower() in SCHEDULES:
        check_stages(len(model.layers), num_ranks * stages_per_rank(schedule, virtual_stages))
    check_actions(schedule, num_ranks * data_parallel, microbatches, virtual_stages)


def predict(schedule: Schedule, model: Model, profile: Profile, copy_streams: bool = False,
            data_parallel: int = 1, runtime: Runtime | None = None, recompute: str = "never",
            ) -> tuple[Prediction, Simulation]:
    """Predict the step of `model` under a built `schedule` (on each of `data_parallel` replicas), run by `runtime`
    (default hw's eager runner), with the simulation behind the numbers. parsim.configuration.predict builds the
    schedule and splits the model too."""
    profile = priced(profile, model.layers)
    run_profile = runtime.costs(profile) if runtime is not None else profile
    return predict_schedule(schedule, model, profile, run_profile, copy_streams, data_parallel,
                            runtime.name if runtime is not None else "hw", recompute=recompute)


def predict_schedule(schedule: Schedule, model: Model, profile: Profile, run_profile: Profile, copy_streams: bool,
                     data_parallel: int, runtime: str, give_up: Callable[[float], bool] | None = None,
                     recompute: str = "never", tp: TensorParallel = NONE) -> tuple[Prediction, Simulation]:
    """predict, with the profile already converted to the runtime's costs (`run_profile`: with tensor parallelism,
    its view of TP groups as GPUs, parsim.workload.tensor_parallel.tp_view); `profile` prices the one-GPU
    baseline of the whole `model`, which hw's eager runner runs. Several ranks' hosts run at the slowest one's
    pace (parsim.sim.slowest); each pipeline rank is `tp.degree` GPUs, which the step waits for as well."""
    run_profile = at_slowest_pace(run_profile, schedule.num_ranks * data_parallel * tp.degree)
    with gc_paused():  # a collection over the simulation's millions of objects would cost seconds
        costs = stage_costs(split_model(model, tp), schedule.num_stages, schedule.num_microbatches, run_profile,
                            data_parallel)
        sim = simulate(schedule, costs, run_profile, copy_streams, data_parallel, give_up=give_up, recompute=recompute)
        single_s = single_gpu_step_s(model, profile)
        for name, value in (("step time", sim.step_time_s), ("one-GPU step time", single_s)):
            # a profile loaded from a file is range-checked: not from there
            if not (math.isfinite(value) and value > 0):
                raise ProfileError(f"the profile ({run_profile.describe()}) gives {model.name} a {name} of {value} s; "
                                   "one of its costs or rates is out of range")
        gpus = schedule.num_ranks * data_parallel
        busy = sim.busy_s
        runs = get_runtime(runtime)
        if runs.graphed:  # the graphs' pool and static buffers
            from parsim.workload.graph_memory import graphed_activation_bytes

            held = graphed_activation_bytes(model, schedule, data_parallel, recompute)
        else:
            kept = [i + c.loss_bytes for i, c in zip([0, *(c.send_bytes for c in costs[:-1])], costs, strict=True)]
            held = peak_held_bytes(schedule, [kept_stash_bytes(c, recompute) for c in costs], recompute, kept,
                                   costs[-1].send_bytes if runs.keeps_outputs else 0)
        per_gpu = []
        for g in range(gpus):
            rank = g % schedule.num_ranks
            stages = tuple(s for s, owner in enumerate(schedule.stage_to_rank) if owner == rank)
            per_gpu.append(GpuReport(g, stages, busy[g], 1.0 - busy[g] / sim.step_time_s, held[rank]))
        prediction = Prediction(schedule.name, gpus * tp.degree, schedule.num_microbatches, model.name,
                                sim.step_time_s, single_s, model.tokens,
                                tuple(per_gpu), "; ".join([whole_nodes(run_profile, tp).describe(),
                                                           *stand_ins(model, run_profile),
                                                           *poor_fits(model, run_profile),
                                                           *kind_priced(model, run_profile),
                                                           *timed_elsewhere(model.layers, run_profile)]),
                                data_parallel, model.sample, runtime, recompute, tp.degree, tp.sequence)
        return prediction, sim
