"""Offline trial of GIL-model variants for the GIL experiment's 3-8 threads (issue 19), outside parsim's model.

    python lab/gil/gil_trial.py RUN_DIR_OR_JSON [...]   # data/interfaces/h200-2026-11-24-3 or its data-parallel.json

Every variant is calibrated from the run's own calibration probes only: one thread's launch (launch_s), the
TorchScript loop's GIL-free part (released_s), one and two threads holding the GIL 0-1024 us longer per launch,
and, where a variant says so, eight threads holding it 64 and 128 us longer (`crowd`). The probes come from the
experiment's own rounds (`raw.calibration`, runs -3 to -5) or, where a run has none (-1, -2), from
`profile.samples.json`, timed a minute before. The experiment's points are printed beside the predictions and never
fitted; the last table (`implied`) reads them back, as a diagnosis only.

A small event simulation of N threads sharing the GIL, each launch a list of GIL segments (a held part, then a
GIL-free part): with one release, the launch's own; with two, the launch's (Python up to dispatch, then dispatch
without the GIL) and the free of its result (Python after dispatch, then torch's tensor deallocation, which drops
the GIL: THPVariable_clear destroys the tensor inside pybind11::gil_scoped_release). Every release with sleepers
hands the GIL to one of them (the H200 hosts switched at 87-100% of launches); the GIL idles while it wakes, for a
time set by how long its core idled (the wake-up curve). The curve (non-decreasing, on a grid of idle times) is
re-read by the same simulation: least squares over the two-thread hold probes, each simulated.

Variants:
  model      parsim.sim.gil as recorded in the run (one release, one thread keeps the GIL)
  one        one release per launch, every release handed over
  two        two releases per launch (dispatch, free), every one handed over, sleepers woken in order
  four       four releases per launch (the dispatch's and three short ones, the free's among them), every one
             handed over: as many as an allocating launch makes on torch 2.11 and Python 3.12, counted by
             lab/gil/gil_locks.py (data/interfaces/h200-2026-11-25-locks: 12 interpreter mutex locks a launch alone,
             3 for a launch that neither allocates nor frees; 4.0 waits on the GIL a launch at 6-8 threads, 1.0)
  two/rand   `two`, a random sleeper woken (futex wake order is not FIFO)
  two+s      `two`, the cost x (1 + k (sleepers - 1)), k from the crowd probes (simulated as the experiment)
  two+a      `two`, the cost + a (sleepers - 1), a from the crowd probes
Held time per launch: launch_s - released_s (released_s is the dispatch and the free, which the TorchScript loop
also does); POST_SHARE of it after dispatch (not measured: 0.25 and 0.5 printed), split evenly between the short
releases. Each short release's GIL-free part FREE_S is a part of released_s (the pace under hand-offs does not
depend on it).
"""

from __future__ import annotations

import heapq
import json
import lzma
import random
import statistics
import sys
from collections import deque
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

FREE_S = 0.3e-6  # the free's GIL-free part, out of released_s
POST_SHARES = (0.25, 0.5)
LAUNCHES = 160
GRID_S = tuple(x * 1e-6 for x in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))  # the curve's idle nodes, flat beyond



def run_json(folder: Path) -> dict:
    """A run folder's data-parallel.json, or its xz-compressed copy (data/interfaces keeps the large ones so)."""
    plain = folder / "data-parallel.json"
    return json.loads(plain.read_text() if plain.exists() else lzma.open(f"{plain}.xz", "rt").read())

def simulate(threads: int, segs: list[tuple[float, float]], lam, launches: int = LAUNCHES,
             order: str = "fifo", seed: int = 1) -> tuple[float, list]:
    """Time per launch of `threads` threads, each running `launches` times the GIL segments `segs` [(held_s,
    free_s)], every release handed to a sleeper (the first: order "fifo"; the last: "lifo"; any: "random"), which
    has the GIL lam(idle_s, sleepers) later (sleepers counts it). Returns (pace, [(idle_s, sleepers, the wakee's
    next segment, the segment whose release woke it)] of every wake-up)."""
    nseg = len(segs)
    heap: list = []
    seq = 0
    holder = None
    line: deque = deque()
    slept_at = [0.0] * threads
    seg_of = [0] * threads  # next segment index (over all launches)
    done_at: list[float] = []
    wakes: list = []
    total = launches * nseg
    rng = random.Random(seed)

    def push(t, kind, th):
        nonlocal seq
        heapq.heappush(heap, (t, seq, kind, th))
        seq += 1

    for th in range(threads):
        push(0.0, "want", th)
    while heap:
        t, _, kind, th = heapq.heappop(heap)
        if kind == "want":
            if holder is None:
                holder = th
                push(t + segs[seg_of[th] % nseg][0], "release", th)
            else:
                line.append(th)
                slept_at[th] = t
        elif kind == "start":  # a woken thread has the GIL
            push(t + segs[seg_of[th] % nseg][0], "release", th)
        else:  # release
            k = seg_of[th]
            seg_of[th] += 1
            if k % nseg == nseg - 1:
                done_at.append(t)
            holder = None
            if line:
                if order == "fifo":
                    w = line.popleft()
                elif order == "lifo":
                    w = line.pop()
                else:
                    j = rng.randrange(len(line))
                    w = line[j]
                    del line[j]
                idle = t - slept_at[w]
                cost = lam(idle, len(line) + 1)
                wakes.append((idle, len(line) + 1, seg_of[w] % nseg, k % nseg))
                holder = w
                push(t + cost, "start", w)
            if seg_of[th] < total:
                push(t + segs[k % nseg][1], "want", th)
    # steady state: from the 2N-th launch done until the threads start to run out of launches
    done_at.sort()
    skip = 2 * threads
    stop = done_at[-1] if threads == 1 else done_at[int(len(done_at) * (1 - 1.0 / threads)) - 1]
    inside = [x for x in done_at[skip:] if x <= stop]
    pace = (inside[-1] - done_at[skip - 1]) / (len(inside))
    return pace, wakes


