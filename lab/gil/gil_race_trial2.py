"""Offline trial 2 (issue 19): the GIL experiment as a race for CPython 3.12's GIL, with the traced launch split,
a serialized launch path beside the GIL, and a cold-core penalty after a GIL switch.

    . .venv/bin/activate && python lab/gil/gil_race_trial2.py [--quick] [--variants A,B,..]

Prints, for release-probes-4 (h200-2026-11-25-unfused, alloc and out=) and release-probes-3
(h200-2026-11-25-release-probes, alloc and out=), per variant: the experiment measured and predicted at N = 1..8
(aggregate host time per launch of all threads), the error, the worst |error|. The experiment's points are read
only to print the error: nothing is fitted to them.

What is modelled (`simulate`, an event simulation; the GIL part is lab/gil/gil_race_trial.py's):
  * N threads, each on a core of its own, each launch a cycle of (GIL-held, GIL-free) segments. CPython 3.12's
    drop_gil (mutex; locked = 0; cond_signal; unlock) and take_gil (mutex; while locked: cond_wait) as a race: a
    drop with a sleeper queued signals the first (FIFO); a sleeper idle longer than THETA has halted, so the wake
    costs the dropper C_H with the GIL's mutex held, and the sleeper arrives L_H after the drop; one not halted
    arrives L_P later; a thread reaching the GIL while the mutex is held waits for the unlock (+L_P).
  * (a) the split: the launch's held and free parts as FRACTIONS of the one-thread launch, from the GIL trace at one
    thread (data/interfaces/h200-2026-11-25-gil-trace, *.intervals.json.gz, medians of each part of the cycle;
    the drop's mutex section is counted with the held part before it, the take's with the free part before it).
    Allocating (2188 launches): after the dispatch held 0.75, free 0.74, held 1.37, free 0.36, held 0.09, free
    0.25, held 0.08 us, then the GIL-free dispatch 8.65 us, of 12.48 (held 18.6%, dispatch 70.4%); out= (2780):
    held 2.17, free 7.86 us (held 21.6%). Scaled to each run's one-thread probe T1.
    (Variant "old": the first trial's split, GIL-free part = released_s, for comparison.)
  * (b) the serialized launch path, two readings of the GIL-free TorchScript loops (alloc-contention-unfused.json,
    N = 1..8 threads launching without the GIL, 8.20 .. 4.44 us a launch of all threads):
    "ser": a single FIFO resource (a lock-like path in the driver / allocator) held S a launch at the end of the
    dispatch's GIL-free part D (S capped at D), handed to a waiter W after the release; S, W and the parallel part
    P_NG fitted (least squares, relative) to the 8 loop points, simulated as a closed queue of N threads doing P_NG
    then S. release-probes-4 (same lease) takes S, W as fitted; release-probes-3 (no loops there) takes S as the same
    FRACTION S / (P_NG + S) of its own D, and the same W. A closed queue saturates at two threads (rms 12%: it
    cannot give 6.47 us at two threads), so also
    "con": every thread's launch work (held and free parts; not a probe's spin, a sleep or a futex wake) runs at
    rate 1 / (1 + BETA * m), m = the other threads doing launch work at that moment; in the loops m = N - 1, so
    the loops' per-launch time is A (1 + BETA (N - 1)) / N, BETA fitted to the 8 points (rms 4.5%); BETA is a
    ratio, so release-probes-3 reuses it. (It predicts the trace's 1.4x longer GIL-free parts at two threads.)
  * (c) the switch penalty: the first held part a thread runs after taking the GIL from another thread is K_SW
    longer (cold core; the trace: out='s held part 3.8-4.0 us after a switch vs 2.1-2.3 alone). Fitted with
    C_H, L_H to the two-thread hold probes (all three enter the probes' dead time per hand-off nearly alike).
  * "jit": each held and free part varies (log-normal, mean kept) with the log-sd of that part at one thread in
    the trace (0.18-0.36 allocating, 0.09-0.13 out=); without it every part is its median.
  * "cht": C_H not fitted but set to the median drop_gil mutex section among those over 0.5 us in the trace's
    two-thread points (1.68 us; alone they are 0.04-0.05 us): the fitted C_H (3.8-8.5 us) is 2-5x what the trace
    shows the waker pays. Caveat: those two-thread points are the experiment's own loop at N = 2, traced, on
    another lease (the trace run, not release-probes-3/-4); they give only this one number.

Calibrated per run, only from non-experiment probes:
  T1        one thread, no hold: `alloc-after:1:0` / `out-after:1:0` of that run
  split     fractions from the one-thread GIL trace (another lease, same day)
  C_H, L_H (, K_SW)  least squares on the two-thread hold probes (alloc-after, alloc-between, out-after at
            16-128 us; 12 probes): simulated extra of two threads over one, against the measured one (a grid, then
            a finer one; L_H up to 20.5 us, K_SW up to 4.25 us); with "cht" only L_H (, K_SW).
  S, W, P_NG / BETA  the GIL-free loops (above)
Fixed: L_P 0.6 us, SIGMA 0.2 (log-normal jitter on every latency and on the resource's parts), THETA 2 us,
as in the first trial.

Result (full run, 2026-11-25; about 11 min, --quick about 5): NO variant is within 10% at every N, on either run.
N = 1 is +38% (alloc) / +35% (out=) on release-probes-4 in every variant: its one-thread probe ran 10.73 / 8.81 us
where the experiment's one thread ran 7.78 / 6.51 in the same rounds (bimodal ~7.5 vs ~10.5 us pace), and every
time in the model scales with that T1. Worst over N = 2..8 (rp4 alloc, rp4 out, rp3 alloc, rp3 out):
  old 70/83/30/21%, split 75/76/87/82%, split+jit 67/73/83/76%, split+ser+jit 80/57/85/66%,
  split+ser+sw+jit 69/57/75/63%, split+con+jit 62/47/67/49%, split+con+sw+jit 46/39/67/49%,
  split+con+sw+jit+cht 49/16/61/19%, split+ser+sw+jit+cht 34/25/41/11%.
With C_H fitted the model is bistable: the GIL, held a fifth of a launch, hardly contends at 2-4 threads (-40..-85%)
and then tips into every drop waking a halted sleeper at C_H 4-8.5 us (+35..+75% at 6-8 threads, allocating). With
the traced C_H (1.68 us) it rises smoothly and gets out= at 3-8 threads within 11-16%, but allocating it is
30-60% slow at two threads and 13-34% fast at 5-8: K_SW lands on its grid's edge (4.25 us) and L_H swings
1-12 us between runs, i.e. the hold probes do not separate the three dead-time terms.

Variants (--variants picks some): see VARIANTS. "old" is the first trial's split (GIL-free part = released_s,
which on release-probes-4 is the unfused loop, 7.5 us, so there it is close to the traced split).
"""

