"""Where the GPU-bound steps' error comes from, on one GPU (issues 12, 13): one bounded run, raw numbers out.

Parts (each prints a line and adds a key to OUT.json):
  sustain     hw's runner, 16 MLP blocks h=2048, 8192 tokens, 1 micro-batch: 30 steps back to back, then 12 each
              after 200 ms idle, then 12 each after a host-probe step (as hw validate's turns run them)
  rotate      hw, torch and graphs at the same point and at 4 micro-batches, 12 rounds, the order rotated each
              round: is the first job of a turn faster, whatever its runtime?
  accumulate  hw's runner, 16 blocks h=4096, 16384 tokens, 32 micro-batches: per-action GPU times (the first
              micro-batch's backward has no gradient add) and the profiler's kernel totals for one step
  graphs      the graphed runtime, 16 blocks h=512, 4096 tokens: 1F1B and interleaved 1F1B at 32 micro-batches,
              GPipe at 1: step times, per-action GPU times and kernel totals against the step
  kernels     the profiler's kernel totals of one step of hw's and of torch's runtime at h=2048, 1 micro-batch
  graphgaps   the GPU's idle time between graph replays: N distinct graphs of one stage (8 MLP blocks h=512,
              128 rows) replayed round-robin, N = 1..256; and the graphed runtime's gaps between actions (1F1B and
              interleaved 1F1B at 8-64 micro-batches)
  eventgaps   the graphed runtime's step with and without an event recorded between its replays, and the host's
              time in each replay call
  probes      calibrate's layer probe at hidden sizes it does not cost by default (512, 1536): do the costs of
              the sizes around them predict them?
Usage: python lab/gpu-bound/gpu_diagnose.py OUT.json [PART ...]   (--cpu: a seconds-long check of the code paths)
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from hw.run.stage_runner import Groups
from hw.run.observers import ActionTimer
from hw.measure.steps import Config, Job, Stepper
from hw.run.runtimes import job_groups
from hw.run.ranks import spawn
from parsim.hostprobe import probe
from parsim.runtimes import get_runtime
from parsim.workload import mlp_model

CPU = "--cpu" in sys.argv


def _model(layers: int, hidden: int, tokens: int):
    return mlp_model(2, 64, 64) if CPU else mlp_model(layers, hidden, tokens)


def _stepper(device, runtime: str, schedule: str, m: int, model, groups: Groups) -> Stepper:
    s = get_runtime(runtime).build(schedule, 1, m)
    job = Job(s, model, Config(1, 0, "fp32" if CPU else "bf16"), runtime=runtime)
    return Stepper(0, device, job, job_groups(runtime, s, groups))


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(stepper: Stepper, device, observe=None) -> float:
    _sync(device)
    t0 = time.perf_counter()
    stepper(observe)
    _sync(device)
    return time.perf_counter() - t0


def _warm(stepper: Stepper, device, n: int = 3) -> Stepper:
    for _ in range(n):
        _timed(stepper, device)
    return stepper


def sustain(device, groups: Groups) -> dict:
    hw = _warm(_stepper(device, "hw", "gpipe", 1, _model(16, 2048, 8192), groups), device)
    host = _warm(_stepper(device, "hw", "gpipe", 8, probe(1)[1], groups), device)
    back_to_back = [_timed(hw, device) for _ in range(30)]
    time.sleep(2)
    after_idle = []
    for _ in range(12):
        time.sleep(0.2)
        after_idle.append(_timed(hw, device))
    after_probe = []
    for _ in range(12):
        _timed(host, device)
        after_probe.append(_timed(hw, device))
    return {"back_to_back_s": back_to_back, "after_200ms_idle_s": after_idle, "after_host_probe_s": after_probe}


def rotate(device, groups: Groups) -> dict:
    out = {}
    for m in (1, 4):
        model = _model(16, 2048, 8192)
        steppers = {r: _warm(_stepper(device, r, "1f1b", m, model, groups), device) for r in ("hw", "torch", "graphs")}
        names = list(steppers)
        rows = []
        for k in range(12):
            order = names[k % 3:] + names[:k % 3]
            for position, name in enumerate(order):
                rows.append({"runtime": name, "position": position, "step_s": _timed(steppers[name], device)})
        out[f"m{m}"] = rows
        del steppers
    return out


def _spans(stepper: Stepper, device) -> list[dict]:
    """Each compute action's GPU span and its start, from the first action's start (seconds)."""
    timer = ActionTimer(device)
    _timed(stepper, device, timer)

    def seconds(a, b) -> float:
        return a.elapsed_time(b) / 1e3 if timer.cuda else b - a

    first = timer.spans[0][1]
    return [{"action": str(a), "s": seconds(start, end), "at": seconds(first, start)} for a, start, end in timer.spans]


def _kernels(stepper: Stepper, device, top: int = 25) -> dict:
    """The profiler's view of one step: wall time, the sum of GPU kernel times, and the top kernels by total."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        wall = _timed(stepper, device)
    events = [e for e in prof.key_averages() if getattr(e, "device_time_total", 0) > 0
              and e.device_type.name == "CUDA"] if device.type == "cuda" else []
    events.sort(key=lambda e: -e.device_time_total)
    return {"wall_s": wall, "kernel_total_s": sum(e.device_time_total for e in events) / 1e6,
            "top": [{"name": e.key[:120], "count": e.count, "total_s": e.device_time_total / 1e6} for e in events[:top]]}


