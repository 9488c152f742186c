"""The collectives tensor parallelism issues, timed at its sizes: all-reduce, reduce-scatter and all-gather of one
micro-batch's activation (tokens x hidden x dtype bytes) over every GPU, fitted to parsim's ring formula
latency_s + passes x (t-1)/t x bytes / busbw_Bps (parsim.workload.tensor_parallel.collective_s): the profile's
collectives.tp_allreduce, tp_reduce_scatter and tp_all_gather.

`hw calibrate` on several GPUs times them beside the data-parallel all-reduce; `hw calibrate --tp-collectives` times
only them and DTensor's host cost (hw.calibrate.tp_host), added to --base (a bounded run: ~30 s on two GPUs).
"""

from __future__ import annotations

import dataclasses
import datetime
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from hw.calibrate.fit import Fit, fit_affine
from hw.timing import sync
from parsim.profile import CollectiveSpec, Profile, samples_path, save_profile
from parsim.workload.tensor_parallel import PASSES

TOKENS, HIDDEN = (256, 1024, 4096, 8192), (2048, 4096, 8192)  # a micro-batch's tokens, the width: bf16 1 to 128 MiB
CPU_TOKENS, CPU_HIDDEN = (8, 64), (16, 64)  # --cpu: tiny, fp32
REPEAT, WARMUP = 10, 3  # timed and untimed calls per kind and size


def tp_sizes(cpu: bool) -> list[int]:
    """Bytes of the tensors TP's collectives carry: tokens x hidden x dtype bytes, sorted, each once."""
    tokens, hidden, width = (CPU_TOKENS, CPU_HIDDEN, 4) if cpu else (TOKENS, HIDDEN, 2)
    return sorted({t * h * width for t in tokens for h in hidden})


def _call(kind: str, n: int, world: int, device: torch.device) -> Callable[[], object]:
    """One collective of `kind` on a whole tensor of `n` bytes (each rank holds a world-th of it where it is split)."""
    elements = max(n // 4 // world, 1) * world
    whole = torch.ones(elements, device=device)
    part = torch.ones(elements // world, device=device)
    if kind == "allreduce":
        return lambda: dist.all_reduce(whole)
    # torch 2.13 names them *_single (the *_tensor names deprecated); 2.11 has only the *_tensor ones
    if kind == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(part, whole)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return lambda: gather(whole, part)


def tp_worker(rank: int, world: int, device: torch.device, sizes: list[int]) -> list[dict[str, float | str]]:
    """Rank 0's times of each kind at each size over all `world` ranks, every call between barriers."""
    rows: list[dict[str, float | str]] = []
    for kind in PASSES:
        for n in sizes:
            run = _call(kind, n, world, device)
            for k in range(WARMUP + REPEAT):
                dist.barrier()
                sync(device)
                t0 = time.perf_counter()
                run()
                sync(device)
                if k >= WARMUP and rank == 0:
                    rows.append({"kind": kind, "bytes": n, "seconds": time.perf_counter() - t0})
    return rows


def fit_collectives(rows: list[dict[str, float | str]], world: int) -> tuple[dict[str, CollectiveSpec],
                                                                              dict[str, Fit]]:
    """Each kind's medians fitted to latency + passes x (world-1)/world x bytes / busbw: the profile's tp_KIND."""
    specs, fits = {}, {}
    for kind, passes in PASSES.items():
        by: dict[float, list[float]] = {}
        for r in rows:
            if r["kind"] == kind:
                by.setdefault(float(r["bytes"]), []).append(float(r["seconds"]))
        share = passes * (world - 1) / world
        fit = fit_affine([share * b for b in by], [statistics.median(v) for v in by.values()])
        specs[f"tp_{kind}"], fits[f"tp_{kind}"] = CollectiveSpec(fit.fixed_s, fit.rate), fit
    return specs, fits


def tp_collectives(world: int, cpu: bool) -> tuple[dict[str, CollectiveSpec], dict[str, Fit], list]:
    """TP's collectives timed over `world` GPUs (gloo processes on the CPU) and fitted; their raw rows."""
    from hw.run.ranks import spawn

    rows = spawn(tp_worker, world, (tp_sizes(cpu),), "cpu" if cpu else "cuda", timeout_s=60, deadline_s=300)[0]
    specs, fits = fit_collectives(rows, world)
    return specs, fits, rows


def calibrate_tp_collectives(base: Profile, out: Path, world: int, cpu: bool) -> int:
    """`hw calibrate --tp-collectives`: TP's collectives and DTensor's host cost (hw.calibrate.tp_host), written
    into a copy of `base` at `out`."""
    from hw.calibrate.tp_host import describe, tp_host

    specs, fits, rows = tp_collectives(world, cpu)
    host, host_rows = tp_host(world, cpu)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    meta = {**base.meta, "tp_collectives": {
        "command": "python -m hw " + " ".join(sys.argv[1:]), "date": now, "torch": torch.__version__,
        "python": platform.python_version(), "gpus": world,
        "device": "cpu" if cpu else torch.cuda.get_device_name(0),
        "fits": {k: f.record() for k, f in fits.items()}, "tp_host": dataclasses.asdict(host)}}
    profile = dataclasses.replace(base, collectives={**base.collectives, **specs}, meta=meta,
                                  host=dataclasses.replace(base.host, tp_forward_s=host.forward_s,
                                                           tp_backward_s=host.backward_s))
    save_profile(profile, out, {"meta": meta["tp_collectives"], "tp_collectives": rows, "tp_host": host_rows})
    for name, spec in specs.items():
        print(f"{name:<18} latency {spec.latency_s * 1e6:8.2f} us, bus bandwidth {spec.busbw_Bps / 1e9:8.2f} GB/s "
              f"(R^2 {fits[name].r2:.4f}, worst {fits[name].max_rel_residual:.1%}) over {world} GPUs")
    print(describe(host))
    print(f"wrote {out} and {samples_path(out)}")
    return 0
