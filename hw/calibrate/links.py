"""Links: host<->device copies, NCCL send/recv between GPUs, all-reduce, and compute beside an all-reduce."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from hw.calibrate.fit import Fit, fit_affine
from hw.run.ranks import host_pinned, local_rank
from hw.timing import median_s, sync
from parsim.profile import CollectiveSpec, LinkSpec
from parsim.sim.grad_allreduce import DDP_BUCKET_BYTES
from parsim.workload import mlp_model


def copy_links(device: torch.device, sizes: list[int]) -> tuple[dict[str, LinkSpec], dict[str, Fit], dict]:
    """Latency and bandwidth of copies to and from pinned and pageable host memory."""
    links, fits, samples = {}, {}, {}
    for pinned in (True, False):
        for direction in ("h2d", "d2h"):
            name = f"{direction}_{'pinned' if pinned else 'pageable'}"
            rows = [{"bytes": n, "seconds": _copy_s(device, n, pinned, direction)} for n in sizes]
            fit = fit_affine([r["bytes"] for r in rows], [r["seconds"] for r in rows])
            links[name], fits[name], samples[name] = LinkSpec(fit.fixed_s, fit.rate), fit, rows
    return links, fits, samples


def _copy_s(device: torch.device, n: int, pinned: bool, direction: str) -> float:
    """Median time of one copy of n bytes between (pinned or pageable) host memory and the device."""
    host = torch.ones(n, dtype=torch.uint8, pin_memory=pinned and device.type == "cuda")  # touched
    dev = torch.empty(n, dtype=torch.uint8, device=device)
    src, dst = (host, dev) if direction == "h2d" else (dev, host)
    return median_s(lambda: dst.copy_(src, non_blocking=True), device, repeat=10)


BESIDE_ROUNDS = 5  # turns of the compute-beside-all-reduce probe's three timings


BESIDE_PIECES = 16  # all-reduces of DDP's 25 MiB bucket in the probe (on the CPU: of 64 KiB)


BESIDE_MATMULS = 40  # 4096^3 bf16 matmuls in its compute, ~3-4x the all-reduce on H100s over NVLink


def _allreduce_beside(device: torch.device) -> dict[str, list[float]]:
    """Seconds of a run of matmuls alone, of DDP-sized all-reduces alone and of both with the all-reduces issued first
    on a stream of their own (as much overlap as the GPU allows), in turns; every rank runs each."""
    import torch.distributed as dist

    from hw.interfaces.data_parallel import beside

    gpu = device.type == "cuda"
    n, dtype = (4096, torch.bfloat16) if gpu else (64, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    pieces = [torch.ones((DDP_BUCKET_BYTES if gpu else 64 << 10) // 4, device=device) for _ in range(BESIDE_PIECES)]
    side = torch.cuda.Stream(device) if gpu else None

    def compute() -> None:
        for _ in range(BESIDE_MATMULS):
            a @ a

    def reduce() -> None:
        for piece in pieces:
            dist.all_reduce(piece)

    def both() -> None:
        beside(reduce, compute, side)

    out: dict[str, list[float]] = {"compute": [], "allreduce": [], "beside": []}
    for k in range(BESIDE_ROUNDS + 1):  # the first round warms up
        for name, run in (("compute", compute), ("allreduce", reduce), ("beside", both)):
            dist.barrier()
            sync(device)
            t0 = time.perf_counter()
            run()
            sync(device)  # a device-wide sync: the side stream too
            if k:
                out[name].append(time.perf_counter() - t0)
    return out


def compute_share(beside: dict[str, list[float]]) -> float:
    """The share of an all-reduce's time that compute beside it loses, from _allreduce_beside's medians: (both -
    compute alone) / all-reduce alone, within [0, 1]."""
    m = {k: statistics.median(v) for k, v in beside.items()}
    return min(1.0, max(0.0, (m["beside"] - m["compute"]) / m["allreduce"]))


@dataclass(frozen=True)
class LinkTimings:
    """Rank 0's raw timings of the links between GPUs (_p2p_worker), sent back pickled; the calibration's samples
    keep them as a dict."""

    p2p: list[dict[str, float]]  # {"bytes", "seconds"}: a message's one-way time (half a ping-pong's)
    allreduce: list[dict[str, float]]  # {"bytes", "seconds"}: an all-reduce over every rank
    post_s: list[float]  # host time of each send and receive action in hw's runner
    beside: dict[str, list[float]]  # compute, all-reduce and both at once (_allreduce_beside)


def _p2p_worker(rank: int, world: int, device: torch.device, sizes: list[int]) -> LinkTimings:
    """Ping-pong between ranks 0 and 1 (one-way time = half the round trip); all-reduce over all, and beside
    compute."""
    import torch.distributed as dist

    post_s, beside = _p2p_host_s(rank, device), _allreduce_beside(device)
    p2p: list[dict[str, float]] = []
    allreduce: list[dict[str, float]] = []
    for n in sizes:
        buf = torch.ones(max(n // 4, 1), device=device)
        for k in range(13):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            sync(device)
            if k >= 3 and rank == 0:
                p2p.append({"bytes": n, "seconds": (time.perf_counter() - t0) / 2})
        for k in range(13):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            sync(device)
            if k >= 3 and rank == 0:
                allreduce.append({"bytes": n, "seconds": time.perf_counter() - t0})
    return LinkTimings(p2p, allreduce, post_s, beside)


def _p2p_host_s(rank: int, device: torch.device) -> list[float]:
    """Host time of each send and receive action in hw's own executor: ranks 0 and 1 run a tiny 1F1B."""
    import torch.distributed as dist

    from hw.run.observers import HostSpans
    from hw.run.stage_runner import StageRunner, channel_groups, make_batch, split_batch, stage_modules
    from parsim.schedules import one_f_one_b

    m = 16
    schedule, model = one_f_one_b(2, m), mlp_model(2, 64, 8 * m)
    channels = channel_groups(schedule)  # every rank joins the group calls
    spans = HostSpans(keep=lambda action: not action.is_compute)
    if rank < 2:
        runner = StageRunner(schedule, rank, stage_modules(model, schedule, rank, device, torch.float32), channels)
        io = split_batch(*make_batch(model, device, torch.float32), m)
        for _ in range(3):
            runner.step(io)
            sync(device)
        with host_pinned(device, local_rank(rank)):  # as hw measure times its steps
            for _ in range(5):
                runner.step(io, spans)
                sync(device)
    dist.barrier()
    return [seconds for _, seconds in spans.spans]