from __future__ import annotations

import argparse
import gzip
import heapq
import json
import math
import random
import statistics
import time
import sys
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling scripts, run from anywhere
from gil_race_trial import LaunchMeter, load_release_probes  # noqa: E402

ROOT = Path(__file__).resolve().parents[2] / "data/interfaces"
TRACE = ROOT / "h200-2026-11-25-gil-trace/gil-trace.intervals.json.gz"
UNFUSED = ROOT / "h200-2026-11-25-unfused"
L_P_S = 0.6e-6
SIGMA = 0.2
THETA_S = 2e-6
# the first trial's fixed split (variant "old")
F_S = 0.15e-6
HELD_AFTER_DISPATCH_S = 0.4e-6
HELD_INTERIOR_S = 0.05e-6


# --- (a) the split from the trace -----------------------------------------------------------------------------

def traced_split(point, drops):
    """Median of each part of one launch's cycle at one thread, as fractions of the median cycle: a list of
    (held_fraction, free_fraction), starting with the held part right after the long GIL-free dispatch, the last
    free part being the dispatch. held = a take's unlock to the next drop's unlock (its mutex section with it);
    free = the drop's unlock to the take's unlock."""
    by_thread = json.load(gzip.open(TRACE))[point]
    rows = max(by_thread.values(), key=len)  # the launching thread
    seq = []  # (held ns, free ns) per drop, in order
    for i in range(len(rows) - 2):
        a, b, c = rows[i:i + 3]
        if a[0] == "held" and b[0] == "free" and c[0] == "took":
            seq.append((b[1] - a[1], c[1] - b[1]))
        elif a[0] == "held":
            seq.append(None)
    cycles_parts = []
    long_free = 3000  # ns: the dispatch
    for i in range(len(seq) - drops):
        window = seq[i:i + drops]
        if any(w is None for w in window):
            continue
        # the cycle's last free part is the dispatch, the others short (alloc)
        if window[-1][1] < long_free or any(w[1] >= long_free for w in window[:-1]):
            continue
        if i > 0 and (seq[i - 1] is None or seq[i - 1][1] < long_free):
            continue
        cycles_parts.append(window)
    n = len(cycles_parts)
    med = [(statistics.median(c[k][0] for c in cycles_parts), statistics.median(c[k][1] for c in cycles_parts))
           for k in range(drops)]
    total = statistics.median(sum(h + f for h, f in c) for c in cycles_parts)
    scale = total / sum(h + f for h, f in med)  # medians rescaled to add up to the median cycle
    frac = [(h * scale / total, f * scale / total) for h, f in med]

    def log_sd(v):  # a robust log-normal sigma: half the log distance between the 16th and 84th percentiles
        v = sorted(v)
        return (math.log(v[int(0.84 * len(v))]) - math.log(v[int(0.16 * len(v))])) / 2

    sig = [(log_sd([c[k][0] for c in cycles_parts]), log_sd([c[k][1] for c in cycles_parts])) for k in range(drops)]
    return frac, total * 1e-9, n, [(h * 1e-3, f * 1e-3) for h, f in med], sig


