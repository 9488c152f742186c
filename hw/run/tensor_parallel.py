"""Tensor parallelism in hw: each pipeline rank is a group of t processes splitting its stages' layers with torch's
tensor-parallel API (parallelize_module, PLANS) on a 1-D DeviceMesh of its TP group, TP innermost as parsim lays ranks
out (parsim.configuration.Configuration), as parsim.workload.tensor_parallel models it: an MLP block's fc1
column-parallel and fc2 row-parallel; a Llama block's q, k, v, gate and up column-parallel, its o and down
row-parallel (heads / t per process); the embedding vocab-parallel (RowwiseParallel on nn.Embedding) and the head
vocab-parallel, its cross-entropy on the sharded logits under torch's loss_parallel. Norms are replicated.

Global rank g = pipeline rank x t + TP index (one replica: hw does not combine data and tensor parallelism yet).
Every rank of a TP group takes the whole batch. Messages between pipeline ranks go from TP index i to TP index i of
the next rank (each holds the whole activation: no sequence parallelism here), on hw's runner; torch's runtime
(PipelineStage) talks in the group of the pipeline's ranks at its TP index.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    loss_parallel,
    parallelize_module,
)

from hw.nets.blocks import MlpBlock, loss_for
from hw.nets.transformer import LlamaBlock, LMHead, TokenEmbedding
from hw.run.stage_runner import Groups, StageRunner, StepIO, channel_groups, stage_modules
from hw.run.torch_stages import TorchRunner
from hw.run.torch_stages import refuse as refuse_torch
from parsim.errors import ParsimError
from parsim.schedules import Action, Schedule
from parsim.workload import Head, Model


def place(rank: int, num_ranks: int, t: int) -> tuple[int, int, int]:
    """(replica, pipeline rank, TP index) of global `rank`: TP innermost, then pipeline, then data parallel."""
    group, index = divmod(rank, t)
    replica, q = divmod(group, num_ranks)
    return replica, q, index


@dataclass(frozen=True)
class TpGroups:
    """The groups of one pipeline whose ranks are TP groups of `degree` processes; every rank makes them all."""

    degree: int
    tp: dict[int, dist.ProcessGroup]  # pipeline rank -> its TP group's
    channels: dict[int, dict[tuple[int, int], dist.ProcessGroup]]  # TP index -> hw's channel groups at that index
    pipes: dict[int, dist.ProcessGroup]  # TP index -> the pipeline's ranks at that index (torch's runtime)


def tp_groups(schedule: Schedule, groups: Groups, t: int) -> TpGroups:
    """Every group a TP job of `schedule` over t-process ranks talks in, made in one order on every rank."""
    p = schedule.num_ranks
    tp = {q: groups(tuple(range(q * t, (q + 1) * t))) for q in range(p)}
    channels = {i: channel_groups(schedule, groups, i, t) for i in range(t)}
    pipes = {i: groups(tuple(range(i, p * t, t))) for i in range(t)}
    return TpGroups(t, tp, channels, pipes)


def _llama_plan() -> dict[str, ParallelStyle]:
    return {**{name: ColwiseParallel() for name in ("wq", "wk", "wv", "gate", "up")},
            "wo": RowwiseParallel(), "down": RowwiseParallel()}


# each layer module's split: submodule name -> torch's style (a fresh plan per module)
PLANS: dict[type[nn.Module], Callable[[], dict[str, ParallelStyle]]] = {
    MlpBlock: lambda: {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()},
    LlamaBlock: _llama_plan,
    TokenEmbedding: lambda: {"tokens": RowwiseParallel(input_layouts=Replicate())},  # rows of the vocabulary
    LMHead: lambda: {"out": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)},  # logits by vocab
}
SPLIT_KINDS = ("mlp", "llama", "embed", "head")  # parsim's layer kinds hw splits (PLANS' modules)


def parallelize_stage(stage: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """Each layer of `stage` split over the 1-D mesh `mesh` as PLANS says (Megatron's column- then row-parallel
    linears, the embedding and head by vocabulary)."""
    for layer in stage.children():
        if type(layer) not in PLANS:
            raise ParsimError(f"hw does not split {type(layer).__name__} over tensor-parallel ranks")
        parallelize_module(layer, mesh, PLANS[type(layer)]())
    return stage


def split_stages(model: Model, schedule: Schedule, rank: int, device: torch.device, dtype: torch.dtype,
                 made: TpGroups) -> tuple[dict[int, nn.Module], int, int]:
    """Global `rank`'s stages split over its TP group's mesh, its pipeline rank and TP index."""
    check_model(model)
    _, q, index = place(rank, schedule.num_ranks, made.degree)
    mesh = DeviceMesh.from_group(made.tp[q], device.type, mesh_dim_names=("tp",))
    stages = {s: parallelize_stage(m, mesh) for s, m in stage_modules(model, schedule, q, device, dtype).items()}
    return stages, q, index


def check_model(model: Model, runtime: str = "hw") -> None:
    """One clear error for a model hw does not split over tensor-parallel ranks yet (under torch's runtime: MLP
    stacks only, its loss not being run under loss_parallel)."""
    kinds = sorted({layer.kind for layer in model.layers} - set(SPLIT_KINDS if runtime == "hw" else ("mlp",)))
    if kinds:
        runs = "MLP stacks and Llama transformers" if runtime == "hw" else "MLP stacks"
        raise ParsimError(f"hw runs tensor parallelism under the {runtime} runtime on {runs}; this model has "
                          f"{', '.join(kinds)} layers")


class LossParallelRunner:
    """hw's runner over a vocab-parallel head: each step under torch's loss_parallel (the cross-entropy of the
    sharded logits, forward and backward), its loss whole."""

    def __init__(self, runner: StageRunner):
        self.runner = runner

    def step(self, io: StepIO, observe: Callable[[Action, str], None] | None = None) -> torch.Tensor | None:
        with loss_parallel():
            loss = self.runner.step(io, observe)
        return None if loss is None else whole(loss)


def refuse(data_parallel: int, copy_streams: bool, recompute: str = "never") -> None:
    """One clear error for what hw does not run under tensor parallelism."""
    if data_parallel > 1:
        raise ParsimError("hw runs tensor parallelism on one pipeline replica; --data-parallel with "
                          "--tensor-parallel is predicted by parsim only")
    if recompute != "never":
        raise ParsimError("hw does not recompute tensor-parallel stages; --recompute needs --tensor-parallel 1")


def tp_hw_runner(schedule: Schedule, model: Model, rank: int, device: torch.device, dtype: torch.dtype,
                 made: TpGroups, data_parallel: int = 1, copy_streams: bool = False, recompute: str = "never",
                 ) -> tuple[StageRunner | LossParallelRunner, dict[int, nn.Module], int]:
    """Global `rank`'s hw runner over its stages split t ways (under loss_parallel where the model ends in a
    head), its stages and its replica (0)."""
    refuse(data_parallel, copy_streams, recompute)
    stages, q, index = split_stages(model, schedule, rank, device, dtype, made)
    runner = StageRunner(schedule, q, stages, made.channels[index], loss_for(model), offset=index, stride=made.degree,
                         copy_streams=copy_streams)
    return (LossParallelRunner(runner) if isinstance(model.layers[-1], Head) else runner), stages, 0


def tp_torch_runner(schedule: Schedule, model: Model, rank: int, device: torch.device, dtype: torch.dtype,
                    made: TpGroups, data_parallel: int = 1, copy_streams: bool = False,
                    ) -> tuple[TorchRunner, dict[int, nn.Module], int]:
    """Global `rank`'s stages split t ways in torch's PipelineStages on its TP index's pipeline group."""
    refuse_torch(data_parallel, copy_streams)
    check_model(model, "torch")
    stages, _, index = split_stages(model, schedule, rank, device, dtype, made)
    return TorchRunner(schedule, stages, device, made.pipes[index], loss_for(model)), stages, 0


def whole(g: torch.Tensor) -> torch.Tensor:
    """A tensor as the unsplit model holds it: a DTensor's gathered, a plain one as it is."""
    return g.full_tensor() if isinstance(g, DTensor) else g


def local(t: torch.Tensor) -> torch.Tensor:
    """The part of a tensor this process holds: a DTensor's local shard, a plain one itself."""
    return t.to_local() if isinstance(t, DTensor) else t
