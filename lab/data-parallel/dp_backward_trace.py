"""Where nn.DataParallel's backward over the MLP stack spends its time on n GPUs (issue 19: synced, it took 20, 26
and 30 ms on 2-4 H100 where the module alone takes 30 ms on one, its 4 GPUs' share 7.5 ms and the gradients'
reduction alone 5.5).

    python lab/data-parallel/dp_backward_trace.py OUT.json

For n = 1 (the module alone) .. G: two steps' backward under torch.profiler (CUDA and CPU), then per GPU its kernels'
busy time, their first and last start from the backward's call, the longest idle gap, and per host thread its launch
calls (count, total and median time).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hw.interfaces.data_parallel import build  # noqa: E402
from hw.timing import sync_all  # noqa: E402

LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC", "cudaMemcpyAsync")


def summary(prof, t0_us: float) -> dict:
    gpus: dict[int, list] = defaultdict(list)
    threads: dict[int, list] = defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_index >= 0:
            gpus[e.device_index].append((e.time_range.start - t0_us, e.time_range.end - t0_us, e.name))
        elif e.name in LAUNCHES:
            threads[e.thread].append(e.time_range.end - e.time_range.start)
    out = {"gpus": {}, "threads": {}}
    for d, ks in sorted(gpus.items()):
        ks.sort()
        gaps = [(b[0] - a[1], a[1]) for a, b in zip(ks, ks[1:])]
        out["gpus"][d] = {"kernels": len(ks), "busy_us": sum(e - s for s, e, _ in ks), "first_us": ks[0][0],
                          "last_end_us": max(e for _, e, _ in ks),
                          "longest_gap_us": max(gaps)[0] if gaps else 0.0, "gap_at_us": max(gaps)[1] if gaps else 0.0}
    for t, ds in threads.items():
        out["threads"][t] = {"launches": len(ds), "total_us": sum(ds), "median_us": statistics.median(ds)}
    return out


def main() -> None:
    g = torch.cuda.device_count()
    dev0 = torch.device("cuda", 0)
    model, batch, data = build("mlp", dev0)
    x = data(batch)
    out = {"command": "python lab/data-parallel/dp_backward_trace.py " + " ".join(sys.argv[1:]), "torch": torch.__version__,
           "device": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "points": {}}
    for n in range(1, g + 1):
        net = model if n == 1 else nn.DataParallel(model, device_ids=list(range(n)))
        devs = [torch.device("cuda", d) for d in range(n)]
        for _ in range(3):
            net.zero_grad(set_to_none=True)
            net(x).float().sum().backward()
        runs = []
        for _ in range(2):
            net.zero_grad(set_to_none=True)
            loss = net(x).float().sum()
            sync_all(devs)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                t = time.perf_counter()
                loss.backward()
                called = time.perf_counter() - t
                sync_all(devs)
                wall = time.perf_counter() - t
            t0 = min(e.time_range.start for e in prof.events())
            runs.append({"call_ms": called * 1e3, "wall_ms": wall * 1e3} | summary(prof, t0))
        out["points"][n] = runs
        r = runs[-1]
        print(f"n={n} backward call {r['call_ms']:.1f} ms, with sync {r['wall_ms']:.1f} ms")
        for d, s in r["gpus"].items():
            print(f"  gpu{d}: {s['kernels']} kernels busy {s['busy_us'] / 1e3:.1f} ms, first {s['first_us'] / 1e3:.1f} "
                  f"last end {s['last_end_us'] / 1e3:.1f} ms, longest gap {s['longest_gap_us'] / 1e3:.2f} ms at "
                  f"{s['gap_at_us'] / 1e3:.1f}")
        for t, s in r["threads"].items():
            print(f"  thread {t}: {s['launches']} launches, {s['total_us'] / 1e3:.2f} ms, "
                  f"median {s['median_us']:.1f} us")
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
