"""Two-thread probes that separate the GIL's two hand-offs per launch: the launch's own and the free of its result.

    python lab/gil/gil_release_probes.py OUT.json [ROUNDS [WINDOW_S [--experiment]]]

The GIL experiment's launch (`x + 1`, hw.interfaces.launch_threads.launch_loop) drops the GIL twice: around dispatch, and around the
free of its result (torch destroys a tensor inside pybind11::gil_scoped_release). hw.interfaces.launch_threads's wake-up probes hold the
GIL longer *after* the statement, so the free's release always wakes a thread that slept a moment only; at 3-8
threads both releases wake threads that slept long (docs/lab/data-parallel-interfaces.md, the GIL experiment's items). Here one and two
threads hold the GIL a set time in one of three places, in shuffled turns within each round (the host drifts):
  alloc-after    `x + 1`, then the hold (as hw.interfaces.launch_threads's probes)
  alloc-between  `y = x + 1`, the hold, `del y`: the free's release wakes a thread that slept through the hold
  out-after      `torch.add(x, 1, out=z)` (neither allocates nor frees: one release), then the hold
and the experiment itself (no hold) at 1-8 threads, allocating and not, as held-out points. Each launching thread
counts how often it went to sleep (its voluntary context switches: a wait on the GIL, on the mutex inside it, or on
another lock); `--experiment` times the experiment's points alone.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's hw, run from anywhere
from hw.interfaces.launch_threads import BLOCK, ELEMENTS, keep_clocks_up, released_s  # noqa: E402
from hw.interfaces.hogwild import machine, shuffled_rounds  # noqa: E402

HOLDS_US = (0, 16, 32, 64, 128, 256)
PLACES = ("alloc-after", "alloc-between", "out-after")


def loop(device: torch.device, threads: int, place: str, hold_s: float, window_s: float) -> dict:
    """`threads` threads launching for window_s as `place` says, each holding the GIL hold_s per launch: the time
    per launch of all, and how often the GIL changed hands between launching threads."""
    xs = [torch.ones(ELEMENTS[device.type], device=device) for _ in range(threads)]
    zs = [torch.empty_like(x) for x in xs]
    streams = [torch.cuda.Stream(device) if device.type == "cuda" else None for _ in range(threads)]
    go = threading.Barrier(threads + 1)
    counts, ends, deadline, last, takes = [0] * threads, [0.0] * threads, [0.0], [-1], [0]
    clock = time.perf_counter

    def spin() -> None:
        until = clock() + hold_s
        while clock() < until:
            pass

    sleeps = [0] * threads

    def work(i: int) -> None:
        x, z, n = xs[i], zs[i], 0
        with torch.cuda.stream(streams[i]) if streams[i] is not None else contextlib.nullcontext():
            go.wait()
            end = deadline[0]
            before = voluntary_switches()
            while clock() < end:
                for _ in range(BLOCK):
                    if place == "alloc-between":
                        y = x + 1
                        if hold_s:
                            spin()
                        del y
                    else:
                        if place == "alloc-after":
                            x + 1
                        else:
                            torch.add(x, 1, out=z)
                        if hold_s:
                            spin()
                    if last[0] != i:
                        last[0] = i
                        takes[0] += 1
                n += BLOCK
        counts[i], ends[i] = n, clock()
        sleeps[i] = voluntary_switches() - before

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    keep_clocks_up(device, window_s)
    start = clock()
    deadline[0] = start + window_s
    go.wait()
    for w in workers:
        w.join()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {"per_launch_s": (max(ends) - start) / sum(counts), "launches": counts, "switches": max(takes[0] - 1, 0),
            "sleeps": sleeps}


def voluntary_switches() -> int:
    """How often the calling thread has gone to sleep (its voluntary context switches, Linux); 0 elsewhere."""
    try:
        status = Path(f"/proc/self/task/{threading.get_native_id()}/status").read_text()
    except OSError:
        return 0
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])


def main() -> None:
    out = Path(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    window_s = float(sys.argv[3]) if len(sys.argv) > 3 else 0.2
    experiment_only = "--experiment" in sys.argv[4:]
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    points = [(place, n, h) for place in PLACES for h in HOLDS_US for n in (1, 2)
              if not (place == "alloc-between" and h == 0)]
    points = [] if experiment_only else points
    points += [(f"experiment-{memory}", n, 0) for memory in ("alloc", "out") for n in range(1, 9)]

    def run(p: tuple) -> dict:
        place, n, h = p
        place = {"experiment-alloc": "alloc-after", "experiment-out": "out-after"}.get(place, place)
        return loop(device, n, place, h * 1e-6, window_s)

    for p in points:  # warm-up: streams, the allocator's blocks, first launches
        loop(device, p[1], "alloc-after", 0.0, 0.02)
    raw = shuffled_rounds(points, rounds, run)
    result = {}
    for (place, n, h), rs in raw.items():
        med = statistics.median(r["per_launch_s"] for r in rs)
        launches = max(sum(sum(r["launches"]) for r in rs), 1)
        share = sum(r["switches"] for r in rs) / launches
        slept = sum(sum(r["sleeps"]) for r in rs) / launches
        print(f"{place:18} {n} threads, hold {h:4d} us: {med * 1e6:7.2f} us a launch, switches {share:4.0%}, "
              f"sleeps {slept:4.2f} a launch")
        result[f"{place}:{n}:{h}"] = {"place": place, "threads": n, "hold_s": h * 1e-6, "per_launch_s": med,
                                      "rounds": rs}
    out.write_text(json.dumps({"command": "python lab/gil/gil_release_probes.py " + " ".join(sys.argv[1:]),
                               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "torch": torch.__version__, "device": torch.cuda.get_device_name(device)
                               if device.type == "cuda" else "cpu", "machine": machine(), "window_s": window_s,
                               "rounds": rounds, "block": BLOCK, "released_s": released_s(device),
                               "points": result}) + "\n")


if __name__ == "__main__":
    main()
