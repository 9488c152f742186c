"""DataParallel's two comm calls on the MLP stack's parameters (16 x h=2048 bf16, 1.07 GB), timed alone:
replicate's broadcast_coalesced onto GPUs 0..n-1 and backward's reduce_add_coalesced onto GPU 0, n = 2..G, in turns
(5 rounds, median), every GPU synced around each; and one GPU's gradients copied to GPU 0 alone (the link).

    python lab/data-parallel/dp_comm_probe.py OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn.parallel import comm
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hw.interfaces.data_parallel import build  # noqa: E402
from hw.timing import sync_all  # noqa: E402


def timed(fn, devices) -> float:
    sync_all(devices)
    t0 = time.perf_counter()
    fn()
    sync_all(devices)
    return time.perf_counter() - t0


def main() -> None:
    g = torch.cuda.device_count()
    model, _, _ = build("mlp", torch.device("cuda", 0))
    params = [p.detach() for p in model.parameters()]
    grads = {d: [p.to(f"cuda:{d}") for p in params] for d in range(g)}
    nbytes = sum(p.numel() * p.element_size() for p in params)
    points = {}
    for n in range(2, g + 1):
        devs = list(range(n))
        points[f"broadcast{n}"] = (lambda devs=devs: comm.broadcast_coalesced(params, devs), devs)
        points[f"reduce{n}"] = (lambda devs=devs: comm.reduce_add_coalesced([grads[d] for d in devs], 0), devs)
    for d in range(1, g):
        points[f"copy{d}to0"] = (lambda d=d: [t.to("cuda:0") for t in grads[d]], [0, d])
    times = {k: [] for k in points}
    for r in range(6):
        for k, (fn, devs) in points.items():
            t = timed(fn, [torch.device("cuda", i) for i in devs])
            if r:
                times[k].append(t)
    kernels = {}
    for k in (f"reduce{g}", f"broadcast{g}"):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            points[k][0]()
            torch.cuda.synchronize()
        kernels[k] = prof.key_averages().table(sort_by="cuda_time_total", row_limit=12)
    out = {"command": "python lab/data-parallel/dp_comm_probe.py " + " ".join(sys.argv[1:]), "torch": torch.__version__,
           "device": torch.cuda.get_device_name(0), "gpus": g, "bytes": nbytes,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "median_s": {k: statistics.median(v) for k, v in times.items()}, "times_s": times, "kernels": kernels}
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1))
    for k, v in out["median_s"].items():
        print(f"{k:12s} {v * 1e3:8.2f} ms  {nbytes / v / 1e9:7.1f} GB/s")
    for k, t in kernels.items():
        print(k)
        print(t)


if __name__ == "__main__":
    main()
