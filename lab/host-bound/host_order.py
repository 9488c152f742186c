"""Does the host's cost of an action depend on the order the schedule runs it in?

On one GPU, GPipe, 1F1B and interleaved 1F1B issue the same kernels, yet their host-bound steps
measured 187, 212 and 281 ms (8 MLP blocks h=256, 1024 tokens, 64 micro-batches, run 8), where
calibrate's host probe (GPipe order) predicted 177, 177 and 201 ms. This times each action's host
span in hw's executor per (op, previous op) for each schedule, under several thread placements:
`main` (hw's default: the dispatching thread bound to a core), `free` (nothing bound), `pair`
(also the autograd engine's CUDA worker thread bound, to the next core), `same` (both on one core).
Rounds repeat the placements in turn, so a drift of the host's speed shows as a drift, not a cause.
Usage: python lab/host-bound/host_order.py OUT.json [ROUNDS] [PLACEMENTS, comma-separated]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections import defaultdict
from contextlib import contextmanager

import torch

from hw.run.stage_runner import local_runner
from hw.run.observers import HostSpans
from hw.timing import sync
from hw.run.ranks import autograd_threads
from parsim.schedules import build
from parsim.workload import mlp_model

POINTS = [("8x256x1024", (8, 256, 1024), 16), ("8x256x1024", (8, 256, 1024), 64), ("16x2048x8192", (16, 2048, 8192), 32)]
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
PLACEMENTS = ("main", "free", "pair", "same")


def threads() -> dict[int, str]:
    """This process's threads: id -> name."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as f:
            out[int(tid)] = f.read().strip()
    return out


@contextmanager
def placed(placement: str):
    """Bind the dispatching thread (and with `pair`/`same` the autograd worker threads) as named."""
    cores = sorted(os.sched_getaffinity(0))
    main_core, other = cores[1 % len(cores)], cores[2 % len(cores)]
    autograd = autograd_threads()
    before = {t: os.sched_getaffinity(t) for t in [0, *autograd]}
    if placement != "free":
        os.sched_setaffinity(0, {main_core})
    if placement in ("pair", "same"):
        for t in autograd:
            os.sched_setaffinity(t, {other if placement == "pair" else main_core})
    try:
        yield
    finally:
        for t, mask in before.items():
            os.sched_setaffinity(t, mask)


def time_point(spec: tuple[int, int, int], schedule_name: str, m: int, placement: str, device, steps: int = 15) -> dict:
    model = mlp_model(*spec)
    schedule = build(schedule_name, 1, m)
    runner, io = local_runner(model, schedule, device, torch.bfloat16)
    params = [p for s in runner.stages.values() for p in s.parameters()]
    for _ in range(3):
        runner.step(io)
    sync(device)
    by_kind: dict[str, list[float]] = defaultdict(list)
    steps_s, spans_s = [], []
    with placed(placement):
        for _ in range(steps):
            for p in params:
                p.grad = None
            spans = HostSpans()
            sync(device)
            t0 = time.perf_counter()
            runner.step(io, spans)
            sync(device)
            steps_s.append(time.perf_counter() - t0)
            spans_s.append(sum(s for _, s in spans.spans))
            prev = "start"
            for action, s in spans.spans:
                by_kind[f"{action.op} after {prev}"].append(s)
                prev = action.op
    return {"schedule": schedule_name, "microbatches": m, "placement": placement,
            "step_s": statistics.median(steps_s), "spans_s": statistics.median(spans_s),
            "span_median_s": {k: statistics.median(v) for k, v in sorted(by_kind.items())},
            "span_count": {k: len(v) // steps for k, v in sorted(by_kind.items())}}


def main() -> None:
    device = torch.device("cuda", 0)
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    placements = sys.argv[3].split(",") if len(sys.argv) > 3 else PLACEMENTS
    torch.ones(1, device=device, requires_grad=True).sum().backward()  # start the autograd worker thread
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "threads": sorted(set(threads().values())), "rows": []}
    print("threads:", out["threads"], flush=True)
    for r in range(rounds):
        for label, spec, m in POINTS:
            for placement in placements:
                for name in SCHEDULES:
                    row = {"round": r, "model": label, **time_point(spec, name, m, placement, device)}
                    out["rows"].append(row)
                    kinds = ", ".join(f"{k} {v*1e6:.0f}" for k, v in row["span_median_s"].items())
                    print(f"r{r} {label} m={m} {placement:5} {name:17} step {row['step_s']*1e3:7.2f} ms, "
                          f"spans {row['spans_s']*1e3:7.2f}; us: {kinds}", flush=True)
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
