"""The runtimes hw runs, by parsim's runtime name (parsim.runtimes): each builds one rank's runner for a job.

A runner factory takes (schedule, model, rank, device, dtype, made groups, data_parallel, copy_streams) and
returns (runner, its stage modules by stage index, its replica); the runner's `step(io, observe)` runs the
rank's part of one training step and returns the loss on the last stage. hw's own eager runner is
hw.executor's StageRunner; hw.graphs' GraphRunner replays each action as a CUDA graph ("graphs"), or a
one-GPU step as one graph ("graphs-step"); other runtimes register here.
"""

from __future__ import annotations

from collections.abc import Callable

from hw.executor import replica_runner
from hw.graphs import graphs_runner, step_graph_runner
from parsim.errors import ParsimError

RunnerFactory = Callable[..., tuple]

RUNNERS: dict[str, RunnerFactory] = {"hw": replica_runner, "graphs": graphs_runner, "graphs-step": step_graph_runner}


def runner_factory(runtime: str) -> RunnerFactory:
    """The runner factory of `runtime`, or one clear error naming those hw runs."""
    if runtime not in RUNNERS:
        raise ParsimError(f"hw cannot run the {runtime!r} runtime yet; it runs: {', '.join(RUNNERS)}")
    return RUNNERS[runtime]