def gpu_links(world: int, device: str, sizes: list[int]) -> tuple[LinkSpec, CollectiveSpec, dict[str, Fit],
                                                                   LinkTimings]:
    """GPU 0 to 1's messages and the all-reduce over `world` GPUs, fitted to latency + bytes / bandwidth, with
    compute's share lost beside an all-reduce; their fits and raw timings."""
    from hw.run.ranks import spawn

    raw: LinkTimings = spawn(_p2p_worker, world, (sizes,), device, timeout_s=60, deadline_s=300)[0]

    def medians(rows: list[dict[str, float]]) -> tuple[list[float], list[float]]:
        by: dict[float, list[float]] = {}
        for r in rows:
            by.setdefault(r["bytes"], []).append(r["seconds"])
        return list(by), [statistics.median(v) for v in by.values()]

    p2p = fit_affine(*medians(raw.p2p))
    b, t = medians(raw.allreduce)
    ring = 2 * (world - 1) / world  # all-reduce time = latency + ring * n / busbw
    ar = fit_affine([ring * x for x in b], t)
    return (LinkSpec(p2p.fixed_s, p2p.rate), CollectiveSpec(ar.fixed_s, ar.rate, compute_share=compute_share(
            raw.beside)), {"nvlink": p2p, "allreduce": ar}, raw)