def curve_fn(points):
    xs, ys = np.array(sorted(points)).T
    return lambda idle: float(np.interp(idle, xs, ys))


def segments(held: float, released: float, post_share: float, releases: int, hold: float = 0.0):
    """One launch's GIL segments [(held_s, free_s)]; the probes' extra hold comes after the free, before the next
    launch's dispatch (hw.interfaces.launch_threads.launch_loop)."""
    if releases == 1:
        return [(held + hold, released)]
    short = releases - 1
    return [(held * (1 - post_share) + hold, released - short * FREE_S)] + [(held * post_share / short, FREE_S)] * short


def curve_from(params) -> list[tuple[float, float]]:
    """A non-decreasing curve on GRID_S from unconstrained parameters (first value, then squared increments)."""
    ys = np.cumsum(np.concatenate([[params[0] ** 2], np.asarray(params[1:]) ** 2])) * 1e-6
    return list(zip(GRID_S, ys))


def read_curve(probe, held, released, post_share, releases, order="fifo"):
    """The wake-up curve re-read by the simulation: the non-decreasing curve on GRID_S whose simulated two-thread
    hold probes come nearest their measured times (least squares over relative errors)."""
    targets = sorted(probe["two"].items())

    def residuals(params):
        lam_curve = curve_fn(curve_from(params))
        return [simulate(2, segments(held, released, post_share, releases, h), lambda s, n: lam_curve(s), 100,
                         order)[0] / t - 1 for h, t in targets]

    fit = least_squares(residuals, [1.0] + [0.7] * (len(GRID_S) - 1), diff_step=1e-3, max_nfev=300)
    return curve_from(fit.x), max(abs(r) for r in fit.fun)


def probes(path: Path) -> tuple[dict, dict, str]:
    """(the probes, the run, where the probes come from) for a run folder or its data-parallel.json."""
    folder = path if path.is_dir() else path.parent
    run = run_json(folder)
    cal = run["raw"].get("calibration")
    if cal is not None:
        launch, source = run["calibrated"]["gil"]["launch_s"], "the experiment's rounds"
    else:
        cal = json.loads((folder / "profile.samples.json").read_text())["gil"]
        launch, source = json.loads((folder / "profile.json").read_text())["gil"]["launch_s"], "a minute before"
    times = {(p["threads"], p["hold_s"]): p for p in cal["holds"]}

    def paired(n, h):  # as hw.interfaces.launch_threads.paired_extra
        return statistics.median(b["per_launch_s"] - a["per_launch_s"]
                                 for a, b in zip(times[(1, h)]["rounds"], times[(n, h)]["rounds"]))

    holds = sorted(h for n, h in times if n == 2)
    one = {h: times[(1, h)]["per_launch_s"] for h in holds}
    probe = {"launch": launch, "released": min(cal["released_s"] or 0.0, launch),
             "two": {h: one[h] + paired(2, h) for h in holds},
             "crowd": {h: times[(1, h)]["per_launch_s"] + paired(8, h) for n, h in times if n == 8}}
    return probe, run, source


def fit_crowd(probe, held, released, post_share, curve, form):
    """k (form "s": cost x (1 + k (sleepers - 1))) or a (form "a": cost + a (sleepers - 1)) with which the
    simulated eight-thread hold probes come out at their measured times on average (bisection)."""
    base = curve_fn(curve)

    def lam(k):
        if form == "s":
            return lambda s, n: base(s) * (1 + k * (n - 1))
        return lambda s, n: base(s) + k * (n - 1)

    def err(k):
        return statistics.mean(simulate(8, segments(held, released, post_share, 2, h), lam(k), 80)[0] / t - 1
                               for h, t in probe["crowd"].items())

    lo, hi = (-0.12, 2.0) if form == "s" else (-1.5e-6, 20e-6)  # the costs stay positive at 7 sleepers
    if err(lo) > 0 or err(hi) < 0:
        k = lo if err(lo) > 0 else hi
        return k, lam(k)
    for _ in range(24):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if err(mid) < 0 else (lo, mid)
    return (lo + hi) / 2, lam((lo + hi) / 2)


