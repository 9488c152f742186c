"""A launch, a sync, elementwise and matmul kernels: the scenarios' op costs, measured for `hw calibrate`."""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from hw.calibrate.fit import fit_affine
from hw.timing import gpu_time_s, sync
from parsim.profile import KernelCost


def launch_cost_s(device: torch.device, n: int = 2000, elements: int = 1_000_000, repeat: int = 5) -> float:
    """Host time to launch one `y = x + 1` (new output from the caching allocator): the front end's t1.

    Median of `repeat` loops of n launches; the GPU runs each faster than it is launched, so the
    loop measures the host alone.
    """
    x = torch.ones(elements, device=device)
    for _ in range(100):
        x + 1
    times = []
    for _ in range(repeat):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(n):
            x + 1
        times.append((time.perf_counter() - t0) / n)  # the host returns before the GPU runs them
    sync(device)
    return statistics.median(times)


def sync_cost_s(device: torch.device, n: int = 200) -> float:
    """Time a synchronize takes when the GPU has nothing left to do: the front end's t3."""
    sync(device)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fit_kernel(work: list[float], seconds: list[float]) -> KernelCost:
    """fixed_s + work / rate by least squares on relative error (sizes span decades)."""
    a = np.column_stack([np.ones(len(work)), np.asarray(work, float)]) / np.asarray(seconds)[:, None]
    (fixed, per_unit), *_ = np.linalg.lstsq(a, np.ones(len(work)), rcond=None)
    per_unit = max(per_unit, 1e-30)
    return KernelCost(float(max(fixed, 0.0)), float(1.0 / per_unit))


def elementwise_cost(device: torch.device, sizes: list[int], repeat: int = 20) -> tuple[KernelCost, list[dict]]:
    """`y = x + 1` over float32 tensors of each size; work is bytes read plus written."""
    samples = [{"elements": n, "bytes": 8 * n, "seconds": _elementwise_s(device, n, repeat)} for n in sizes]
    return fit_kernel([s["bytes"] for s in samples], [s["seconds"] for s in samples]), samples


def matmul_cost(device: torch.device, sizes: list[int], repeat: int = 10) -> tuple[KernelCost, list[dict]]:
    """x.mm(x) over float32 square matrices of each size; work is 2 n^3 FLOPs."""
    samples = [{"size": n, "flops": 2.0 * n**3, "seconds": _matmul_s(device, n, repeat)} for n in sizes]
    return fit_kernel([s["flops"] for s in samples], [s["seconds"] for s in samples]), samples


def _elementwise_s(device: torch.device, n: int, repeat: int) -> float:
    """GPU time of one `y = x + 1` over n float32 elements."""
    x = torch.rand(n, device=device)
    return gpu_time_s(lambda: x + 1, device, 50, repeat)


def _matmul_s(device: torch.device, n: int, repeat: int) -> float:
    """GPU time of one float32 n x n matrix product."""
    x = torch.rand(n, n, device=device)
    return gpu_time_s(lambda: x.mm(x), device, 5, repeat)


def measure_all(device: torch.device, quick: bool = False) -> dict:
    """Every cost above, with its raw samples, as plain data for a profile and for the record."""
    sizes = [1 << k for k in range(10, 27, 2)] if not quick else [1 << 10, 1 << 14, 1 << 18]
    mm_sizes = [256, 512, 1024, 2048, 4096] if not quick else [32, 64]
    ew, ew_samples = elementwise_cost(device, sizes)
    mm, mm_samples = matmul_cost(device, mm_sizes)
    return {
        "host": {"launch_s": launch_cost_s(device), "sync_s": sync_cost_s(device)},
        "kernels": {"elementwise": {"fixed_s": ew.fixed_s, "rate": ew.rate},
                    "matmul": {"fixed_s": mm.fixed_s, "rate": mm.rate}},
        "samples": {"elementwise": ew_samples, "matmul": mm_samples},
    }


ADD_LAYERS = 8  # MLP blocks per stage in the gradient-add probe


def autograd_accumulate(device: torch.device, dtype: torch.dtype, hidden: list[int], cpu: bool,
                        ) -> tuple[KernelCost, dict]:
    """What autograd's gradient accumulation costs the GPU: `.grad += g` over a stage of MLP blocks of each width, a
    kernel per parameter tensor, fitted to fixed + bytes / rate; the fixed part per layer (profile.kernels'
    AUTOGRAD_ACCUMULATE). Every micro-batch's backward after a stage's first adds so."""
    from hw.calibrate.graphs_runtime import accumulate_samples

    layers = 2 if cpu else ADD_LAYERS
    rows = accumulate_samples(device, dtype, hidden, layers, graphed=False)
    fit = fit_affine([r["bytes"] for r in rows], [r["seconds"] for r in rows])
    return KernelCost(fit.fixed_s / layers, fit.rate), {"rows": rows, "fit": fit}


if __name__ == "__main__":
    import json
    import sys

    dev = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    out = measure_all(dev, quick=dev.type == "cpu")
    out["device"] = torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu"
    out["torch"] = torch.__version__
    out["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    json.dump(out, sys.stdout, indent=2)
