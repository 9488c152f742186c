"""The runtimes hw runs, by parsim's runtime name (parsim.runtimes): each builds one rank's runner for a job.

A runner factory takes (schedule, model, rank, device, dtype, made groups, data_parallel, copy_streams) and
returns (runner, its stage modules by stage index, its replica); the runner's `step(io, observe)` runs the
rank's part of one training step and returns the loss on the last stage. hw's own eager runner is
hw.executor's StageRunner; hw.graphs' GraphRunner replays each action as a CUDA graph ("graphs"), or a
one-GPU step as one graph ("graphs-step"); hw.torch_runner steps torch.distributed.pipelining's own classes
("torch"). A runner whose `pins_host` is False is timed with its host thread unpinned: hw.workers.host_pinned
is how hw times its own runners, not how people run others.

The groups a runner gets are made on every rank before its job, as torch needs: hw's channel groups
(hw.executor.replica_groups), or what the runtime registers in GROUPS.
"""

from __future__ import annotations

from collections.abc import Callable

from hw.executor import Groups, replica_groups, replica_runner
from hw.graphs import graphs_runner, step_graph_runner
from hw.torch_runner import refuse, torch_groups, torch_runner
from parsim.errors import ParsimError
from parsim.schedules import Schedule

RunnerFactory = Callable[..., tuple]

RUNNERS: dict[str, RunnerFactory] = {"hw": replica_runner, "torch": torch_runner, "graphs": graphs_runner,
                                     "graphs-step": step_graph_runner}
GROUPS: dict[str, Callable[[Schedule, Groups, int], object]] = {"torch": torch_groups}
REFUSALS: dict[str, Callable[[int, bool], None]] = {"torch": refuse}  # (data_parallel, copy_streams) -> error or None


def runner_factory(runtime: str) -> RunnerFactory:
    """The runner factory of `runtime`, or one clear error naming those hw runs."""
    if runtime not in RUNNERS:
        raise ParsimError(f"hw cannot run the {runtime!r} runtime yet; it runs: {', '.join(RUNNERS)}")
    return RUNNERS[runtime]


def job_groups(runtime: str, schedule: Schedule, groups: Groups, data_parallel: int = 1) -> object:
    """The groups `runtime`'s runner of this job talks in; every rank makes them, in one order."""
    return GROUPS.get(runtime, replica_groups)(schedule, groups, data_parallel)


def check_runs(runtime: str, data_parallel: int = 1, copy_streams: bool = False) -> None:
    """One clear error, before anything starts, if hw cannot run `runtime` so."""
    runner_factory(runtime)
    if runtime in REFUSALS:
        REFUSALS[runtime](data_parallel, copy_streams)


def pins_host(runner) -> bool:
    """Whether hw times `runner` with its host thread pinned (its own runners; see the module docstring)."""
    return getattr(runner, "pins_host", True)