# --- (b) the serialized launch path from the GIL-free loops ---------------------------------------------------

def simulate_nogil(threads, p, s, w, launches=3000, seed=1):
    """Closed queue: N threads each doing p (parallel) then s on one FIFO resource, handed to a waiter w later."""
    rng = random.Random(seed)
    jit = lambda x: x * math.exp(SIGMA * rng.gauss(0.0, 1.0))  # noqa: E731
    heap = []
    busy, queue = False, deque()
    meter = LaunchMeter(20 * threads, launches)
    seq = 0
    for th in range(threads):
        heapq.heappush(heap, (jit(p) + th * 1e-8, seq, th, "want"))
        seq += 1
    while True:
        t, _, th, kind = heapq.heappop(heap)
        if kind == "want":
            if busy:
                queue.append(th)
            else:
                busy = True
                heapq.heappush(heap, (t + jit(s), seq, th, "release"))
                seq += 1
        else:
            if steady := meter.done(t):
                return steady[0]
            heapq.heappush(heap, (t + jit(p), seq, th, "want"))
            seq += 1
            if queue:
                nxt = queue.popleft()
                heapq.heappush(heap, (t + jit(w) + jit(s) if w > 0 else t + jit(s), seq, nxt, "release"))
                seq += 1
            else:
                busy = False


def contention_fit(meas):
    """(a, beta, rms) of the GIL-free loops read as no lock: every thread's launch path slowed by the others',
    per launch = a (1 + beta (N - 1)) / N, beta on a grid, a by least squares on relative errors for each."""
    best = None
    for b in range(0, 2001):
        beta = b * 0.0005
        # for a given beta, the a minimising the relative squared error: sum(x (a x - m)/m^2) = 0
        xs = {n: (1 + beta * (n - 1)) / n for n in meas}
        a = sum(xs[n] / meas[n] for n in xs) / sum(xs[n] ** 2 / meas[n] ** 2 for n in xs)
        v = sum((a * xs[n] / meas[n] - 1) ** 2 for n in xs)
        if best is None or v < best[0]:
            best = (v, a, beta)
    v, a, beta = best
    return a, beta, math.sqrt(v / len(meas))


