"""Offline trial: CPython 3.12's GIL as its mutex + condition variable, simulated, against the release probes.

    [SHORT=1] [RELEASED_SHARE=0.8] python lab/gil/gil_cpython_trial.py [DIR]   # data/interfaces/h200-2026-11-25-release-probes

RELEASED_SHARE: a launch's GIL-free part as this share of one thread's allocating launch, in place of the TorchScript
loop's `released_s` (lab/gil/gil_trace.py found ~0.8 where `released_s` says ~0.1).

Python/ceval_gil.c (3.12) keeps the GIL as a flag `locked` guarded by a pthread mutex (glibc default: no spin; a
contended lock futex-waits) and a condition variable:
  drop_gil: lock mutex; locked = 0; cond_signal (a futex wake syscall if a waiter is queued); unlock mutex.
  take_gil: lock mutex; while locked: cond_wait (unlock mutex, sleep; woken: re-lock mutex); locked = 1; unlock.
glibc details kept: the mutex's unlock is an exchange to 0 and, if the lock word was 2 ("contended": set by a
thread that slept on it, and always by pthread_cond_wait's re-lock), a futex wake syscall, paid even with nobody
queued; a woken mutex waiter retries (barging: it may find the mutex retaken and sleep again); a woken cond waiter
that finds the GIL retaken waits again, at the back (a spurious wake, one more sleep). CPython's 5 ms timed wait
(forced switching) is left out: no thread waits that long here.

Each thread runs on a core of its own (16 vCPUs, at most 8 threads). A launch:
  alloc: held pre -> drop -> dispatch (GIL-free) -> take -> then SHORT times: a share of held post -> drop -> a short
         GIL-free part F (the free's among them) -> take. SHORT = 3 (environment variable SHORT): an allocating
         launch drops the GIL four times (lab/gil/gil_locks.py); SHORT=1 is the free's release alone.
  out:   held pre -> drop -> dispatch (GIL-free) -> take -> held post
and the probes' extra hold after the launch (alloc-after, out-after) or before the first short release
(alloc-between).

Costs (fitted, see FREE): a sleeper woken by a futex wake runs L(idle) after the waker's syscall starts, L
log-linear through knots at IDLE_KNOTS_S (idle = how long it slept), times a log-normal jitter (SIGMA, fixed);
the waker spends K * L(idle) in that syscall (same jitter: on a VM the IPI path is shared), at least S0; a futex
wake with nobody asleep (the unlock of a "contended" word) costs S0; each mutex section (lock, a few stores,
unlock) C. The held part of a launch is the one-thread time less the GIL-free parts less the uncontended GIL
cycles; a share P of it is before dispatch; the free's GIL-free part is F, the dispatch's released_s - F
(out: the same dispatch).

Calibration: one thread's times (alloc-after and out-after, hold 0: the held parts; every probe's own one-thread
time: its hold), released_s, and the two-thread hold probes at 16-256 us of all three places, two observables
each: time over one thread and sleeps per launch. Two threads at hold 0 are the experiment's N=2 and are not used.
release-probes.json and -2.json have no sleep counts: their L knots are refitted to their times with the other
parameters as -3 fitted them. The experiment (1-8 threads, alloc and out) is predicted, never fitted.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import random
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np
from scipy.optimize import minimize

DIR = Path(__file__).resolve().parents[2] / "data/interfaces/h200-2026-11-25-release-probes"
HOLDS_US = (16, 32, 64, 128, 256)
SHORT = int(os.environ.get("SHORT", "3"))  # short releases of an allocating launch after the dispatch (1: the free's)
PLACES = ("alloc-after", "alloc-between", "out-after")
IDLE_KNOTS_S = (2e-6, 20e-6, 200e-6)
SIGMA = 0.25  # log-normal spread of a wake-up (fixed, not fitted)
FREE = ("L2", "L20", "L200", "K", "S0", "C", "P", "F")
START = {"L2": 3e-6, "L20": 5e-6, "L200": 8e-6, "K": 0.9, "S0": 0.4e-6, "C": 0.1e-6, "P": 0.6, "F": 0.2e-6}
BOUNDS = {"L2": (0.3e-6, 30e-6), "L20": (0.3e-6, 40e-6), "L200": (0.3e-6, 60e-6), "K": (0.0, 1.0),
          "S0": (0.05e-6, 2e-6), "C": (0.02e-6, 0.5e-6), "P": (0.05, 0.95), "F": (0.02e-6, 0.3e-6)}


class Sim:
    """N threads, the GIL flag, its mutex and condition variable; an event heap of thread resumptions."""

    def __init__(self, prm: dict, seed: int = 1):
        self.prm = prm
        self.rng = random.Random(seed)
        self.now = 0.0
        self.heap: list = []
        self.seq = 0
        self.locked = False
        self.m_owner = None
        self.m_word = 0  # glibc lock word: 0 free, 1 locked, 2 locked and maybe waited on
        self.m_waiters: deque = deque()
        self.c_waiters: deque = deque()
        self.asleep: dict = {}  # thread -> when it went to sleep
        self.signalled: set = set()  # cond waiters signalled before they slept
        self.sleeps = 0
        self.gens: list = []
        lk = [math.log(prm[k]) for k in ("L2", "L20", "L200")]
        self._lx = [math.log(x) for x in IDLE_KNOTS_S]
        self._ly = lk

    def lat(self, idle: float) -> float:
        x = math.log(max(idle, 1e-9))
        return math.exp(float(np.interp(x, self._lx, self._ly))) * math.exp(SIGMA * self.rng.gauss(0, 1))

    def at(self, t: float, th: int) -> None:
        heapq.heappush(self.heap, (t, self.seq, th))
        self.seq += 1

    def sleep(self, th: int) -> None:
        self.sleeps += 1
        self.asleep[th] = self.now

    def wake(self, th: int) -> float:
        """Futex-wake sleeping `th`: it runs L later; returns the waker's syscall time."""
        idle = self.now - self.asleep.pop(th)
        lat = self.lat(idle)
        self.at(self.now + lat, th)
        return max(self.prm["K"] * lat, self.prm["S0"])

    # --- glibc mutex ---
    def lock(self, th: int, word: int = 1):
        if self.m_owner is None:
            self.m_owner, self.m_word = th, word
            return
        while True:
            self.m_word = 2
            self.m_waiters.append(th)
            self.sleep(th)
            yield None  # woken by an unlock
            if self.m_owner is None:
                self.m_owner, self.m_word = th, 2
                return

    def unlock(self, th: int):
        word = self.m_word
        self.m_owner, self.m_word = None, 0
        if word == 2:
            if self.m_waiters:
                yield self.wake(self.m_waiters.popleft())
            else:
                yield self.prm["S0"]

    # --- glibc condition variable ---
    def cond_wait(self, th: int):
        self.c_waiters.append(th)
        yield from self.unlock(th)
        if th in self.signalled:  # signalled during the unlock's syscall: the futex word moved, no sleep
            self.signalled.discard(th)
        else:
            self.sleep(th)
            yield None
        yield from self.lock(th, 2)  # __pthread_mutex_cond_lock: word 2

    def signal(self, th: int):
        if self.c_waiters:
            w = self.c_waiters.popleft()
            if w in self.asleep:
                yield self.wake(w)
            else:
                self.signalled.add(w)
                yield self.prm["S0"]

    # --- ceval_gil.c ---
    def drop_gil(self, th: int):
        yield from self.lock(th)
        yield self.prm["C"] / 2
        self.locked = False
        yield from self.signal(th)
        yield from self.unlock(th)

    def take_gil(self, th: int):
        yield from self.lock(th)
        yield self.prm["C"] / 2
        while self.locked:
            yield from self.cond_wait(th)
        self.locked = True
        self.holder = th
        yield from self.unlock(th)

    def run(self, threads: int, body, launches: int, warm: int) -> tuple[float, float, float]:
        """(time per launch, sleeps per launch, share of launches that followed another thread's)."""
        self.count = 0
        self.mark = None
        self.last = -1
        self.switches = 0
        done = [False]

        def thread(th: int):
            yield from self.take_gil(th)
            while not done[0]:
                yield from body(self, th)
                self.count += 1
                if self.count == warm:
                    self.mark = (self.now, self.sleeps, self.switches)
                if self.last != th and self.count > warm:
                    self.switches += 1
                self.last = th
                if self.count == warm + launches:
                    done[0] = True
                    self.end = (self.now, self.sleeps, self.switches)

        self.gens = [thread(i) for i in range(threads)]
        for i in range(threads):
            self.at(i * 0.37e-6, i)
        while not done[0] and self.heap:
            t, _, th = heapq.heappop(self.heap)
            self.now = t
            g = self.gens[th]
            while True:
                d = next(g, None)
                if d is None:
                    break
                if d > 0:
                    self.at(self.now + d, th)
                    break
        (t0, s0, w0), (t1, s1, w1) = self.mark, self.end
        return (t1 - t0) / launches, (s1 - s0) / launches, (w1 - w0) / launches


