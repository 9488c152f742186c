"""torch.distributed.pipelining's own runtime run by hw: hw's stages in torch's PipelineStages, stepped by its classes.

The schedule is parsim's (parsim.runtimes.TORCH builds it as torch orders it); hw takes from it only the class
(CLASSES), the micro-batch count and which stages this rank hosts. Everything else (where messages are posted,
what waits on what, the host's loop) is torch's own, which is what parsim.runtimes.torch_pipelining models.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from hw.nets.blocks import loss_for
from hw.run.stage_runner import Groups, LossFn, StepIO, stage_modules
from parsim.errors import ParsimError
from parsim.runtimes.torch_pipelining import CLASSES
from parsim.schedules import Action, Op, Schedule, act
from parsim.workload import Model

if TYPE_CHECKING:
    from torch.distributed.pipelining import PipelineStage

Observe = Callable[[Action, str], None]


class TorchRunner:
    """One rank's stages as torch's PipelineStages, stepped by the torch schedule class `schedule` names.

    Each micro-batch's loss is hw's runner's (the model's loss, hw.nets.blocks.loss_for, times its share of the
    batch's rows), summed
    over micro-batches with torch's gradient scaling off, so the loss and every gradient equal one device's.
    """

    pins_host = False  # timed as people run it: hw's host-thread pinning (hw.run.ranks.host_pinned) is hw's runner's

    def __init__(self, schedule: Schedule, stages: dict[int, nn.Module], device: torch.device,
                 group: dist.ProcessGroup | None, loss_fn: LossFn = nn.functional.mse_loss):
        if schedule.name not in CLASSES:
            raise ParsimError(f"the torch runtime runs torch's schedule classes ({', '.join(CLASSES)}), "
                              f"not {schedule.name!r}")
        # imported here: torch.distributed.pipelining takes ~0.9 s to import, which every rank of every other
        # runtime (and every hw command) would pay
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

        cls = get_schedule_class(CLASSES[schedule.name])
        self.piped = [PipelineStage(stages[s], s, schedule.num_stages, device, group=group) for s in sorted(stages)]
        for stage in self.piped:
            _observe_computes(stage, self)
        self.observe: Observe | None = None
        self.loss_fn = loss_fn
        self.first, self.last = 0 in stages, schedule.num_stages - 1 in stages
        self.total_rows = 0
        ours = self.piped[0] if issubclass(cls, PipelineScheduleSingle) else self.piped
        self.torch_schedule = cls(ours, schedule.num_microbatches, loss_fn=self._loss, scale_grads=False)
        self._io: StepIO | None = None
        self._batch: tuple[torch.Tensor, torch.Tensor] | None = None

    def _loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """hw's runner's loss of one micro-batch, weighted by its share of the batch."""
        return self.loss_fn(output, target) * (output.shape[0] / self.total_rows)

    def _whole(self, io: StepIO) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole batch, as torch's step takes it (it splits it itself); joined once per StepIO."""
        if io is not self._io or self._batch is None:
            self._io, self._batch = io, (torch.cat(io.inputs), torch.cat(io.targets))
            self.total_rows = io.total_rows
        return self._batch

    def step(self, io: StepIO, observe: Observe | None = None) -> torch.Tensor | None:
        """One training step of this rank's stages; the step's loss on the rank of the last stage, else None.

        observe(action, "start" | "end") is called around each compute (forward, backward, input- and weight-grad).
        """
        x, y = self._whole(io)
        args = (x,) if self.first else ()
        losses: list[torch.Tensor] | None = [] if self.last else None
        kwargs = {"target": y, "losses": losses} if self.last else {}
        self.observe = observe
        try:
            self.torch_schedule.step(*args, **kwargs)
        finally:
            self.observe = None
            for stage in self.piped:  # the outputs step() merged and returned: a caller keeps what it needs of them
                stage.output_chunks.clear()
        return torch.stack(losses).detach().sum() if losses else None


def _observe_computes(stage: PipelineStage, runner: TorchRunner) -> None:
    """Wrap the stage's forward_one_chunk, backward_one_chunk and backward_weight_one_chunk so that each calls
    runner.observe around it, named as parsim names the action (F, B or I, W; stage; micro-batch)."""
    def wrap(name: str, op_of: Callable[[dict[str, Any]], str]) -> None:
        inner = getattr(stage, name)

        def call(chunk: int, *args: Any, **kwargs: Any) -> Any:
            observe = runner.observe
            if observe is None:
                return inner(chunk, *args, **kwargs)
            action = act(op_of(kwargs), stage.stage_index, chunk)
            observe(action, "start")
            out = inner(chunk, *args, **kwargs)
            observe(action, "end")
            return out

        setattr(stage, name, call)

    wrap("forward_one_chunk", lambda kwargs: Op.FORWARD)
    wrap("backward_one_chunk",
         lambda kwargs: Op.BACKWARD if kwargs.get("full_backward", True) else Op.BACKWARD_INPUT)
    wrap("backward_weight_one_chunk", lambda kwargs: Op.BACKWARD_WEIGHT)


def torch_groups(schedule: Schedule, groups: Groups, data_parallel: int = 1) -> dist.ProcessGroup | None:
    """The group torch's stages talk in: the default one where the job takes the whole world, else its ranks'.

    Every rank makes it, taking part or not, as torch needs (hw's jobs_worker runs jobs of several sizes in
    one world).
    """
    ranks = schedule.num_ranks * data_parallel
    return None if ranks == dist.get_world_size() else groups(tuple(range(ranks)))


def torch_runner(schedule: Schedule, model: Model, rank: int, device: torch.device, dtype: torch.dtype,
                 made: dist.ProcessGroup | None, data_parallel: int = 1, copy_streams: bool = False,
                 ) -> tuple[TorchRunner, dict[int, nn.Module], int]:
    """This rank's TorchRunner, its stages (the same modules and weights as hw's runner's) and its replica (0)."""
    refuse(data_parallel, copy_streams)
    stages = stage_modules(model, schedule, rank, device, dtype)
    return TorchRunner(schedule, stages, device, made, loss_for(model)), stages, 0


def refuse(data_parallel: int, copy_streams: bool) -> None:
    """One clear error for what hw does not run with torch's runtime."""
    if data_parallel > 1:
        raise ParsimError("the torch runtime runs one pipeline; --data-parallel applies to hw's runner")
    if copy_streams:
        raise ParsimError("--copy-streams is hw's runner's; the torch runtime posts its messages itself")