def loop_times(path):
    """Per thread count 1-8, the allocating GIL-free loops' time per launch of all threads (an alloc-contention
    JSON, lab/gil/alloc_contention.py)."""
    d = json.loads(path.read_text())
    return {n: d["points"][f"alloc:{n}"]["per_launch_s"] for n in range(1, 9)}


def fit_serialized(quick):
    meas = loop_times(UNFUSED / "alloc-contention-unfused.json")
    launches = 800 if quick else 2000

    def loss(p, s, w):
        return sum((simulate_nogil(n, p, s, w, launches) / meas[n] - 1) ** 2 for n in range(1, 9))

    best = None
    for s in (2.5, 3.0, 3.5, 4.0, 4.5):
        for w in (0.0, 0.5, 1.0, 1.5, 2.0, 3.0):
            for p in (3.0, 4.0, 5.0, 6.0):
                v = loss(p * 1e-6, s * 1e-6, w * 1e-6)
                if best is None or v < best[0]:
                    best = (v, p * 1e-6, s * 1e-6, w * 1e-6)
    _, p0, s0, w0 = best
    step = 0.25e-6
    for dp in (-step, 0, step):
        for ds in (-step, 0, step):
            for dw in (-step, 0, step):
                p, s, w = p0 + dp, s0 + ds, max(w0 + dw, 0.0)
                v = loss(p, s, w)
                if v < best[0]:
                    best = (v, p, s, w)
    v, p, s, w = best
    pred = {n: simulate_nogil(n, p, s, w, launches * 2) for n in range(1, 9)}
    # the other reading: no lock, every thread's launch path slowed by the others' (per_launch = a(1+beta(N-1))/N)
    a, beta, rms_c = contention_fit(meas)
    return {"p": p, "s": s, "w": w, "rms": math.sqrt(v / 8), "meas": meas, "pred": pred,
            "a": a, "beta": beta, "rms_c": rms_c,
            "pred_c": {n: a * (1 + beta * (n - 1)) / n for n in range(1, 9)}}


# --- the simulation -------------------------------------------------------------------------------------------

