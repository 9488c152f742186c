"""The GIL experiment: N Python threads of one process, each launching small kernels on its own CUDA stream
(on the CPU: small CPU ops) for a fixed time, and the probes that calibrate `parsim.sim.gil` for it.

A thread holds the GIL for the Python part of each launch; torch's bindings drop it for the C++ part. The
probes: one thread's time per launch; one and two threads launching while each holds the GIL a set time longer
per launch, which makes the other thread's core sleep that long before each wake-up
(`parsim.sim.gil.wake_points`); and, as a check the model does not use, eight threads holding the GIL longer
(their sleepers idle as long as two threads' do at the longest holds). None is the experiment's own point at
3-8 threads (it holds nothing). Every loop counts how often the GIL changed hands between launching threads.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from hw.interfaces.hogwild import cpu_cores, shuffled_rounds
from hw.interfaces.step_costs import step_host_costs
from hw.timing import sync
from parsim.profile import GilCosts
from parsim.sim.gil import wake_points, wake_readings

ELEMENTS = {"cuda": 1024, "cpu": 16}  # small: the device runs each op faster than it is launched
BLOCK = 8  # launches between two looks at the clock
HOLDS_S = tuple(h * 1e-6 for h in (0, 8, 16, 32, 48, 64, 96, 128, 256, 512, 1024))  # extra GIL time, wake-up probes
CROWD_HOLDS_S = (64e-6, 128e-6)  # eight threads: their sleepers idle ~0.5 and ~1 ms, as two threads' at 512, 1024 us
CROWD_THREADS = 8  # the experiment's largest count
SPIN_HZ = 2.0e9  # cycles a second at an H100's or H200's top SM clock (1.98 GHz): a spin lasts at least its time
WINDOW_S = 0.04  # one timing of a point: many short ones in shuffled turns, their mean (launch_rounds)
EXPERIMENT_ROUNDS = 70  # the experiment's windows per thread count: 2.8 s of each in all
CALIBRATION_ROUNDS = 32  # hw calibrate's windows per probe: 1.3 s of each, as 5 of 0.25 s were


def keep_clocks_up(device: torch.device, seconds: float) -> bool:
    """A kernel spinning for `seconds` on a stream of its own, so that the GPU stays at its working clocks while tiny
    kernels are timed (idle, it clocks down and a kernel may outlast its launch). False without a GPU or
    torch.cuda._sleep."""
    if device.type != "cuda" or not hasattr(torch.cuda, "_sleep"):
        return False
    # a high-priority stream: torch hands streams out of per-priority pools in turn, so the launching threads'
    # (default priority) never get one that still holds a spin
    with torch.cuda.stream(torch.cuda.Stream(device, priority=-1)):
        torch.cuda._sleep(int(seconds * SPIN_HZ))
    return True


def launch_loop(device: torch.device, threads: int, window_s: float, hold_s: float = 0.0,
                cpus: tuple[int, ...] = ()) -> dict:
    """`threads` threads, each launching `y = x + 1` on a stream of its own until window_s has passed (and
    holding the GIL hold_s more after each launch, spinning in Python): host time per launch of all of them.
    With `cpus`, thread i runs on CPU cpus[i] alone (lab/gil/core_pairs.py); else where the OS puts it.

    Timed from their common start until the last has stopped, over all their launches; each looks at the clock every
    BLOCK launches, so a thread asleep at the deadline finishes its block first (each runs one block at least). A GPU is
    kept busy meanwhile (keep_clocks_up). Kept beside it: each thread's launches (who got the GIL), how often the GIL
    changed hands between them (switches: a launch by another thread than the one before) and how long their streams
    took to finish afterwards (drain_s: more than a few kernels' time means the device, not the host, set the pace).
    """
    xs = [torch.ones(ELEMENTS[device.type], device=device) for _ in range(threads)]
    streams = [torch.cuda.Stream(device) if device.type == "cuda" else None for _ in range(threads)]
    go = threading.Barrier(threads + 1)
    counts, ends, deadline = [0] * threads, [0.0] * threads, [0.0]
    last, takes = [-1], [0]  # the thread that launched last; launches that followed another thread's
    clock = time.perf_counter

    def work(i: int) -> None:
        x, n = xs[i], 0
        if cpus:
            os.sched_setaffinity(0, {cpus[i]})
        with torch.cuda.stream(streams[i]) if streams[i] is not None else contextlib.nullcontext():
            go.wait()
            end = deadline[0]
            while True:  # a block at least: on a busy host the deadline can pass before a thread wakes
                for _ in range(BLOCK):
                    x + 1
                    if last[0] != i:  # under the GIL: no other thread runs between the test and the update
                        last[0] = i
                        takes[0] += 1
                    if hold_s:
                        until = clock() + hold_s
                        while clock() < until:
                            pass
                n += BLOCK
                if clock() >= end:
                    break
        counts[i], ends[i] = n, clock()

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    spinning = keep_clocks_up(device, window_s)
    start = clock()
    deadline[0] = start + window_s
    go.wait()
    for w in workers:
        w.join()
    elapsed = max(ends) - start
    t0 = clock()
    for stream in streams:
        if stream is not None:
            stream.synchronize()
    return {"per_launch_s": elapsed / sum(counts), "launches": counts, "switches": max(takes[0] - 1, 0),
            "drain_s": clock() - t0, "clocks_kept_up": spinning}


def launch_rounds(device: torch.device, points: tuple[tuple, ...], window_s: float,
                  rounds: int) -> dict[tuple, dict]:
    """Per point (threads, hold_s[, tag]): the mean time per launch over rounds, and every round's loop, the points in
    shuffled turns (hw.interfaces.hogwild.shuffled_rounds). A tag keeps two timings of one (threads, hold_s) apart
    (a calibration's probe and the experiment's point). Rounds should be many and windows short (WINDOW_S): a vCPU's
    speed flips from one 0.1 s window to the next."""
    for n, hold, *_ in points:  # warm-up: streams, the allocator's blocks, first launches
        launch_loop(device, n, min(window_s, 0.05), hold)
    raw = shuffled_rounds(points, rounds, lambda p: launch_loop(device, p[0], window_s, p[1]))
    return {p: {"per_launch_s": statistics.mean(r["per_launch_s"] for r in v), "rounds": v}
            for p, v in raw.items()}


def launch_times(device: torch.device, counts: tuple[int, ...], window_s: float, rounds: int) -> dict[int, dict]:
    """The experiment: per thread count, the mean time per launch of all threads over rounds (no extra hold)."""
    times = launch_rounds(device, tuple((n, 0.0) for n in counts), window_s, rounds)
    return {n: times[(n, 0.0)] for n in counts}


@contextlib.contextmanager
def unfused() -> Iterator[None]:
    """TorchScript without its tensor-expression fuser, which would fuse a loop's elementwise ops into fewer
    kernels (torch.jit.fuser("none") does the same, with a warning per call about nvfuser on torch 2.11)."""
    texpr, gpu = torch._C._jit_texpr_fuser_enabled(), torch._C._jit_can_fuse_on_gpu()
    torch._C._jit_set_texpr_fuser_enabled(False)
    torch._C._jit_override_can_fuse_on_gpu(False)
    try:
        yield
    finally:
        torch._C._jit_set_texpr_fuser_enabled(texpr)
        torch._C._jit_override_can_fuse_on_gpu(gpu)


def released_s(device: torch.device, launches: int = 500, repeat: int = 20) -> float | None:
    """Seconds per op of `y = y + 1` issued by a TorchScript loop (no Python per op), its fuser off; None if
    TorchScript fails. Not a launch's C++ part alone (the interpreter's cost per op stands in for Python's), so
    gil_costs does not use it; lab scripts time it beside theirs."""
    try:
        with warnings.catch_warnings(), unfused():
            warnings.simplefilter("ignore")  # TorchScript is deprecated; it still runs the op without Python

            @torch.jit.script
            def loop(y: torch.Tensor, n: int) -> torch.Tensor:
                for _ in range(n):
                    y = y + 1
                return y

            x = torch.ones(ELEMENTS[device.type], device=device)
            times = []
            for k in range(repeat + 3):  # the first calls profile and optimise the loop
                sync(device)  # each call queues fewer kernels than the device's queue holds
                t0 = time.perf_counter()
                loop(x, launches)
                if k >= 3:
                    times.append((time.perf_counter() - t0) / launches)
            sync(device)
    except Exception as e:  # noqa: BLE001 - the model holds the GIL all the launch then, and says so
        print(f"warning: the GIL-free part of a launch not timed ({type(e).__name__}: {e})", file=sys.stderr)
        return None
    return statistics.median(times)


def thread_cost_s(repeat: int = 200) -> float:
    """Starting and joining one Python thread that does nothing (DataParallel's parallel_apply does it per GPU)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        t = threading.Thread(target=lambda: None)
        t.start()
        t.join()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def replicate_module_s(device: torch.device, blocks: int = 8, repeat: int = 20) -> float | None:
    """Python time of nn.parallel.replicate per module per replica, replicating onto this GPU alone (CUDA only)."""
    if device.type != "cuda":
        return None
    from hw.nets.blocks import MlpBlock

    model = nn.Sequential(*(MlpBlock(64) for _ in range(blocks))).to(device)
    modules = len(list(model.modules()))
    for _ in range(3):
        nn.parallel.replicate(model, [device])
    times = []
    for _ in range(repeat):
        sync(device)
        t0 = time.perf_counter()
        nn.parallel.replicate(model, [device])
        times.append(time.perf_counter() - t0)
    sync(device)
    return statistics.median(times) / modules


def gil_costs(device: torch.device, window_s: float = WINDOW_S, rounds: int = CALIBRATION_ROUNDS,
              holds_s: tuple[float, ...] = HOLDS_S, source: str = "", crowd_holds_s: tuple[float, ...] = CROWD_HOLDS_S,
              experiment: tuple[int, ...] = ()) -> tuple[GilCosts, dict]:
    """One thread's time per launch and the wake-up curve from one and two threads launching with each hold in holds_s
    (GIL held longer per launch), with the raw rounds; unused by the model, CROWD_THREADS threads at each of
    crowd_holds_s (`crowd`). The launch's GIL-free part is left unmeasured (released_s None: the model holds the GIL
    all the launch). experiment: thread counts timed in the same rounds apart from the probes: raw["experiment"], and
    the GIL's launch curve (GilCosts.launch_curve), which the model's contended launches follow."""
    points = tuple((n, hold, "probe") for hold in holds_s for n in (1, 2))
    points += tuple(p for hold in crowd_holds_s for p in ((1, hold, "probe"), (CROWD_THREADS, hold, "probe"))
                    if p not in points)
    times = launch_rounds(device, points + tuple((n, 0.0, "experiment") for n in experiment), window_s, rounds)
    one = [times[(1, hold, "probe")]["per_launch_s"] for hold in holds_s]
    launch = times[(1, holds_s[0], "probe")]["per_launch_s"]
    try:
        replicate = replicate_module_s(device)
    except Exception as e:  # noqa: BLE001 - the launch costs stand without it; the scenario says what is missing
        print(f"warning: nn.parallel.replicate not timed ({type(e).__name__}: {e})", file=sys.stderr)
        replicate = None
    thread_s = thread_cost_s()
    wake = wake_points(one, [o + paired_extra(times, n=2, hold=h) for o, h in zip(one, holds_s, strict=True)])
    cores = cpu_cores()
    plain: dict[str, Any] = step_host_costs(device, launch)  # GilCosts' plain-step fields by name
    costs = GilCosts(launch, thread_s, None, wake, cores, replicate, source, **plain,
                     handoff_share=switch_share(times[(2, holds_s[0], "probe")]["rounds"]),
                     launch_curve=tuple((n, times[(n, 0.0, "experiment")]["per_launch_s"]) for n in experiment))
    crowd = []
    for hold in crowd_holds_s:
        alone = times[(1, hold, "probe")]["per_launch_s"]
        ((slept, cost),) = wake_readings(CROWD_THREADS, [alone], [alone + paired_extra(times, CROWD_THREADS, hold)])
        crowd.append({"hold_s": hold, "slept_s": slept, "cost_s": cost})
    raw = {"window_s": window_s, "rounds": rounds, "elements": ELEMENTS[device.type], "block": BLOCK,
           "crowd_threads": CROWD_THREADS, "crowd": crowd,
           "holds": [{"hold_s": hold, "threads": n, **times[(n, hold, tag)]} for n, hold, tag in points]}
    if experiment:
        raw["experiment"] = {n: times[(n, 0.0, "experiment")] for n in experiment}
    return costs, raw


def switch_share(loops: list[dict]) -> float:
    """Of the launches of launch_loop runs, the share that followed another thread's launch (all runs pooled)."""
    return sum(r["switches"] for r in loops) / max(sum(sum(r["launches"]) for r in loops), 1)


def paired_extra(times: dict[tuple, dict], n: int, hold: float) -> float:
    """n threads' extra time per launch over one thread's at the same hold, paired round by round (a drift of
    the host moves both), the median over rounds."""
    return statistics.median(b["per_launch_s"] - a["per_launch_s"] for a, b in
                             zip(times[(1, hold, "probe")]["rounds"], times[(n, hold, "probe")]["rounds"],
                                 strict=True))