def accumulate(device, groups: Groups) -> dict:
    hw = _warm(_stepper(device, "hw", "gpipe", 32, _model(16, 4096, 16384), groups), device, 2)
    return {"steps_s": [_timed(hw, device) for _ in range(5)], "spans": _spans(hw, device),
            "kernels": _kernels(hw, device)}


def graphs(device, groups: Groups) -> dict:
    out = {}
    model = _model(16, 512, 4096)
    for schedule, m in (("1f1b", 32), ("interleaved-1f1b", 32), ("gpipe", 1)):
        for runtime in ("graphs", "hw"):
            st = _warm(_stepper(device, runtime, schedule, m, model, groups), device)
            out[f"{runtime}:{schedule}:{m}"] = {"steps_s": [_timed(st, device) for _ in range(8)],
                                                "spans": _spans(st, device), "kernels": _kernels(st, device)}
            del st
    return out


def kernels(device, groups: Groups) -> dict:
    model = _model(16, 2048, 8192)
    return {r: _kernels(_warm(_stepper(device, r, "1f1b", 1, model, groups), device), device) for r in ("hw", "torch")}


def graphgaps(device, groups: Groups) -> dict:
    from hw.run.cuda_graphs import graph_maker
    from hw.nets.blocks import MlpBlock

    rows, tokens = [], 8 if CPU else 128
    stack = torch.nn.Sequential(*(MlpBlock(64 if CPU else 512) for _ in range(8))).to(device)
    if not CPU:
        stack = stack.to(torch.bfloat16)
    x = torch.randn(tokens, 64 if CPU else 512, device=device, dtype=next(stack.parameters()).dtype)
    with torch.no_grad():
        for n in (1, 2, 8, 32, 64, 128, 256):
            maker = graph_maker(device)
            maker.warm_up(lambda: stack(x))
            graphs = []
            for _ in range(n):
                g = maker.graph(None)
                g.capture(lambda: stack(x))
                graphs.append(g)
            order = [graphs[k % n] for k in range(512)]
            for g in order[:n]:
                g.replay()
            _sync(device)
            t0 = time.perf_counter()
            for g in order:
                g.replay()
            _sync(device)
            rows.append({"graphs": n, "replays": len(order), "per_replay_s": (time.perf_counter() - t0) / len(order)})
            del graphs, order, maker
    out = {"round_robin": rows}
    model = _model(16, 512, 4096)
    for schedule in ("1f1b", "interleaved-1f1b"):
        for m in (8, 16, 32, 64):
            st = _warm(_stepper(device, "graphs", schedule, m, model, groups), device)
            out[f"graphs:{schedule}:{m}"] = {"steps_s": [_timed(st, device) for _ in range(6)],
                                             "spans": _spans(st, device)}
            del st
    return out