def simulate(threads, segs, c_h, l_h, k_sw=0.0, ser=None, beta=0.0, jitter=None, theta=THETA_S, launches=3000,
             seed=1):
    """Time per launch of all threads, each running the cycle `segs` [(held_s, hold_s, free_s)] whose LAST free
    part is the dispatch (hold_s: a probe's fixed spin with the GIL held, after the held work).
    ser = (s, w): the last s of the dispatch is a FIFO resource shared by all threads (w: its hand-off to a waiter).
    beta: every thread's launch work (held and free parts, not a spin, a wait or a futex wake) runs at rate
    1 / (1 + beta * (others doing launch work at the same time)).
    k_sw: extra held work in the first held part after taking the GIL from another thread.
    jitter: per segment (held sigma, free sigma), log-normal, mean-preserving, on each part's work; None: none.
    Returns (time per launch, GIL condition waits per launch, GIL switches per launch)."""
    rng = random.Random(seed)
    nseg = len(segs)
    heap, seq = [], 0

    def push(t, th, kind, ver=0):
        nonlocal seq
        heapq.heappush(heap, (t, seq, th, kind, ver))
        seq += 1

    def lat(base):
        return base * math.exp(SIGMA * rng.gauss(0.0, 1.0))

    s_res, w_res = ser if ser else (0.0, 0.0)
    gil, mutex_until, last_holder = None, -1.0, None
    queue: deque = deque()
    res_busy, res_queue = False, deque()
    slept_at, seg = [0.0] * threads, [0] * threads
    woken = [False] * threads
    phase = [""] * threads
    active = set()
    remaining, since, rate, ver = [0.0] * threads, [0.0] * threads, [1.0] * threads, [0] * threads
    waits = switches = 0
    meter = LaunchMeter(30 * threads, launches)

    def rescale(t):  # the set of threads doing launch work changed: re-time everyone's current work
        r = 1.0 / (1.0 + beta * (len(active) - 1)) if active else 1.0
        for i in active:
            remaining[i] -= (t - since[i]) * rate[i]
            since[i], rate[i] = t, r
            ver[i] += 1
            push(t + max(remaining[i], 0.0) / r, i, "work", ver[i])

    def start_work(th, t, amount, ph, sig=0.0):
        if sig:
            amount *= math.exp(sig * rng.gauss(0.0, 1.0) - sig * sig / 2)
        phase[th] = ph
        remaining[th], since[th], rate[th] = amount, t, 1.0
        active.add(th)
        rescale(t)

    def end_work(th, t):
        active.discard(th)
        ver[th] += 1
        if beta:
            rescale(t)

    for th in range(threads):
        push(th * 1e-7, th, "gil")
    while heap:
        t, _, th, kind, v = heapq.heappop(heap)
        if kind == "work":
            if v != ver[th]:
                continue  # re-timed since
            end_work(th, t)
            k = seg[th] % nseg  # the held part's segment (a free part's is k - 1)
            if phase[th] == "held":
                if segs[k][1] > 0:
                    push(t + segs[k][1], th, "drop")  # the probe's spin, then the drop
                    continue
                kind = "drop"  # falls through to the drop below
            elif phase[th] == "dispatch" and s_res > 0:
                push(t, th, "res")
                continue
            else:
                push(t, th, "gil")
                continue
        if kind == "res":  # reached the serialized part of its dispatch
            if res_busy:
                res_queue.append(th)
            else:
                res_busy = True
                push(t + lat(s_res), th, "res_done")
            continue
        if kind == "res_done":
            if res_queue:
                nxt = res_queue.popleft()
                push(t + (lat(w_res) if w_res > 0 else 0.0) + lat(s_res), nxt, "res_done")
            else:
                res_busy = False
            push(t, th, "gil")
            continue
        if kind == "free":  # the dropper's mutex section is over: its GIL-free part
            k = (seg[th] - 1) % nseg
            dispatch = k == nseg - 1
            free = segs[k][2] - (min(s_res, segs[k][2]) if dispatch else 0.0)
            start_work(th, t, free, "dispatch" if dispatch else "free", jitter[k][1] if jitter else 0.0)
            continue
        if kind == "drop":  # end of a held part: drop the GIL
            gil = None
            k = seg[th] % nseg
            seg[th] += 1
            if k == nseg - 1 and (steady := meter.done(t, waits, switches)):
                return steady
            extra = 0.0
            if queue:  # cond_signal, inside the GIL's mutex
                w = queue.popleft()
                woken[w] = True
                if t - slept_at[w] > theta:  # its vCPU halted: the wake is an IPI, paid with the mutex held
                    push(t + lat(l_h), w, "gil")
                    mutex_until = t + lat(c_h)
                    extra = mutex_until - t
                else:
                    push(t + lat(L_P_S), w, "gil")
            push(t + extra, th, "free")
            continue
        # kind == "gil": wants the GIL: back from its GIL-free part, or woken
        if t < mutex_until and gil is None:  # blocked on the mutex; the unlock wakes it
            woken[th] = True
            push(mutex_until + lat(L_P_S), th, "gil")
            continue
        if gil is None:
            gil = th
            woken[th] = False
            k = seg[th] % nseg
            held = segs[k][0]
            if jitter:
                held *= math.exp(jitter[k][0] * rng.gauss(0.0, 1.0) - jitter[k][0] ** 2 / 2)
            if last_holder is not None and last_holder != th:
                switches += 1
                held += k_sw
            last_holder = th
            start_work(th, t, held, "held")
        else:
            woken[th] = False
            queue.append(th)
            slept_at[th] = t
            waits += 1
    raise RuntimeError("no events left")


