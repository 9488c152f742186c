"""Offline trial 3 (issue 19): the GIL experiment with CPython 3.12's GIL as glibc runs it (its mutex a lock whose
contended waiters sleep, its condition signalling only unsignalled waiters), the launch path's contention, and a
slower next part after a thread slept.

    . .venv/bin/activate && python lab/gil/gil_mutex_trial.py [--quick] [--lease DIR --signal US] [--wake 9,15]
        [--penalties FUTEX_HELD:SLEEP_HELD:SLEEP_DISPATCH,...|cold] [--beta-on all|free|none]

What is modelled (`simulate`, an event simulation; nothing is fitted to the experiment's points):
  * N threads on cores of their own, each launch a cycle of (GIL-held, GIL-free) parts: the traced split at one
    thread (lab/gil/gil_race_trial2.py `traced_split`, data/interfaces/h200-2026-11-25-gil-trace), scaled to T1.
  * drop_gil: lock the mutex; locked = 0; if an unsignalled waiter sleeps on the condition, signal the oldest (a
    futex wake: the signaller spends C inside the mutex); unlock (a futex wake of one mutex sleeper, if any: C
    again). take_gil: lock the mutex; while locked: wait on the condition (unlock, sleep); on the wake relock;
    take; unlock. A futex sleeper runs again WAKE after its wake. Locking a held mutex sleeps (glibc's normal
    mutex does not spin); a sleeper woken by an unlock retries and may lose to a thread that came meanwhile.
  * The launch path's contention (`beta_of`: the GIL-free TorchScript loops of the same lease, per launch
    a (1 + beta (N - 1)) / N): a part started while m other threads do launch work lasts 1 + beta m times longer
    (--beta-on all: held and GIL-free parts; held Python work alone does not slow down beside GIL-free launchers,
    lab/gil/held_interference.py, but a launching thread's held parts do, lab/gil/gil_stalls.py --background).
  * Penalties: a thread's next held part FUTEX_HELD longer after any futex call of its own (sleep, signal, wake of
    a mutex sleeper), SLEEP_HELD longer after it slept, its next dispatch SLEEP_DISPATCH longer after it slept.
    `cold` takes the last two from the lease's lab/gil/cold_start.py (`sleep_penalties`: a tensor attribute read
    and a launch run first after a blocking wait, less the same after a spin on a hot core).

Result (2026-11-25, --lease data/interfaces/h200-2026-11-25-lease: the experiment in 70 windows of 0.04 s, T1 its
calibration's one thread 10.93 us, beta 0.35 from that lease's loops, --signal 1.55: the median of the slow
signals in its gil_stalls run; WAKE 9 us, the median condition wait at two threads there, or 15 us, its wake ring
at ~100 us idle), error at N = 1..8:
  no penalty                      +2  -14  -39  -54  -59  -60  -56  -52%   (the GIL is held a fifth of a launch)
  cold (held +1.42, dispatch +9.23 after a sleep)
                                  +2  +11  -18  -39  -46  -47  -41  -35%   (WAKE 15)
  2.5 us held after any futex     +2  +15   +9   -9  -12  -13   -9   -6%   (WAKE 15; worst 15.2%)
  1.8 / 3.7 us held after futex   worst 27% / 43%: the model tips from too fast to too slow within the range the
                                  cold-start probes span (a Python loop +1.5-2.2 us first after a wait, an
                                  attribute read +2.2-4.5), because a longer hold makes more waits, which make
                                  longer holds.
A thread that signals a sleeper runs its next work no slower (cold_start.py `signal` against `hot`, 06:18 UTC), so
the 2.5 us after any futex call is not a calibration: the probes give ~1-1.5 us after a sleep and nothing after a
signal, and with those the model is 18-47% fast at 3-8 threads. What makes the held parts ~2.5x longer at eight
threads than beside seven GIL-free launchers (lab/gil/gil_stalls.py) is still not measured on its own.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
import sys
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gil_race_trial import LaunchMeter, load_release_probes  # noqa: E402
from gil_race_trial2 import (ROOT, UNFUSED, contention_fit, loop_times, traced_split,  # noqa: E402
                             traced_wake_cost)

SIGMA = 0.2  # log-normal jitter on every wake-up and every part
SECTION_S = 0.05e-6  # the mutex's own section (lock, flag, unlock) without a syscall


def simulate(threads, segs, c, wake, beta=0.0, beta_all=False, launches=2000, seed=1, futex_held=0.0,
             sleep_held=0.0, sleep_dispatch=0.0):
    """Time per launch of all threads, condition waits and mutex sleeps per launch. segs: [(held_s, free_s)], the
    last free part the dispatch. A thread's next held part is futex_held longer after it made a futex call (slept,
    signalled a sleeper, woke a mutex sleeper), and sleep_held longer after it slept; its next dispatch
    sleep_dispatch longer after it slept."""
    rng = random.Random(seed)
    jit = lambda x: x * math.exp(SIGMA * rng.gauss(0.0, 1.0) - SIGMA * SIGMA / 2)  # noqa: E731
    heap, seq = [], 0

    def at(t, th, what):
        nonlocal seq
        heapq.heappush(heap, (t, seq, th, what))
        seq += 1

    nseg = len(segs)
    locked = False
    mutex_owner = None
    mutex_sleepers: deque = deque()
    cond_unsignalled: deque = deque()
    working = set()
    seg = [0] * threads
    after_mutex = [None] * threads  # what a thread does once it owns the mutex: "drop" or "take"
    nxt = [None] * threads  # its part after the mutex's release, or None (asleep on the condition)
    waits = msleeps = 0
    meter = LaunchMeter(30 * threads, launches)
    futexed = [False] * threads  # a futex call since its last held part
    slept = [False] * threads  # a sleep since its last held part
    slept_d = [False] * threads  # a sleep since its last dispatch

    def work(th, t, amount, contended):
        m = len(working)
        working.add(th)
        at(t + jit(amount) * (1 + beta * m if contended else 1.0), th, "worked")

    def lock(th, t, then):
        """Try the mutex; returns True if owned now (the caller goes on at t)."""
        nonlocal mutex_owner, msleeps
        after_mutex[th] = then
        if mutex_owner is None:
            mutex_owner = th
            at(t, th, "owned")
        else:
            mutex_sleepers.append(th)
            msleeps += 1
            futexed[th] = slept[th] = slept_d[th] = True

    def unlock(th, t):
        """Release the mutex at t; returns the time the releaser goes on (a futex wake costs it C)."""
        nonlocal mutex_owner
        mutex_owner = None
        if mutex_sleepers:
            futexed[th] = True
            w = mutex_sleepers.popleft()
            at(t + jit(wake), w, "mutex_retry")
            return t + jit(c)
        return t

    for th in range(threads):
        at(th * 1e-7, th, "want")
    while True:
        t, _, th, what = heapq.heappop(heap)
        if what == "worked":
            working.discard(th)
            k = seg[th] % nseg
            if after_mutex[th] == "held":
                lock(th, t, "drop")
            else:
                lock(th, t, "take")
        elif what in ("want", "mutex_retry", "cond_woken"):
            if what == "want":
                lock(th, t, "take")
            elif what == "mutex_retry":
                lock(th, t, after_mutex[th])
            else:
                lock(th, t, "take")
        elif what == "owned":
            if after_mutex[th] == "drop":
                locked = False
                k = seg[th] % nseg
                seg[th] += 1
                if k == nseg - 1 and (steady := meter.done(t, waits, msleeps)):
                    return steady
                t2 = t + SECTION_S
                if cond_unsignalled:
                    futexed[th] = True
                    w = cond_unsignalled.popleft()
                    t2 += jit(c)
                    at(t2 + jit(wake), w, "cond_woken")
                free = segs[k][1]
                if k == nseg - 1 and slept_d[th]:
                    free += sleep_dispatch
                    slept_d[th] = False
                nxt[th] = ("free", free)
            elif locked:  # take, the GIL held: wait on the condition (unlocks the mutex)
                waits += 1
                cond_unsignalled.append(th)
                futexed[th] = slept[th] = slept_d[th] = True
                t2 = t + SECTION_S
                nxt[th] = None
            else:
                locked = True
                t2 = t + SECTION_S
                extra = futex_held * futexed[th] + sleep_held * slept[th]
                futexed[th] = slept[th] = False
                nxt[th] = ("held", segs[seg[th] % nseg][0] + extra)
            at(t2, th, "release")
        elif what == "release":
            t3 = unlock(th, t)
            if nxt[th] is not None:
                after_mutex[th], amount = nxt[th]
                work(th, t3, amount, after_mutex[th] == "free" or beta_all)


def beta_of(path):
    """The launch path's contention from GIL-free loops (an alloc-contention JSON), as trial 2 reads them
    (`contention_fit`: per launch = a (1 + beta (N - 1)) / N)."""
    return contention_fit(loop_times(path))[1]


def load_lease(folder):
    """A measure-interfaces run with the experiment in short windows (data-parallel.json, its calibration's one
    thread as T1) and the GIL-free loops (alloc-contention.json) of the same lease."""
    d = json.loads((folder / "data-parallel.json").read_text())
    exp = {n: d["measured"][f"launch_threads{n}_s"] for n in range(1, 9)}
    t1 = next(q["per_launch_s"] for q in d["raw"]["calibration"]["holds"] if q["threads"] == 1 and q["hold_s"] == 0)
    return {"name": folder.name, "exp": {"alloc": exp}, "t1": {"alloc": t1}}, beta_of(folder / "alloc-contention.json")


def sleep_penalties(folder):
    """(held, dispatch) extra after a sleep, from the lease's lab/gil/cold_start.py run: the first run of a work
    after the thread blocked less after it spun (`block` less `hot`, sleeps of 0-100 us, the median), a tensor
    attribute read standing for a held part and the launch less it for the dispatch."""
    r = json.loads((folder / "cold-start.json").read_text())["results"]

    def extra(work):
        return statistics.median(r[f"block:{work}:{us}"]["cold_s"] - r[f"hot:{work}:{us}"]["cold_s"]
                                 for us in (0, 20, 50, 100))

    held = extra("attrs")
    return held, max(extra("launch") - held, 0.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--wake", default="9,15", help="WAKE values to scan, us")
    ap.add_argument("--beta-on", default="all", choices=("free", "all", "none"))
    ap.add_argument("--penalties", default="0:0:0",
                    help="FUTEX_HELD:SLEEP_HELD:SLEEP_DISPATCH us, comma-separated triples; 'cold' for the lease's "
                         "lab/gil/cold_start.py (0:held:dispatch, sleep_penalties)")
    ap.add_argument("--lease", default="", help="only this measure-interfaces folder (T1 from its calibration)")
    ap.add_argument("--signal", type=float, default=0.0, help="C, us (default: the old trace's)")
    args = ap.parse_args()
    launches = 800 if args.quick else 2500
    fa, *_ = traced_split("alloc-after:1", 4)
    fo, *_ = traced_split("out-after:1", 1)
    split = {"alloc": fa, "out": fo}
    c = args.signal * 1e-6 if args.signal else traced_wake_cost()[0]
    first = ROOT / "h200-2026-11-25-stalls/first"
    runs = [(load_release_probes(first / "release-probes.json"), beta_of(first / "alloc-contention.json")),
            (load_release_probes(UNFUSED / "release-probes-4.json"),
             beta_of(UNFUSED / "alloc-contention-unfused.json"))]
    if args.lease:
        runs = [load_lease(Path(args.lease))]
    triples = []
    for t in args.penalties.split(","):
        if t == "cold":
            held, dispatch = sleep_penalties(Path(args.lease))
            triples.append((0.0, held, dispatch))
            print(f"after a sleep (cold_start.py): held part +{held * 1e6:.2f} us, dispatch +{dispatch * 1e6:.2f} us")
        else:
            triples.append(tuple(float(x) * 1e-6 for x in t.split(":")))
    for pen in triples:
        for wake_us in [float(x) for x in args.wake.split(",")]:
            for run, beta_run in runs:
                beta = 0.0 if args.beta_on == "none" else beta_run
                for kind in run["exp"]:
                    meas = run["exp"][kind]
                    # the lease's calibration's one thread, else the experiment's own (the shape on trial)
                    t1 = run["t1"][kind] if args.lease else meas[1]
                    segs = [(h * t1, f * t1) for h, f in split[kind]]
                    pred = {}
                    for n in range(1, 9):
                        sims = [simulate(n, segs, c, wake_us * 1e-6, beta, args.beta_on == "all", launches, sd, *pen)
                                for sd in (1, 2)]
                        pred[n] = tuple(statistics.mean(s[i] for s in sims) for i in range(3))
                    err = {n: pred[n][0] / meas[n] - 1 for n in range(1, 9)}
                    tag = ":".join(f"{x * 1e6:.1f}" for x in pen)
                    print(f"penalties {tag:13} wake {wake_us:4.1f} beta {beta:.2f} {run['name'][:22]:22} {kind:5}"
                          + "".join(f"{err[n]:+6.0%}" for n in range(1, 9))
                          + f"  worst {max(abs(e) for e in err.values()):5.1%}  waits "
                          + " ".join(f"{pred[n][1]:.1f}" for n in range(1, 9)))


if __name__ == "__main__":
    main()
