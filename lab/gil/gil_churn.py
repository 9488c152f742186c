"""Does GIL-held Python work run slower when the GIL changes hands among more threads? No torch. (issue 19)

    python lab/gil/gil_churn.py OUT.json [ROUNDS [WINDOW_S [FREE_US,... [THREADS,...]]]]

In the GIL experiment eight threads' held work per launch was 2.2-2.5x what one launcher's was beside seven
GIL-free launchers (lab/gil/gil_stalls.py, data/interfaces/h200-2026-11-25-stalls), and a thread's first work after
a blocking wait only 0.5-2 us slower (lab/gil/cold_start.py). Here N = 1..8 threads each loop: time a piece of pure
Python work (`held`, the GIL held), then call a C function that drops the GIL and spins FREE_US without it (ctypes
releases the GIL around a foreign call), as a launch drops it for its dispatch. Per N and FREE_US: the held work's
time (median and mean), the time per iteration of all threads, and how often the GIL changed hands. If the held
work slows with N here, the slowdown is the GIL's hand-offs' own, and a model can take it from this probe. The
spin is lab/gil/cold_start.py's (the runs of 2026-11-25 had a copy of it here).
"""

from __future__ import annotations

import ctypes
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's hw, run from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lab/ (record)
from hw.interfaces.hogwild import shuffled_rounds  # noqa: E402
import record  # noqa: E402
from cold_start import build  # noqa: E402

COUNTS = (1, 2, 3, 4, 6, 8)
FREE_US = (2, 8)  # a short release (a tensor's free) and about a dispatch's


def python_work() -> None:
    s = 0
    for i in range(40):
        s += i


def churn(lib: ctypes.CDLL, threads: int, free_us: float, window_s: float) -> dict:
    go = threading.Barrier(threads + 1)
    held = [[] for _ in range(threads)]
    counts, ends, deadline, last, takes = [0] * threads, [0.0] * threads, [0.0], [-1], [0]
    clock = time.perf_counter
    free_ns = int(free_us * 1000)

    def work(i: int) -> None:
        mine, n = held[i], 0
        go.wait()
        end = deadline[0]
        while clock() < end:
            t0 = clock()
            python_work()
            mine.append(clock() - t0)
            if last[0] != i:
                last[0] = i
                takes[0] += 1
            lib.spin(free_ns)
            n += 1
        counts[i], ends[i] = n, clock()

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    start = clock()
    deadline[0] = start + window_s
    go.wait()
    for w in workers:
        w.join()
    times = [t for h in held for t in h]
    return {"per_iteration_s": (max(ends) - start) / sum(counts), "held_median_s": statistics.median(times),
            "held_mean_s": statistics.mean(times), "iterations": counts, "switches": max(takes[0] - 1, 0)}


def main() -> None:
    out = Path(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    window = float(sys.argv[3]) if len(sys.argv) > 3 else 0.04
    frees = tuple(float(x) for x in sys.argv[4].split(",")) if len(sys.argv) > 4 else FREE_US
    counts = tuple(sorted({1, *(int(x) for x in sys.argv[5].split(","))})) if len(sys.argv) > 5 else COUNTS
    lib = build()
    points = [(n, f) for f in frees for n in counts]
    for p in points:
        churn(lib, *p, 0.01)  # warm-up
    runs = shuffled_rounds(points, rounds, lambda p: churn(lib, *p, window))
    results = {}
    for (n, f), rs in runs.items():
        base = runs[(1, f)]
        row = {k: statistics.mean(r[k] for r in rs) for k in ("per_iteration_s", "held_median_s", "held_mean_s")}
        row["switch_share"] = sum(r["switches"] for r in rs) / sum(sum(r["iterations"]) for r in rs)
        row["held_mean_over_one"] = row["held_mean_s"] / statistics.mean(r["held_mean_s"] for r in base)
        results[f"{n}:{f}"] = {"threads": n, "free_us": f, **row, "rounds": rs}
        print(f"free {f} us, {n} threads: {row['per_iteration_s'] * 1e6:6.2f} us an iteration of all, held work "
              f"median {row['held_median_s'] * 1e6:5.2f} mean {row['held_mean_s'] * 1e6:5.2f} us "
              f"({row['held_mean_over_one']:.2f}x one thread's), GIL changed hands at {row['switch_share']:.0%}",
              flush=True)
    record.write(out, torch.device("cpu"), rounds=rounds, window_s=window, results=results)


if __name__ == "__main__":
    main()