def body_for(place: str, segs: dict, hold: float):
    pre, post, disp, free = segs["pre"], segs["post"], segs["disp"], segs["free"]
    alloc = place != "out-after"
    if not alloc:
        pre, post = segs["opre"], segs["opost"]

    def body(sim: Sim, th: int):
        yield pre
        yield from sim.drop_gil(th)
        yield disp
        yield from sim.take_gil(th)
        if not alloc:
            yield post
        else:
            for k in range(SHORT):
                yield post / SHORT
                if place == "alloc-between" and k == 0:
                    yield hold
                yield from sim.drop_gil(th)
                yield free
                yield from sim.take_gil(th)
        if place != "alloc-between" and hold > 0:
            yield hold
    return body


def segments(prm: dict, one: dict, released: float) -> dict:
    """The held parts from one thread's times: a launch alone is held + GIL-free parts + its uncontended cycles."""
    cyc = prm["C"]  # a drop and a take: half a mutex section each (uncontended: no syscalls)
    disp = released - prm["F"]
    held = max(one["alloc"] - (released - prm["F"]) - SHORT * prm["F"] - (1 + SHORT) * cyc, 0.2e-6)
    oheld = max(one["out"] - disp - cyc, 0.2e-6)
    return {"pre": prm["P"] * held, "post": (1 - prm["P"]) * held, "disp": disp, "free": prm["F"],
            "opre": prm["P"] * oheld, "opost": (1 - prm["P"]) * oheld}