def eventgaps(device, groups: Groups) -> dict:
    """Does an event recorded between graph replays change the step? Wall time of plain steps and of steps with
    an event recorded at each compute action's start or end (timing or not), or the ActionTimer (both, timing);
    the host's time in each replay call."""
    out = {}
    model = _model(16, 512, 4096)

    def marker(phase: str, timing: bool):
        def mark(action, at: str) -> None:
            if at == phase and device.type == "cuda":
                torch.cuda.Event(enable_timing=timing).record()
        return mark

    observers = {"plain_s": lambda: None, "start_event_s": lambda: marker("start", False),
                 "end_event_s": lambda: marker("end", False), "start_timing_s": lambda: marker("start", True),
                 "end_timing_s": lambda: marker("end", True), "timer_s": lambda: ActionTimer(device)}
    for k, (schedule, m) in enumerate((("interleaved-1f1b", 32), ("1f1b", 32), ("interleaved-1f1b", 32),
                                       ("interleaved-1f1b", 64), ("1f1b", 64))):
        st = _warm(_stepper(device, "graphs", schedule, m, model, groups), device)
        runner = st.runner
        calls: list[float] = []
        original = dict(runner.replays)

        def timed_replay(fn):
            def call() -> None:
                t0 = time.perf_counter()
                fn()
                calls.append(time.perf_counter() - t0)
            return call

        rows = {name: [] for name in observers} | {"replay_call_s": []}
        for _ in range(5):
            for name, make in observers.items():
                rows[name].append(_timed(st, device, make()))
            runner.replays = {a: timed_replay(fn) for a, fn in original.items()}
            calls.clear()
            _timed(st, device)
            runner.replays = original
            rows["replay_call_s"].append(statistics.median(calls))
        out[f"{schedule}:{m}:{k}"] = rows
        del st, runner, original
    return out


def probes(device, groups: Groups) -> list[dict]:
    from tqdm import tqdm

    from hw.calibrate.layers import layer_samples
    from parsim.workload import Layer

    tokens = [64, 256] if CPU else [128, 512, 1024, 2048, 4096, 8192, 16384]
    with tqdm(disable=True) as progress:
        return layer_samples(device, torch.float32 if CPU else torch.bfloat16,
                             [Layer("mlp", h) for h in ((32,) if CPU else (512, 1536))], tokens, progress)


PARTS = {"sustain": sustain, "rotate": rotate, "accumulate": accumulate, "graphs": graphs, "kernels": kernels, "probes": probes, "graphgaps": graphgaps, "eventgaps": eventgaps}


def worker(rank: int, world: int, device, parts: list[str]) -> dict:
    groups, out = Groups(), {}
    for part in parts:
        t0 = time.perf_counter()
        out[part] = PARTS[part](device, groups)
        print(f"{part}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        torch.cuda.empty_cache() if device.type == "cuda" else None
    return out


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--cpu"]
    path, parts = args[0], args[1:] or list(PARTS)
    (result,) = spawn(worker, 1, (parts,), "cpu" if CPU else "cuda", 300.0, deadline_s=560.0)
    result["meta"] = {"torch": torch.__version__, "device": "cpu" if CPU else torch.cuda.get_device_name(0),
                      "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv)}
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    for part in parts:
        print(part, json.dumps(_summary(part, result[part]))[:600])


def _summary(part: str, r: dict) -> dict:
    med = statistics.median
    if part == "sustain":
        return {k: [round(med(v[:5]) * 1e3, 2), round(med(v[-5:]) * 1e3, 2)] for k, v in r.items()}
    if part == "rotate":
        return {m: {f"{x['runtime']}@{p}": round(med(y["step_s"] for y in rows if y["runtime"] == x["runtime"]
                                                     and y["position"] == p) * 1e3, 2)
                    for x in rows[:3] for p in range(3)} for m, rows in r.items()}
    if part == "accumulate":
        return {"step_ms": round(med(r["steps_s"]) * 1e3, 2), "kernel_ms": round(r["kernels"]["kernel_total_s"] * 1e3, 2)}
    if part == "graphs":
        return {k: [round(med(v["steps_s"]) * 1e3, 2), round(v["kernels"]["kernel_total_s"] * 1e3, 2)] for k, v in r.items()}
    if part == "graphgaps":
        rr = {x["graphs"]: round(x["per_replay_s"] * 1e6, 1) for x in r["round_robin"]}
        steps = {k: [round(med(v["steps_s"]) * 1e3, 2), round(sum(x["s"] for x in v["spans"]) * 1e3, 2)]
                 for k, v in r.items() if k != "round_robin"}
        return {"us_per_replay": rr, "step_ms/spans_ms": steps}
    if part == "eventgaps":
        return {k: {n: round(med(v) * 1e3, 3) for n, v in rows.items()} for k, rows in r.items()}
    if part == "probes":
        return {f"{x['hidden']}@{x['tokens']}": round((x["forward_s"] + x["backward_s"]) * 1e6, 1) for x in r}
    return {k: round(v["kernel_total_s"] * 1e3, 2) for k, v in r.items()}


if __name__ == "__main__":
    main()
