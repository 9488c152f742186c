"""The runtimes hw runs, by parsim's runtime name (parsim.runtimes): each builds one rank's runner for a job.

A runner factory takes (schedule, model, rank, device, dtype, made groups, data_parallel, copy_streams) and
returns (runner, its stage modules by stage index, its replica); the runner's `step(io, observe)` runs the
rank's part of one training step and returns the loss on the last stage. hw's own eager runner is
hw.run.stage_runner's StageRunner; hw.run.cuda_graphs' GraphRunner replays each action as a CUDA graph ("graphs"), or a
one-GPU step as one graph ("graphs-step"); hw.run.torch_stages steps torch.distributed.pipelining's own classes
("torch"). Under tensor parallelism (TP_RUNNERS) hw's runner and torch's step stages split over each pipeline
rank's processes (hw.run.tensor_parallel). A runner whose `pins_host` is False is timed with its host thread
unpinned: hw.run.ranks.host_pinned is how hw times its own runners, not how people run others.

The groups a runner gets are made on every rank before its job, as torch needs: hw's channel groups
(hw.run.stage_runner.replica_groups), or what the runtime registers in GROUPS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from hw.run.cuda_graphs import graphs_runner, step_graph_runner
from hw.run.stage_runner import Groups, StepIO, grad_of, replica_batch, replica_groups, replica_runner
from hw.run.tensor_parallel import refuse as refuse_tp
from hw.run.tensor_parallel import tp_groups, tp_hw_runner, tp_torch_runner, whole
from hw.run.torch_stages import refuse, torch_groups, torch_runner
from parsim.errors import ParsimError
from parsim.schedules import Action, Schedule
from parsim.workload import Model, stage_layers


class Runner(Protocol):
    """What runs one rank's part of a training step: hw's runners and torch's."""

    def step(self, io: StepIO, observe: Callable[[Action, str], None] | None = None) -> torch.Tensor | None: ...


# (schedule, model, rank, device, dtype, made groups, data_parallel, copy_streams) -> (runner, stages, replica)
RunnerFactory = Callable[..., tuple[Runner, dict[int, nn.Module], int]]

RUNNERS: dict[str, RunnerFactory] = {"hw": replica_runner, "torch": torch_runner, "graphs": graphs_runner,
                                     "graphs-step": step_graph_runner}
GROUPS: dict[str, Callable[[Schedule, Groups, int], object]] = {"torch": torch_groups}
REFUSALS: dict[str, Callable[[int, bool], None]] = {"torch": refuse}  # (data_parallel, copy_streams) -> error or None
# under tensor parallelism (hw.run.tensor_parallel): the runners over split stages; their groups are tp_groups'
TP_RUNNERS: dict[str, RunnerFactory] = {"hw": tp_hw_runner, "torch": tp_torch_runner}


def runner_factory(runtime: str, tensor_parallel: int = 1) -> RunnerFactory:
    """The runner factory of `runtime` (over stages split `tensor_parallel` ways), or one clear error naming those
    hw runs."""
    if runtime not in RUNNERS:
        raise ParsimError(f"hw cannot run the {runtime!r} runtime yet; it runs: {', '.join(RUNNERS)}")
    if tensor_parallel > 1 and runtime not in TP_RUNNERS:
        raise ParsimError(f"hw runs tensor parallelism under the {' and '.join(TP_RUNNERS)} runtimes, not {runtime} "
                          "(its CUDA graphs capture no collectives)")
    return TP_RUNNERS[runtime] if tensor_parallel > 1 else RUNNERS[runtime]


def job_groups(runtime: str, schedule: Schedule, groups: Groups, data_parallel: int = 1,
               tensor_parallel: int = 1) -> object:
    """The groups `runtime`'s runner of this job talks in; every rank makes them, in one order."""
    if tensor_parallel > 1:
        return tp_groups(schedule, groups, tensor_parallel)
    return GROUPS.get(runtime, replica_groups)(schedule, groups, data_parallel)


def check_runs(runtime: str, data_parallel: int = 1, copy_streams: bool = False, recompute: str = "never",
               tensor_parallel: int = 1) -> None:
    """One clear error, before anything starts, if hw cannot run `runtime` so."""
    runner_factory(runtime, tensor_parallel)
    if runtime in REFUSALS:
        REFUSALS[runtime](data_parallel, copy_streams)
    if recompute != "never" and runtime != "hw":
        raise ParsimError(f"--recompute runs on hw's runner only; the {runtime} runtime keeps every activation")
    if tensor_parallel > 1:
        refuse_tp(data_parallel, copy_streams, recompute)


def runner_options(runtime: str, recompute: str, early_recompute: bool | None = None) -> dict[str, str | bool]:
    """The keyword arguments beyond the common ones that `runtime`'s factory takes for a job (check_runs refuses
    the rest): hw's runner's recompute mode, and whether it recomputes early where that is not copy streams' say
    (hw.run.stage_runner.StageRunner)."""
    if runtime != "hw":
        return {}
    return {"recompute": recompute} | ({} if early_recompute is None else {"early_recompute": early_recompute})


def pins_host(runner: Runner) -> bool:
    """Whether hw times `runner` with its host thread pinned (its own runners; see the module docstring)."""
    return getattr(runner, "pins_host", True)


def _fail_after(n: int) -> Callable[[Action, str], None]:
    """An observer that raises once n actions have ended (fault injection for tests)."""
    done = iter(range(10**9))

    def observe(action: Action, phase: str) -> None:
        if phase == "end" and next(done) == n:
            raise RuntimeError(f"injected failure after {action}")

    return observe


@dataclass(frozen=True)
class RankGradients:
    """One rank's result of one pipelined step (gradient_step_worker), sent back to the parent pickled."""

    loss: torch.Tensor | None  # the step's loss on the rank of the last stage (its replica's share), else None
    grads: dict[str, torch.Tensor]  # each parameter's gradient (averaged over replicas) by global name: "layer.name"
    replica: int  # the pipeline replica this rank belongs to


def gradient_step_worker(rank: int, world: int, device: torch.device, schedule: Schedule, model: Model,
                         dtype: torch.dtype, fail_at: tuple[int, int] | None = None, data_parallel: int = 1,
                         runtime: str = "hw", recompute: str = "never", tensor_parallel: int = 1,
                         early_recompute: bool | None = None) -> RankGradients:
    """One pipelined step run by `runtime` (hw.run.runtimes), recomputing as `recompute` says (early or not as
    `early_recompute` says: hw's runner), each stage split over `tensor_parallel` ranks: this rank's loss (last stage,
    its replica's share) and its parameters' whole gradients (averaged over replicas; a split one gathered) by global
    name."""
    made = job_groups(runtime, schedule, Groups(), data_parallel, tensor_parallel)
    runner, stages, replica = runner_factory(runtime, tensor_parallel)(schedule, model, rank, device, dtype, made,
                                                                       data_parallel,
                                                                       **runner_options(runtime, recompute,
                                                                                        early_recompute))
    observe = _fail_after(fail_at[1]) if fail_at and fail_at[0] == rank else None
    loss = runner.step(replica_batch(model, schedule, replica, data_parallel, device, dtype), observe)
    layer_ids = stage_layers(model, schedule.num_stages)
    grads = {f"{layer_ids[s][k]}.{name}": whole(grad_of(p)).cpu()
             for s, module in stages.items() for k, layer in enumerate(module.children())
             for name, p in layer.named_parameters()}
    return RankGradients(None if loss is None else loss.cpu(), grads, replica)