def segments(kind, t1, split, hold=0.0, place="after", old_released=None):
    """One launch's cycle [(held_s, hold_s, free_s)], the dispatch last; split: the traced fractions (alloc: 4
    parts, out: 1), or None for the first trial's split (GIL-free part = old_released). The probes' extra hold goes
    after the launch (the held part before the dispatch) or between the launch and the free of its result (the
    held part right after the dispatch)."""
    if split is None:  # the first trial's split, reordered so that the dispatch comes last
        if kind == "out":
            return [(t1 - old_released, hold, old_released)]
        d = old_released - 3 * F_S
        main = t1 - old_released - HELD_AFTER_DISPATCH_S - 2 * HELD_INTERIOR_S
        return [(HELD_AFTER_DISPATCH_S, hold if place == "between" else 0.0, F_S), (HELD_INTERIOR_S, 0.0, F_S),
                (HELD_INTERIOR_S, 0.0, F_S), (main, hold if place == "after" else 0.0, d)]
    segs = [[h * t1, 0.0, f * t1] for h, f in split[kind]]
    segs[-1 if place == "after" else 0][1] = hold
    return [tuple(s) for s in segs]


def dispatch_part(kind, t1, split, old_released):
    return segments(kind, t1, split, old_released=old_released)[-1][2]


# --- the runs -------------------------------------------------------------------------------------------------

# --- calibration of the GIL's wake costs (and the switch penalty) ---------------------------------------------

def calibrate(run, split, ser_of, beta, jit_of, with_sw, quick, c_fixed=None):
    """(C_H, L_H, K_SW) minimising the squared residuals of the two-thread probes: a grid, then a finer one."""
    launches = 300 if quick else 600
    cache = {}
    base = {}
    for i, (kind, where, hold, extra, _) in enumerate(run["probes"]):
        segs = segments(kind, run["t1"][kind], split, max(hold, 0.0), where, run["released"])
        base[i] = segs

    def loss(c, l, k):
        key = (round(c * 1e9), round(l * 1e9), round(k * 1e9))
        if key in cache:
            return cache[key]
        tot = 0.0
        for i, (kind, where, hold, extra, _) in enumerate(run["probes"]):
            segs = base[i]
            one, _, _ = simulate(1, segs, c, l, k, ser_of(kind), beta, jit_of(kind), launches=launches)
            two, _, _ = simulate(2, segs, c, l, k, ser_of(kind), beta, jit_of(kind), launches=launches)
            tot += ((two - one - extra) * 1e6) ** 2
        cache[key] = tot
        return tot

    grid_c = [c_fixed] if c_fixed else [x * 1e-6 for x in (0.5, 1.5, 2.5, 3.5, 4.5, 6.0, 8.0)]
    grid_l = [x * 1e-6 for x in (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 17.0, 20.0)]
    grid_k = [x * 1e-6 for x in ((0.0, 0.5, 1.0, 2.0, 3.0, 4.0) if with_sw else (0.0,))]
    best = None
    for c in grid_c:
        for l in grid_l:
            for k in grid_k:
                v = loss(c, l, k)
                if best is None or v < best[0]:
                    best = (v, c, l, k)
    _, c0, l0, k0 = best
    dks = (-0.25e-6, 0.0, 0.25e-6) if with_sw else (0.0,)
    for dc in ((0.0,) if c_fixed else (-0.5e-6, -0.25e-6, 0.0, 0.25e-6, 0.5e-6)):
        for dl in (-0.5e-6, -0.25e-6, 0.0, 0.25e-6, 0.5e-6):
            for dk in dks:
                c, l, k = max(c0 + dc, 0.1e-6), max(l0 + dl, 0.3e-6), max(k0 + dk, 0.0)
                v = loss(c, l, k)
                if v < best[0]:
                    best = (v, c, l, k)
    v, c, l, k = best
    return c, l, k, math.sqrt(v / len(run["probes"]))


