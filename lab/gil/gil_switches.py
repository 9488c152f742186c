"""How the GIL changes hands between launching threads: each launch's thread and end time, logged.

    python lab/gil/gil_switches.py [OUT.json]

Two threads (and eight, without a hold) launch `y = x + 1` (on GPU 0's streams where there is a GPU, else CPU ops)
a fixed number of times, each holding the GIL 0, 20 or 80 us longer per launch (spinning in Python). Per run:
time per launch of all, switches (consecutive launches by different threads) and the mean gap between one
thread's consecutive launches, against one thread alone. This is the evidence for `parsim.sim.gil`'s hand-off:
a launching thread keeps the GIL (switches are rare), and each of its launches pays more the longer the other
thread has slept.
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
from hw.interfaces.launch_threads import ELEMENTS  # noqa: E402
from hw.interfaces.hogwild import machine  # noqa: E402
from hw.timing import sync  # noqa: E402


def logged_run(device: torch.device, threads: int, launches: int, hold_s: float) -> dict:
    """`threads` threads launching `launches` each; every launch's (end time, thread)."""
    xs = [torch.ones(ELEMENTS[device.type], device=device) for _ in range(threads)]
    streams = [torch.cuda.Stream(device) if device.type == "cuda" else None for _ in range(threads)]
    go, log, clock = threading.Barrier(threads + 1), [], time.perf_counter

    def work(i: int) -> None:
        x, record = xs[i], log.append
        with torch.cuda.stream(streams[i]) if streams[i] is not None else contextlib.nullcontext():
            go.wait()
            for _ in range(launches):
                x + 1
                record((clock(), i))
                until = clock() + hold_s
                while clock() < until:
                    pass

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    go.wait()
    t0 = clock()
    for w in workers:
        w.join()
    elapsed = clock() - t0
    sync(device)
    log.sort()
    same = [b[0] - a[0] for a, b in zip(log, log[1:]) if a[1] == b[1]]
    return {"threads": threads, "hold_s": hold_s, "per_launch_s": elapsed / len(log),
            "switches": sum(a[1] != b[1] for a, b in zip(log, log[1:])), "elapsed_s": elapsed,
            "same_thread_gap_s": statistics.mean(same) if same else None}


def main() -> None:
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    runs = []
    for hold in (0.0, 20e-6, 80e-6):
        launches = 5000 if hold == 0 else 2000
        logged_run(device, 2, 200, hold)  # warm-up
        for threads in (1, 2):
            runs.append(logged_run(device, threads, launches, hold))
            r = runs[-1]
            print(f"hold {hold * 1e6:3.0f} us, {threads} thread(s): {r['per_launch_s'] * 1e6:7.2f} us per launch, "
                  f"{r['switches']} switches in {r['elapsed_s'] * 1e3:.0f} ms, one thread's launches "
                  f"{r['same_thread_gap_s'] * 1e6:.2f} us apart")
    runs.append(logged_run(device, 8, 2000, 0.0))
    r = runs[-1]
    print(f"8 threads, no hold: {r['per_launch_s'] * 1e6:.2f} us per launch, {r['switches']} switches in "
          f"{r['elapsed_s'] * 1e3:.0f} ms")
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({"device": str(device), "machine": machine(), "torch": torch.__version__, "runs": runs}, f,
                      indent=2)


if __name__ == "__main__":
    main()
