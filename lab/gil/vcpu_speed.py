"""Is a lone launching thread's pace set by the vCPU it lands on? (issue 19)

    python lab/gil/vcpu_speed.py OUT.json [ROUNDS [WINDOW_S]]

The GIL experiment's one thread ran ~8 or ~11 us a launch from one timing to the next within the same rounds
(data/interfaces/h200-2026-11-24-4, -5; h200-2026-11-25-stalls/first: the probe's one thread 10.96 us, the
experiment's 8.55, one call). Each timing starts new threads, which the guest's scheduler places anew. Here one
thread pinned to each CPU in turn (os.sched_setaffinity), in shuffled order each round, launches `x + 1` on a
stream of its own (hw.interfaces.launch_threads.launch_loop's loop, one thread) and runs a pure Python loop: if the pace follows the CPU
round after round, the bimodality is placement.
"""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's hw, run from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lab/ (record)
from hw.interfaces.launch_threads import ELEMENTS, keep_clocks_up  # noqa: E402
import record  # noqa: E402


def pinned(cpu: int, device: torch.device, window_s: float) -> dict:
    out = {}

    def work() -> None:
        os.sched_setaffinity(0, {cpu})
        x = torch.ones(ELEMENTS[device.type], device=device)
        stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        clock = time.perf_counter
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for _ in range(64):
                x + 1
            n, t0 = 0, clock()
            while clock() - t0 < window_s:
                for _ in range(8):
                    x + 1
                n += 8
            out["launch_s"] = (clock() - t0) / n
            n, t0 = 0, clock()
            while clock() - t0 < window_s / 4:
                for _ in range(8):
                    s = 0
                    for i in range(40):
                        s += i
                n += 8
            out["python_s"] = (clock() - t0) / n
        if stream is not None:
            stream.synchronize()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    return out


def main() -> None:
    out = Path(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    window = float(sys.argv[3]) if len(sys.argv) > 3 else 0.08
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    cpus = sorted(os.sched_getaffinity(0))
    runs = {c: [] for c in cpus}
    for k in range(rounds):
        order = random.Random(k).sample(cpus, len(cpus))
        keep_clocks_up(device, window * 1.3 * len(cpus))
        for c in order:
            runs[c].append(pinned(c, device, window))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    for c in cpus:
        print(f"cpu {c:2}: launch " + " ".join(f"{r['launch_s'] * 1e6:5.2f}" for r in runs[c]) + " us; python "
              + " ".join(f"{r['python_s'] * 1e6:4.2f}" for r in runs[c]) + " us", flush=True)
    record.write(out, device, rounds=rounds, window_s=window, runs={str(c): v for c, v in runs.items()},
                 median_launch_s={str(c): statistics.median(r["launch_s"] for r in v) for c, v in runs.items()})


if __name__ == "__main__":
    main()