def simulate(prm, one, released, place, threads, hold, launches=240, warm=40, seed=1):
    segs = segments(prm, one, released)
    return Sim(prm, seed).run(threads, body_for(place, segs, hold), launches, warm)


def load(path: Path) -> dict:
    d = json.loads(path.read_text())
    pts = {}
    for key, p in d["points"].items():
        rs = p["rounds"]
        n = max(sum(sum(r["launches"]) for r in rs), 1)
        sl = sum(sum(r["sleeps"]) for r in rs) / n if all("sleeps" in r for r in rs) else None
        pts[key] = (p["per_launch_s"], sl, sum(r["switches"] for r in rs) / n)
    share = float(os.environ.get("RELEASED_SHARE", "0"))  # the GIL-free share of a launch alone, if given
    return {"released": share * pts["alloc-after:1:0"][0] if share else d["released_s"], "pts": pts}


def probes(data: dict) -> list:
    """(place, hold_s, one-thread time, two-thread time, two-thread sleeps) of the calibration probes."""
    pts = data["pts"]
    out = []
    for place in PLACES:
        for h in HOLDS_US:
            t1, t2 = pts[f"{place}:1:{h}"][0], pts[f"{place}:2:{h}"]
            out.append((place, h, t1, t2[0], t2[1], t2[2]))
    return out


