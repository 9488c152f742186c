"""The GIL experiment: N Python threads of one process, each launching small kernels on its own CUDA stream
(on the CPU: small CPU ops), and the costs `parsim.scenarios.interfaces` models it with.

A thread holds the GIL for the Python part of each launch; torch's bindings drop it for the C++ part.
Throughput of all threads together against one thread alone shows how much of a launch overlaps.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import threading
import time

import torch
from torch import nn

from hw.opcosts import sync
from parsim.profile import GilCosts

ELEMENTS = {"cuda": 1024, "cpu": 16}  # small: the device runs each op faster than it is launched


def launch_loop_s(device: torch.device, threads: int, launches: int) -> float:
    """Wall time for `threads` threads to launch `launches` `y = x + 1` each, each thread on a stream of its own.

    Timed from the moment they are released together until the last has launched its last op (host only);
    the device is synchronised afterwards, outside the timing.
    """
    xs = [torch.ones(ELEMENTS[device.type], device=device) for _ in range(threads)]
    streams = [torch.cuda.Stream(device) if device.type == "cuda" else None for _ in range(threads)]
    go = threading.Barrier(threads + 1)

    def work(i: int) -> None:
        x = xs[i]
        with torch.cuda.stream(streams[i]) if streams[i] is not None else contextlib.nullcontext():
            go.wait()
            for _ in range(launches):
                x + 1

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    go.wait()
    t0 = time.perf_counter()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - t0
    sync(device)
    return elapsed


def launch_times(device: torch.device, counts: tuple[int, ...], launches: int, rounds: int) -> dict[int, dict]:
    """Per thread count: host time per launch of all threads together (median over rounds) and every round's.

    The counts take turns within each round, so a drift of the host's speed touches them all alike.
    """
    for n in counts:  # warm-up: streams, the allocator's blocks, first launches
        launch_loop_s(device, n, min(launches, 200))
    raw: dict[int, list[float]] = {n: [] for n in counts}
    for _ in range(rounds):
        for n in counts:
            raw[n].append(launch_loop_s(device, n, launches) / (n * launches))
    return {n: {"per_launch_s": statistics.median(v), "rounds_s": v} for n, v in raw.items()}


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
    from hw.models import MlpBlock

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


def gil_costs(device: torch.device, threads: int = 8, launches: int = 2000, rounds: int = 5,
              source: str = "") -> tuple[GilCosts, dict]:
    """One thread's time per launch and `threads` threads' together (the GIL-bound pace), with the raw rounds."""
    times = launch_times(device, (1, threads), launches, rounds)
    try:
        replicate = replicate_module_s(device)
    except Exception as e:  # noqa: BLE001 - the launch costs stand without it; the scenario says what is missing
        print(f"warning: nn.parallel.replicate not timed ({type(e).__name__}: {e})", file=sys.stderr)
        replicate = None
    costs = GilCosts(times[1]["per_launch_s"], times[threads]["per_launch_s"], threads, thread_cost_s(), replicate,
                     source)
    return costs, {"launches": launches, "rounds": rounds, "elements": ELEMENTS[device.type],
                   "times": {str(n): v for n, v in times.items()}}
