"""Where does a host-bound 1F1B step spend the host time that GPipe's same actions do not?

On one GPU 1F1B and GPipe issue the same actions in another order, yet with hw's thread placement
1F1B's host-bound steps took a median 1.10x GPipe's (data/host-noise/README.md). This profiles both
(torch.profiler, CPU activity: every aten op and autograd node, on every thread) as hw measure
times them, alternating the schedules over several rounds, and writes per op the host time per
step under each schedule, with the steps' wall times.
Usage: python lab/host-bound/host_profile.py OUT.json [ROUNDS]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from hw.run.stage_runner import local_runner
from hw.timing import sync
from hw.run.ranks import host_pinned
from parsim.schedules import build
from parsim.workload import mlp_model

POINTS = [((16, 2048, 8192), 32), ((8, 256, 1024), 64)]
SCHEDULES = ("gpipe", "1f1b")
STEPS = 5


def profiled(spec: tuple[int, int, int], name: str, m: int, device: torch.device) -> dict:
    """STEPS steps of `name` on one GPU under the profiler: wall time per step, and per op the CPU time per step."""
    model = mlp_model(*spec)
    schedule = build(name, 1, m)
    runner, io = local_runner(model, schedule, device, torch.bfloat16)
    params = [p for s in runner.stages.values() for p in s.parameters()]
    for _ in range(3):
        runner.step(io)
    sync(device)
    walls = []
    with host_pinned(device, 0), profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(STEPS):
            for p in params:
                p.grad = None
            sync(device)
            t0 = time.perf_counter()
            runner.step(io)
            sync(device)
            walls.append(time.perf_counter() - t0)
    ops = {e.key: {"self_s": e.self_cpu_time_total / 1e6 / STEPS, "total_s": e.cpu_time_total / 1e6 / STEPS,
                   "count": e.count // STEPS} for e in prof.key_averages()}
    return {"step_s": statistics.median(walls), "ops": ops}


def main() -> None:
    device = torch.device("cuda", 0)
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "steps_per_profile": STEPS, "rows": []}
    for r in range(rounds):
        for spec, m in POINTS:
            runs = {name: profiled(spec, name, m, device) for name in SCHEDULES}
            label = "x".join(map(str, spec))
            for name, run in runs.items():
                out["rows"].append({"round": r, "model": label, "microbatches": m, "schedule": name, **run})
            a, b = (runs[n] for n in SCHEDULES)
            print(f"r{r} {label} m={m}: step gpipe {a['step_s']*1e3:.1f} ms, 1f1b {b['step_s']*1e3:.1f} ms", flush=True)
            gap = defaultdict(float)
            for key in set(a["ops"]) | set(b["ops"]):
                gap[key] = b["ops"].get(key, {}).get("self_s", 0.0) - a["ops"].get(key, {}).get("self_s", 0.0)
            for key, g in sorted(gap.items(), key=lambda kv: -abs(kv[1]))[:12]:
                print(f"   {key:55} 1f1b - gpipe self {g*1e3:+8.2f} ms/step "
                      f"(gpipe {a['ops'].get(key, {}).get('self_s', 0)*1e3:7.2f}, count "
                      f"{a['ops'].get(key, {}).get('count', 0)} / {b['ops'].get(key, {}).get('count', 0)})", flush=True)
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
