"""Does waking a sleeping Python thread cost more on this host when more threads take turns, at the same idle time?

    python lab/gil/wake_ring.py OUT.json [ROUNDS] [WINDOW_S]

Issue 19's known gap: in the GIL experiment a hand-off's gap grew with the thread count at equal waits (12.6 us at 3
threads to 26.7 at 8, data/interfaces/h200-2026-11-24-handoffs). Here no torch and no contention: N threads pass a
baton round a ring (each waits on its own threading.Event, holds the GIL `work_us` spinning, then sets the next
one's), so exactly one thread runs and each of the others sleeps (N-1) turns. A turn's time less its spin is one
wake-up (the futex wake, the woken thread's core coming back, its taking of the GIL); each sleeper's idle time is
(N-1) turns, so the spins, the same at every N, let different N meet at the same idle times. Rounds take the
configurations in a shuffled order.
"""

from __future__ import annotations

import json
import os
import platform
import random
import statistics
import sys
import threading
import time
from pathlib import Path

THREADS = range(2, 9)
WORK_US = (0, 5, 10, 20, 40, 80, 160)  # each turn's spin


def spin_us(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def ring(threads: int, work_us: float, window_s: float) -> tuple[float, int]:
    """Mean seconds per turn while `threads` threads pass the baton for window_s, and the turns taken."""
    events = [threading.Event() for _ in range(threads)]
    stop = threading.Event()
    turns = [0] * threads

    def run(i: int) -> None:
        me, nxt = events[i], events[(i + 1) % threads]
        while True:
            me.wait()
            me.clear()
            if stop.is_set():
                nxt.set()
                return
            spin_us(work_us)
            turns[i] += 1
            nxt.set()

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    t0 = time.perf_counter()
    events[0].set()
    time.sleep(window_s)
    stop.set()
    elapsed = time.perf_counter() - t0
    for w in workers:
        w.join()
    return elapsed / sum(turns), sum(turns)


def main() -> None:
    out = Path(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    window_s = float(sys.argv[3]) if len(sys.argv) > 3 else 0.2
    one_us = statistics.median(ring(1, 0.0, 0.05)[0] for _ in range(3)) * 1e6  # a thread waking itself: no sleep
    configs = [(n, work) for n in THREADS for work in WORK_US]
    rows = []
    for r in range(rounds):
        random.Random(r).shuffle(configs)
        for n, work in configs:
            per_turn, turns = ring(n, work, window_s)
            rows.append({"round": r, "threads": n, "work_us": work, "turn_us": per_turn * 1e6,
                         "wake_us": per_turn * 1e6 - work, "idle_us": (n - 1) * per_turn * 1e6, "turns": turns})
    summary = {}
    for n, work in sorted(configs):
        mine = [x for x in rows if x["threads"] == n and x["work_us"] == work]
        summary[f"{n}:{work}"] = {"threads": n, "work_us": work,
                                  "wake_us": statistics.median(x["wake_us"] for x in mine),
                                  "idle_us": statistics.median(x["idle_us"] for x in mine)}
    out.write_text(json.dumps({"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "python": platform.python_version(), "cpus": os.cpu_count(),
                               "self_set_us": one_us, "summary": summary, "rows": rows}, indent=1))
    for s in summary.values():
        print(f"{s['threads']} threads, spin {s['work_us']:6.1f} us: wake-up {s['wake_us']:6.1f} us "
              f"after {s['idle_us']:6.1f} us idle")


if __name__ == "__main__":
    main()
