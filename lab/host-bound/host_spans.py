"""Diagnose host-bound steps: the in-situ host span of every action against the whole step's time.

Runs one dispatch-bound model (8 MLP blocks h=256, 1024 tokens, one GPU) at several micro-batch
counts in this one process, as `hw measure` times it (pinned host thread, synchronised before and
after each step), and records per step: wall time, the sum of the actions' host spans, and Python GC
collections. Then calibrate's own host probe in the same process, for comparison.
Usage: python lab/host-bound/host_spans.py OUT.json
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time

import torch

from hw.calibrate.host import host_costs, host_samples
from hw.run.stage_runner import local_runner
from hw.run.observers import HostSpans
from hw.timing import sync
from hw.run.ranks import host_pinned
from parsim.schedules import gpipe
from parsim.workload import mlp_model


def run(device: torch.device, microbatches: int, steps: int = 20) -> dict:
    model = mlp_model(8, 256, 1024)
    runner, io = local_runner(model, gpipe(1, microbatches), device, torch.bfloat16)
    params = list(runner.stages[0].parameters())
    spans = HostSpans()
    for _ in range(3):
        runner.step(io)
    rows = []
    with host_pinned(device, 0):
        for _ in range(steps):
            for p in params:
                p.grad = None
            spans.spans.clear()
            before = [g["collections"] for g in gc.get_stats()]
            sync(device)
            t0 = time.perf_counter()
            runner.step(io, spans)
            t_host = time.perf_counter() - t0
            sync(device)
            spans_s = sum(seconds for _, seconds in spans.spans)
            rows.append({"step_s": time.perf_counter() - t0, "host_loop_s": t_host, "spans_s": spans_s,
                         "gc": [g["collections"] - b for g, b in zip(gc.get_stats(), before)]})
    med = {k: statistics.median(r[k] for r in rows) for k in ("step_s", "host_loop_s", "spans_s")}
    return {"microbatches": microbatches, **med, "gc_total": [sum(r["gc"][i] for r in rows) for i in range(3)],
            "rows": rows}


def main() -> None:
    device = torch.device("cuda", 0)
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "points": []}
    for m in (1, 4, 16, 64):
        point = run(device, m)
        out["points"].append(point)
        print(f"m={m}: step {point['step_s']*1e3:.2f} ms, host loop {point['host_loop_s']*1e3:.2f}, "
              f"action spans {point['spans_s']*1e3:.2f}, gc {point['gc_total']}", flush=True)
    host_rows = host_samples(device, torch.bfloat16)
    host, action_s, _ = host_costs(host_rows)
    out["calibrate_host"] = {"per_layer": host, "action_s": action_s, "rows": host_rows}
    print(f"calibrate's probe: per layer {host}, per action {action_s}")
    for m in (16, 1):  # again, after the probe: has the host changed speed meanwhile?
        point = run(device, m)
        out["points"].append(point)
        print(f"again m={m}: step {point['step_s']*1e3:.2f} ms, spans {point['spans_s']*1e3:.2f}")
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
