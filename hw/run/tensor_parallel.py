"""Tensor parallelism in hw: each pipeline rank is a group of t processes splitting its stages' MLP blocks with torch's
tensor-parallel API (parallelize_module: fc1 ColwiseParallel, fc2 RowwiseParallel; the layernorm replicated), on a
3-D DeviceMesh (dp, pp, tp), TP innermost as parsim lays ranks out (parsim.configuration.Configuration).

Global rank g = (replica x P + pipeline rank) x t + TP index. Messages between pipeline ranks go from TP index i to
TP index i of the next rank (each holds the whole activation: no sequence parallelism here), on hw's runner.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from hw.nets.blocks import MlpBlock, loss_for
from hw.run.runtimes import RankGradients
from hw.run.stage_runner import Groups, StageRunner, channel_groups, grad_of, replica_batch, stage_modules
from parsim.errors import ParsimError
from parsim.schedules import Schedule
from parsim.workload import Model, stage_layers


def place(rank: int, num_ranks: int, t: int) -> tuple[int, int, int]:
    """(replica, pipeline rank, TP index) of global `rank`: TP innermost, then pipeline, then data parallel."""
    group, index = divmod(rank, t)
    replica, q = divmod(group, num_ranks)
    return replica, q, index


def tp_mesh(device: torch.device, data_parallel: int, num_ranks: int, t: int) -> DeviceMesh:
    """The (dp, pp, tp) mesh of every rank; every process makes it, as torch needs."""
    return init_device_mesh(device.type, (data_parallel, num_ranks, t), mesh_dim_names=("dp", "pp", "tp"))


def parallelize_stage(stage: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """Each MLP block of `stage` split over the 1-D mesh `mesh` (Megatron's column- then row-parallel linears)."""
    plan = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    for block in stage.children():
        if not isinstance(block, MlpBlock):
            raise ParsimError(f"hw splits MLP blocks over tensor-parallel ranks, not {type(block).__name__}")
        parallelize_module(block, mesh, plan)
    return stage


def tp_runner(schedule: Schedule, model: Model, rank: int, device: torch.device, dtype: torch.dtype, t: int,
              data_parallel: int = 1) -> tuple[StageRunner, dict[int, nn.Module], int]:
    """This rank's hw runner over its stages split t ways, and its replica (one step's gradients are not averaged
    over replicas here). Makes every group and the mesh in one order on every rank."""
    p = schedule.num_ranks
    groups = Groups()
    channels = {(r, i): channel_groups(schedule, groups, r * p * t + i, t) for r in range(data_parallel)
                for i in range(t)}
    mesh = tp_mesh(device, data_parallel, p, t)
    replica, q, index = place(rank, p, t)
    stages = {s: parallelize_stage(m, mesh["tp"]) for s, m in stage_modules(model, schedule, q, device, dtype).items()}
    runner = StageRunner(schedule, q, stages, channels[replica, index], loss_for(model), offset=replica * p * t + index,
                         stride=t)
    return runner, stages, replica


def whole(g: torch.Tensor) -> torch.Tensor:
    """A gradient as the unsplit model holds it: a DTensor's gathered, a replicated one's as it is."""
    return g.full_tensor() if isinstance(g, DTensor) else g


def tp_gradient_worker(rank: int, world: int, device: torch.device, schedule: Schedule, model: Model,
                       dtype: torch.dtype, t: int) -> RankGradients:
    """One step on hw's runner with tensor parallelism of `t`: this rank's loss (last stage) and its stages'
    gradients, gathered whole, by global name ("layer.name")."""
    runner, stages, replica = tp_runner(schedule, model, rank, device, dtype, t)
    loss = runner.step(replica_batch(model, schedule, replica, 1, device, dtype))
    layer_ids = stage_layers(model, schedule.num_stages)
    grads = {f"{layer_ids[s][k]}.{name}": whole(grad_of(p)).cpu()
             for s, module in stages.items() for k, layer in enumerate(module.children())
             for name, p in layer.named_parameters()}
    return RankGradients(None if loss is None else loss.cpu(), grads, replica)