def pace(n, segs, lam, order="fifo"):
    if order == "fifo":
        return simulate(n, segs, lam)[0]
    return statistics.mean(simulate(n, segs, lam, 300, order, seed)[0] for seed in (1, 2, 3))


def main() -> None:
    for arg in sys.argv[1:]:
        probe, run, source = probes(Path(arg))
        measured = {int(n): t["per_launch_s"] for n, t in run["raw"]["times"].items()}
        counts = sorted(measured)
        released = probe["released"]
        held = probe["launch"] - released
        print(f"== {arg}: probes from {source}; launch {probe['launch'] * 1e6:.2f} us, GIL-free "
              f"{released * 1e6:.2f} us")
        rows = {"model": {n: run["predicted"][f"launch_threads{n}_s"] for n in counts}}
        notes, implied = [], {}
        for share in POST_SHARES:
            for releases in (1, 2, 4):
                if releases == 1 and share != POST_SHARES[0]:
                    continue
                name = {1: "one", 2: f"two p{share}", 4: f"four p{share}"}[releases]
                curve, worst = read_curve(probe, held, released, share, releases)
                lam_c = curve_fn(curve)
                segs = segments(held, released, share, releases)
                rows[name] = {n: pace(n, segs, lambda s, k: lam_c(s)) for n in counts}
                notes.append(f"{name}: curve (idle us, cost us) "
                             + " ".join(f"{x * 1e6:.0f}:{y * 1e6:.1f}" for x, y in curve)
                             + f"; two-thread probes fitted within {worst:.1%}")
                if probe["crowd"]:
                    sims = {h: simulate(8, segments(held, released, share, releases, h), lambda s, k: lam_c(s),
                                        80)[0] for h in probe["crowd"]}
                    notes.append(f"{name}: 8 threads holding " + ", ".join(
                        f"{h * 1e6:.0f} us: {t * 1e6:.1f} measured, {sims[h] * 1e6:.1f} simulated"
                        for h, t in probe["crowd"].items()))
                if releases != 2:  # the variants below and the diagnosis are the two-release trial's
                    continue
                _, wakes = simulate(2, segments(held, released, share, 2, 64e-6), lambda s, k: lam_c(s))
                _, wakes8 = simulate(8, segs, lambda s, k: lam_c(s))
                notes.append(f"{name}: sleeper idle (median us) when a free's release wakes it: two threads "
                             f"holding 64 us {statistics.median(w[0] for w in wakes if w[3] == 1) * 1e6:.0f}, "
                             f"the dispatch's {statistics.median(w[0] for w in wakes if w[3] == 0) * 1e6:.0f}; "
                             f"8 threads, no hold: {statistics.median(w[0] for w in wakes8 if w[3] == 1) * 1e6:.0f}")
                curve_r, _ = read_curve(probe, held, released, share, 2, "random")
                lam_r = curve_fn(curve_r)
                rows[f"two/rand p{share}"] = {n: pace(n, segs, lambda s, k: lam_r(s), "random") for n in counts}
                if probe["crowd"]:
                    for form in ("s", "a"):
                        k, lam = fit_crowd(probe, held, released, share, curve, form)
                        rows[f"two+{form} p{share}"] = {n: pace(n, segs, lam) for n in counts}
                        notes.append(f"two+{form} p{share}: " + (f"k = {k:.3f}" if form == "s" else
                                                                  f"a = {k * 1e6:.2f} us") + " from the crowd")
                # diagnosis only (reads the experiment): the cost per hand-off the experiment implies, at the
                # simulated sleepers' idle, against the curve there
                for n in counts[2:]:
                    _, w = simulate(n, segs, lambda s, k: lam_c(s))
                    idle = statistics.median(x[0] for x in w)
                    implied.setdefault(f"p{share}", []).append(
                        f"{n}: {(measured[n] - held) / 2 * 1e6:.1f} vs {lam_c(idle) * 1e6:.1f} at {idle * 1e6:.0f} us")
        for line in notes:
            print("  " + line)
        print("  " + f"{'us a launch':16}" + "".join(f"{n:>13}" for n in counts))
        print("  " + f"{'measured':16}" + "".join(f"{measured[n] * 1e6:13.2f}" for n in counts))
        for name, pred in rows.items():
            print("  " + f"{name:16}" + "".join(f"{pred[n] * 1e6:7.2f}{pred[n] / measured[n] - 1:+6.0%}"
                                                for n in counts))
        for share, items in implied.items():
            print(f"  implied cost per hand-off ({share}; diagnosis, from the experiment), us: " + "; ".join(items))


if __name__ == "__main__":
    main()