def base_one(data: dict) -> dict:
    pts = data["pts"]
    return {"alloc": pts["alloc-after:1:0"][0], "out": pts["out-after:1:0"][0]}


def eff_hold(place: str, t1: float, one: dict) -> float:
    return max(t1 - (one["out"] if place == "out-after" else one["alloc"]), 0.0)


def to_prm(x, fixed: dict, names) -> dict:
    prm = dict(fixed)
    for v, k in zip(x, names):
        lo, hi = BOUNDS[k]
        prm[k] = lo + (hi - lo) / (1 + math.exp(-v))
    return prm


def from_prm(prm: dict, names) -> list:
    out = []
    for k in names:
        lo, hi = BOUNDS[k]
        f = min(max((prm[k] - lo) / (hi - lo), 1e-4), 1 - 1e-4)
        out.append(math.log(f / (1 - f)))
    return out


def residuals(prm, data, use_sleeps: bool, use_switches: bool):
    one, rel = base_one(data), data["released"]
    res = []
    for place, h, t1, t2, s2, w2 in probes(data):
        pt, ps, pw = simulate(prm, one, rel, place, 2, eff_hold(place, t1, one), launches=160, warm=30)
        res.append((pt - t2) / 1.0e-6)  # us, on the time over one thread
        if use_sleeps and s2 is not None:
            res.append((ps - s2) / 0.1)  # a tenth of a sleep weighs as 1 us
        if use_switches:
            res.append((pw - w2) / 0.1)  # and a tenth of the launches switching hands
    return np.array(res)


def fit(data, names, fixed, use_sleeps, use_switches, maxfev, starts=({},)):
    """Nelder-Mead from START (and each of `starts` laid over it), the best kept: the simulated races make the
    loss rough, so one start can stop in the other regime (the waker keeping the GIL, or handing it over)."""
    def loss(x):
        return float(np.sum(residuals(to_prm(x, fixed, names), data, use_sleeps, use_switches) ** 2))
    best = None
    for st in starts:
        x0 = from_prm({**START, **st, **fixed}, names)
        r = minimize(loss, x0, method="Nelder-Mead", options={"maxfev": maxfev, "xatol": 1e-3, "fatol": 1e-3})
        if best is None or r.fun < best.fun:
            best = r
    return to_prm(best.x, fixed, names), best.fun


def reach(data, samples=150, seed=3):
    """What the mechanism can give at all: eight allocating threads under random parameters (log-uniform within
    BOUNDS), none fitted; the most sleeps a launch reached, and those sets' times."""
    pts, rng = data["pts"], random.Random(seed)
    one = {"alloc": pts["experiment-alloc:1:0"][0], "out": pts["experiment-out:1:0"][0]}
    rows = []
    for _ in range(samples):
        prm = {k: (math.exp(rng.uniform(math.log(lo), math.log(hi))) if k not in ("K", "P") else rng.uniform(lo, hi))
               for k, (lo, hi) in BOUNDS.items()}
        t8, s8, _ = simulate(prm, one, data["released"], "alloc-after", 8, 0.0, launches=200, warm=40)
        rows.append((s8, t8))
    rows.sort(reverse=True)
    s = np.array([r[0] for r in rows])
    print(f"\nreach: 8 allocating threads, {samples} random parameter sets (none fitted): sleeps a launch median "
          f"{np.median(s):.2f}, 90th pct {np.percentile(s, 90):.2f}, max {s.max():.2f} (measured "
          f"{pts['experiment-alloc:8:0'][1]:.2f}); the top three's times "
          + ", ".join(f"{t * 1e6:.1f} us" for _, t in rows[:3]) + f" (measured {pts['experiment-alloc:8:0'][0] * 1e6:.2f})")


