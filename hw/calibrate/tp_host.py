"""What torch's DTensor costs the host per split weight matrix (HostCosts.tp_forward_s, tp_backward_s).

Every rank runs tiny stages (MLP blocks and Llama blocks of width 64, the GPU idle, so a span around an action is the
host's) twice: split over all ranks by hw's tensor-parallel runner, and whole on its own GPU by hw's runner. Depths
take turns, a step each per round. Per kind and op, the split stack's host time per layer over depth, less the whole
one's, is what DTensor adds per layer; over the layers' split matrices (parsim's `Split.matrices`: 2 in an MLP
block, 7 in a Llama one) it is the cost per matrix, one value for both kinds, which the check prints beside each.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np
import torch

from hw.calibrate.host import host_stage
from hw.run.observers import HostSpans
from hw.run.ranks import host_pinned, local_rank
from hw.run.stage_runner import Groups, local_runner, replica_batch
from hw.run.tensor_parallel import tp_groups, tp_hw_runner
from hw.timing import sync
from parsim.schedules import Op, gpipe
from parsim.workload import Model
from parsim.workload.models import transformer_model
from parsim.workload.tensor_parallel import Split, TensorParallel
from parsim.workload.transformer import TransformerShape

DEPTHS = (1, 2, 4)
MICROBATCHES = 4
ROUNDS, CPU_ROUNDS = 12, 3
WARMUP = 3
KINDS = ("mlp", "llama")
TINY_LLAMA = TransformerShape("llama", 64, 128, 8, 8, 8, 256, 8)  # splits up to 8 ways


def probe_model(kind: str, layers: int) -> Model:
    """`layers` tiny blocks of `kind`, one sample a micro-batch: host-bound on any GPU."""
    if kind == "mlp":
        return host_stage("mlp", layers, 8 * MICROBATCHES)
    return transformer_model(TINY_LLAMA, layers, MICROBATCHES)


def matrices(kind: str) -> int:
    """Split weight matrices in one block of `kind`, as parsim counts them."""
    block = probe_model(kind, 1).layers[1 if kind == "llama" else 0]  # a Llama model starts with its embedding
    return Split(block, TensorParallel(2)).matrices


def tp_host_worker(rank: int, world: int, device: torch.device, dtype: torch.dtype, rounds: int) -> list[dict]:
    """Rank 0's median host spans of forward and backward actions, split and whole, per kind and depth."""
    schedule = gpipe(1, MICROBATCHES)
    groups = Groups()
    runs = []
    for kind in KINDS:
        for k in DEPTHS:
            model = probe_model(kind, k)
            split, _, _ = tp_hw_runner(schedule, model, rank, device, dtype, tp_groups(schedule, groups, world))
            whole, io = local_runner(model, schedule, device, dtype)
            split_io = replica_batch(model, schedule, 0, 1, device, dtype)
            runs += [(kind, k, "split", split, split_io, HostSpans()), (kind, k, "whole", whole, io, HostSpans())]
    for _, _, _, runner, io, _ in runs:
        for _ in range(WARMUP):
            runner.step(io)
    sync(device)
    with host_pinned(device, local_rank(rank)):  # as hw measure times its steps
        for r in range(rounds):
            for run in runs[:: 1 if r % 2 else -1]:  # each round in the other order
                run[3].step(run[4], run[5])
            sync(device)
    return [{"kind": kind, "layers": k, "variant": variant, "forward_s": statistics.median(spans.of(Op.FORWARD)),
             "backward_s": statistics.median(spans.of(Op.BACKWARD))} for kind, k, variant, *_, spans in runs]


@dataclass(frozen=True)
class TpHost:
    """DTensor's host cost per split matrix, and per kind what it was read from (seconds per layer)."""

    forward_s: float
    backward_s: float
    per_kind: dict[str, dict[str, float]]


def fit_tp_host(rows: list[dict]) -> TpHost:
    """Per kind and op, the split stack's slope over depth less the whole one's; the sum over kinds over their split
    matrices is the cost per matrix (never below 0)."""
    per_kind: dict[str, dict[str, float]] = {}
    for kind in dict.fromkeys(r["kind"] for r in rows):
        extra = {}
        for op in ("forward_s", "backward_s"):
            slope = {}
            for variant in ("split", "whole"):
                mine = [r for r in rows if r["kind"] == kind and r["variant"] == variant]
                slope[variant] = float(np.polyfit([r["layers"] for r in mine], [r[op] for r in mine], 1)[0])
            extra[op] = slope["split"] - slope["whole"]
        per_kind[kind] = extra | {"matrices": matrices(kind)}
    total = sum(v["matrices"] for v in per_kind.values())
    per = {op: max(sum(v[op] for v in per_kind.values()) / total, 0.0) for op in ("forward_s", "backward_s")}
    return TpHost(per["forward_s"], per["backward_s"], per_kind)


def tp_host(world: int, cpu: bool) -> tuple[TpHost, list[dict]]:
    """DTensor's host cost per split matrix over `world` ranks (gloo processes on the CPU), and its raw rows."""
    from hw.run.ranks import spawn

    dtype = torch.float32 if cpu else torch.bfloat16
    rows = spawn(tp_host_worker, world, (dtype, CPU_ROUNDS if cpu else ROUNDS), "cpu" if cpu else "cuda",
                 timeout_s=120, deadline_s=300)[0]
    return fit_tp_host(rows), rows


def describe(fit: TpHost) -> str:
    """Calibrate's line: the cost per matrix and each kind's reading per layer."""
    kinds = "; ".join(f"{k} {v['forward_s'] * 1e6:.0f}/{v['backward_s'] * 1e6:.0f} us a layer ({v['matrices']:.0f} "
                      f"matrices)" for k, v in fit.per_kind.items())
    return (f"tp_host            DTensor per split matrix: forward {fit.forward_s * 1e6:.1f} us, backward "
            f"{fit.backward_s * 1e6:.1f} us (forward/backward: {kinds})")