# name: the mechanisms it has: split (a), ser (b, FIFO lock), con (b, contention), sw (c), jit (traced jitter),
# cht (C_H fixed from the two-thread trace's drop sections instead of fitted)
VARIANTS = {
    "old": set(),
    "split": {"split"},
    "split+jit": {"split", "jit"},
    "split+ser+jit": {"split", "ser", "jit"},
    "split+ser+sw+jit": {"split", "ser", "sw", "jit"},
    "split+con+jit": {"split", "con", "jit"},
    "split+con+sw+jit": {"split", "con", "sw", "jit"},
    "split+con+sw+jit+cht": {"split", "con", "sw", "jit", "cht"},
    "split+ser+sw+jit+cht": {"split", "ser", "sw", "jit", "cht"},
}


def traced_wake_cost():
    """C_H from the trace: the median drop_gil mutex section of those over 0.5 us (a signal to a sleeper; alone
    they are 0.04-0.05 us) at two threads, allocating and out= together."""
    by_point = json.load(gzip.open(TRACE))
    big = []
    for point in ("alloc-after:2", "out-after:2"):
        for rows in by_point[point].values():
            for a, b in zip(rows, rows[1:]):
                if a[0] == "held" and b[0] == "free" and b[1] - a[2] > 500:
                    big.append(b[1] - a[2])
    return statistics.median(big) * 1e-9, len(big)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer simulated launches")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    args = ap.parse_args()
    t_start = time.time()
    launches = 1000 if args.quick else 3000

    fa, ta, na, ma, sa = traced_split("alloc-after:1", 4)
    fo, to, no, mo, so = traced_split("out-after:1", 1)
    split = {"alloc": fa, "out": fo}
    sigmas = {"alloc": sa, "out": so}
    print(f"traced split (gil-trace, one thread; medians us, [held, free] from after the dispatch):")
    print(f"  alloc: {na} cycles, median {ta * 1e6:.2f} us: " + ", ".join(f"[{h:.2f}, {f:.2f}]" for h, f in ma)
          + f"; held fraction {sum(h for h, _ in fa):.3f}, dispatch fraction {fa[-1][1]:.3f}")
    print(f"  out:   {no} cycles, median {to * 1e6:.2f} us: " + ", ".join(f"[{h:.2f}, {f:.2f}]" for h, f in mo)
          + f"; held fraction {fo[0][0]:.3f}")
    print("  log-sd per part (held, free): alloc " + ", ".join(f"({h:.2f}, {f:.2f})" for h, f in sa)
          + "; out " + ", ".join(f"({h:.2f}, {f:.2f})" for h, f in so))

    ser = fit_serialized(args.quick)
    ser_frac = ser["s"] / (ser["p"] + ser["s"])
    print(f"serialized launch path (alloc-contention-unfused.json, no GIL): P_NG {ser['p'] * 1e6:.2f} us, "
          f"S {ser['s'] * 1e6:.2f} us, W {ser['w'] * 1e6:.2f} us (S fraction {ser_frac:.3f}; rms rel. "
          f"{ser['rms']:.1%})")
    print("  measured  " + "".join(f"{ser['meas'][n] * 1e6:7.2f}" for n in range(1, 9)))
    print("  fitted    " + "".join(f"{ser['pred'][n] * 1e6:7.2f}" for n in range(1, 9)))
    print(f"launch path contention (same loops): a {ser['a'] * 1e6:.2f} us, beta {ser['beta']:.3f} (rms rel. "
          f"{ser['rms_c']:.1%})")
    print("  fitted    " + "".join(f"{ser['pred_c'][n] * 1e6:7.2f}" for n in range(1, 9)))

    ch_trace, n_ch = traced_wake_cost()
    print(f"C_H from the trace (two threads, {n_ch} drop sections over 0.5 us, median): {ch_trace * 1e6:.2f} us")
    runs = [load_release_probes(UNFUSED / "release-probes-4.json"),
            load_release_probes(ROOT / "h200-2026-11-25-release-probes/release-probes-3.json")]
    summary = []
    for vname in [v for v in args.variants.split(",") if v]:
        mech = VARIANTS[vname]
        use_split, use_ser, use_con, use_sw, use_jit = (m in mech for m in ("split", "ser", "con", "sw", "jit"))
        c_fixed = ch_trace if "cht" in mech else None
        beta = ser["beta"] if use_con else 0.0
        sp = split if use_split else None
        jit_of = (lambda kind: sigmas[kind]) if use_jit else (lambda kind: None)
        print(f"\n######## variant {vname}")
        for run in runs:
            same_lease = run["name"] == "release-probes-4.json"

            def ser_of(kind, run=run, sp=sp):
                if not use_ser:
                    return None
                d = dispatch_part(kind, run["t1"][kind], sp, run["released"])
                s = ser["s"] if same_lease else ser_frac * d
                return (min(s, d), ser["w"])

            c_h, l_h, k_sw, rms = calibrate(run, sp, ser_of, beta, jit_of, use_sw, args.quick, c_fixed)
            sers = {k: ser_of(k) for k in ("alloc", "out")}
            print(f"== {run['name']}: T1 alloc {run['t1']['alloc'] * 1e6:.2f} us, out {run['t1']['out'] * 1e6:.2f} "
                  f"us; C_H {c_h * 1e6:.2f} us, L_H {l_h * 1e6:.2f} us, K_SW {k_sw * 1e6:.2f} us (probe rms "
                  f"{rms:.2f} us)" + ("".join(f"; {k} S {v[0] * 1e6:.2f} W {v[1] * 1e6:.2f} us"
                                              for k, v in sers.items() if v) if use_ser else "")
                  + (f"; beta {beta:.3f}" if use_con else ""))
            for kind in ("alloc", "out"):
                meas = run["exp"][kind]
                segs = segments(kind, run["t1"][kind], sp, old_released=run["released"])
                pred = {}
                for n in range(1, 9):
                    sims = [simulate(n, segs, c_h, l_h, k_sw, sers[kind], beta, jit_of(kind), launches=launches,
                                     seed=sd)
                            for sd in (1, 2)]
                    pred[n] = tuple(statistics.mean(s[i] for s in sims) for i in range(3))
                errs = {n: pred[n][0] / meas[n] - 1 for n in range(1, 9)}
                worst = max(abs(e) for e in errs.values())
                w28 = max(abs(errs[n]) for n in range(2, 9))
                print(f"  {kind:16}" + "".join(f"{n:>8}" for n in range(1, 9)) + "   worst  worst2-8")
                print(f"  {'measured us':16}" + "".join(f"{meas[n] * 1e6:8.2f}" for n in range(1, 9)))
                print(f"  {'predicted us':16}" + "".join(f"{pred[n][0] * 1e6:8.2f}" for n in range(1, 9)))
                print(f"  {'error':16}" + "".join(f"{errs[n]:+8.1%}" for n in range(1, 9))
                      + f"  {worst:6.1%}  {w28:6.1%}")
                print(f"  {'cond waits':16}" + "".join(f"{pred[n][1]:8.2f}" for n in range(1, 9)))
                summary.append((vname, run["name"], kind, errs, worst, w28))
    print("\nsummary: per-N error (N = 1..8), worst, worst over N = 2..8")
    for vname, rname, kind, errs, worst, w28 in summary:
        print(f"  {vname:13} {rname:22} {kind:5}" + "".join(f"{errs[n]:+7.0%}" for n in range(1, 9))
              + f"  {worst:6.1%} {w28:6.1%}")
    print(f"run time {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