def table(name, data, prm):
    one, rel = base_one(data), data["released"]
    print(f"\n{name}: calibration probes (two threads), measured vs simulated")
    print(f"  {'place':14} {'hold':>5} {'T1':>7} {'T2 meas':>8} {'T2 sim':>8} {'sleeps m':>8} {'sim':>5}"
          f" {'switch m':>8} {'sim':>5}")
    for place, h, t1, t2, s2, w2 in probes(data):
        pt, ps, pw = simulate(prm, one, rel, place, 2, eff_hold(place, t1, one), launches=400, warm=50, seed=7)
        sm = f"{s2:8.2f}" if s2 is not None else f"{'-':>8}"
        print(f"  {place:14} {h:5d} {t1*1e6:7.2f} {t2*1e6:8.2f} {pt*1e6:8.2f} {sm} {ps:5.2f} {w2:8.0%} {pw:5.0%}")
    print(f"{name}: the experiment, predicted (never fitted)")
    pts = data["pts"]
    one = {"alloc": pts["experiment-alloc:1:0"][0], "out": pts["experiment-out:1:0"][0]}  # its own one thread
    worst = 0.0
    for mem in ("alloc", "out"):
        print(f"  {'exp-' + mem:10} {'N':>2} {'meas us':>8} {'pred us':>8} {'err':>6} {'sleeps m':>8} {'pred':>5}"
              f" {'switch m':>8} {'pred':>5}")
        place = "alloc-after" if mem == "alloc" else "out-after"
        for n in range(1, 9):
            t, s, w = data["pts"][f"experiment-{mem}:{n}:0"]
            pts = [simulate(prm, one, rel, place, n, 0.0, launches=600, warm=100, seed=sd) for sd in (11, 12)]
            pt, ps, pw = (float(np.mean([p[i] for p in pts])) for i in range(3))
            err = pt / t - 1
            if n >= 3:
                worst = max(worst, abs(err))
            sm = f"{s:8.2f}" if s is not None else f"{'-':>8}"
            print(f"  {'':10} {n:2d} {t*1e6:8.2f} {pt*1e6:8.2f} {err:+6.1%} {sm} {ps:5.2f} {w:8.0%} {pw:5.0%}")
    print(f"  worst |error| at 3-8 threads: {worst:.1%}")


def show(prm):
    us = {k: prm[k] * 1e6 for k in ("L2", "L20", "L200", "S0", "C", "F")}
    print("  fitted: L(2us idle) {L2:.2f} us, L(20us) {L20:.2f} us, L(200us) {L200:.2f} us, "
          "S0 {S0:.2f} us, mutex section C {C:.3f} us, free's GIL-free part F {F:.3f} us".format(**us)
          + f", waker's syscall K = {prm['K']:.2f} x L, pre-dispatch share P = {prm['P']:.2f} (SIGMA {SIGMA})")


VARIANTS = (("A", False, "fitted to time and sleeps per launch"),
            ("B", True, "fitted to time, sleeps and the share of launches switching hands"))


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else DIR
    t0 = time.time()
    d3 = load(folder / "release-probes-3.json")
    for tag, switches, what in VARIANTS:
        prm3, loss = fit(d3, FREE, {}, True, switches, maxfev=600, starts=({"K": 0.6}, {"K": 0.9}))
        print(f"\n===== variant {tag}: {what} (two-thread hold probes 16-256 us) =====")
        print(f"release-probes-3.json: loss {loss:.1f} ({time.time() - t0:.0f} s)")
        show(prm3)
        table(f"{tag} release-probes-3", d3, prm3)
        for name in ("release-probes.json", "release-probes-2.json"):
            d = load(folder / name)
            knots = ("L2", "L20", "L200")
            prm, loss = fit(d, knots, {k: v for k, v in prm3.items() if k not in knots}, False, switches, maxfev=90)
            print(f"\n{name} (no sleep counts: L knots refitted to its times{' and switches' if switches else ''},"
                  f" the rest as -3 fitted them; loss {loss:.1f})")
            show(prm)
            table(f"{tag} " + name.removesuffix(".json"), d, prm)
    reach(d3)
    print(f"\n({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
