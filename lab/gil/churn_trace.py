"""Where the churn probe's time goes: every take and drop of the GIL, each condition wait, wake and signal, timed
while N threads run lab/gil/gil_churn.py's loop (issue 19).

    python lab/gil/churn_trace.py OUT.json [WINDOW_S]

The probe without torch is reproducible and no GIL mechanism tried so far reproduces it (lab/gil/gil_churn_fits.py,
docs/lab/data-parallel-interfaces.md item 13): 8 threads take 8.2-9.0 us an iteration with 2-5 us GIL-free, 13.5 at 7-9 us, 10.7-10.9 at
11-13 us. Here the same loop runs under lab/gil/giltrace.c (LD_PRELOAD: each mutex lock's call and return, each
unlock, each condition wait's start and end and each signal), at 2, 4 and 8 threads with spins of 2, 5, 8 and 12 us,
each point also untimed by the hooks just before. Per point:
  gap      GIL idle from a drop (its unlock) to the next take (the taker's unlock), split by who took it: the dropper
           again (`retake`) or another thread, which either never waited (`barge`) or came out of a condition wait
           (`woken`)
  wake     a condition wait's end less the last signal's return by another thread before it, split into waits
           that ended in the take (`won`) and waits that went back to sleep (`futile`)
  signal   a signal's own time (its call to its return), for drops that signalled
  mutex    how long a take's and a drop's lock of the GIL's mutex waited for it
All as deciles in us, with counts per iteration; and up to 1500 wakes of each point as (how long the thread had
slept when the signal came, the wake's latency after it, whether it took the GIL), for a wake-up's latency by
sleep length (a vCPU that idled briefly may still be polling; one that halted wakes through the hypervisor).
"""

from __future__ import annotations

import bisect
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # its sibling scripts, run from anywhere
from gil_trace import LIBRARY, gil_of, read_dump  # noqa: E402
from preload import preloaded  # noqa: E402

THREADS = (1, 2, 4, 8)
FREES_US = (2.0, 5.0, 8.0, 12.0)


def deciles(values: list[float]) -> list[float]:
    """Deciles in us of values in ns ([] for fewer than 11)."""
    return [round(x / 1e3, 2) for x in statistics.quantiles(values, n=10)] if len(values) > 10 else []


def gil_events(events: list[tuple], mutex: str, take: int) -> tuple[list[tuple], list[tuple]]:
    """Every take and drop of the GIL: (taken_ns, thread, waits, mutex_wait_ns) and (dropped_ns,
    thread, signal_ns or None, mutex_wait_ns, signalled_at_ns or None), each in time order. A take runs from its
    lock's call at the take site through its condition waits to its unlock (the GIL is held from there); a drop from
    its lock's call at the other site to its unlock (the GIL free from there). Signals sent between a drop's lock and
    unlock are the drop's."""
    per = defaultdict(list)
    for th, ns, kind, m, site in events:
        per[th].append((ns, kind, m, site))
    takes, drops = [], []
    for th, es in per.items():
        state, start, locked, waits, sig, sent = None, 0, 0, 0, None, None
        for ns, kind, m, site in es:
            if m == mutex and kind == "l":
                state, start, locked, waits = ("take" if site == take else "drop"), ns, ns, 0
                sig = sent = None
            elif m == mutex and kind == "L" and state in ("take", "drop") and locked == start:
                locked = ns
            elif m == mutex and kind == "W" and state == "take":
                waits += 1
            elif kind == "s" and state == "drop":
                sig = ns
            elif kind == "S" and state == "drop" and sig is not None:
                sig, sent = ns - sig, ns
            elif m == mutex and kind == "U" and state == "take":
                takes.append((ns, th, waits, locked - start))
                state = None
            elif m == mutex and kind == "U" and state == "drop":
                drops.append((ns, th, sig, locked - start, sent))
                state = None
    return sorted(takes), sorted(drops)


def signals_of(drops: list[tuple]) -> list[tuple[int, int]]:
    """(returned_ns, thread) of every drop's signal, in time order."""
    return sorted((d[4], d[1]) for d in drops if d[4] is not None)


def signal_before(signals: list[tuple[int, int]], ns: int, th: int) -> int | None:
    """When the last signal by another thread than `th` before `ns` returned, or None."""
    i = bisect.bisect_left(signals, (ns,)) - 1
    while i >= 0 and signals[i][1] == th:
        i -= 1
    return signals[i][0] if i >= 0 else None


def summarise(takes: list[tuple], drops: list[tuple], wakes: list[tuple], iterations: int) -> dict:
    """The point's figures (see the module's docstring). wakes: wake_ends's."""
    drop_times = [d[0] for d in drops]
    gaps = defaultdict(list)
    for ns, th, waits, _ in takes:
        i = bisect.bisect_left(drop_times, ns) - 1
        if i < 0:
            continue
        dropper = drops[i][1]
        kind = "retake" if dropper == th else ("woken" if waits else "barge")
        gaps[kind].append(ns - drops[i][0])
    signals = signals_of(drops)
    wake = defaultdict(list)
    for ns, th, won, _ in wakes:
        sent = signal_before(signals, ns, th)
        if sent is not None:
            wake["won" if won else "futile"].append(ns - sent)
    per = max(iterations, 1)
    return {"per_iteration": {**{f"takes_{k}": len(v) / per for k, v in gaps.items()},
                              **{f"wakes_{k}": len(v) / per for k, v in wake.items()},
                              "signals": len(signals) / per, "waits": sum(t[2] for t in takes) / per},
            "gap_us_deciles": {k: deciles(v) for k, v in gaps.items()},
            "gap_us_mean": {k: round(statistics.mean(v) / 1e3, 2) for k, v in gaps.items() if v},
            "wake_us_deciles": {k: deciles(v) for k, v in wake.items()},
            "signal_us_deciles": deciles([d[2] for d in drops if d[2] is not None]),
            "take_mutex_wait_us_deciles": deciles([t[3] for t in takes]),
            "drop_mutex_wait_us_deciles": deciles([d[3] for d in drops])}


def wake_ends(events: list[tuple], mutex: str, take: int) -> list[tuple]:
    """Every condition wait on the GIL that ended: (ended_ns, thread, whether the thread then took the GIL without
    waiting again, slept_from_ns)."""
    per = defaultdict(list)
    for th, ns, kind, m, site in events:
        if m == mutex and kind in ("w", "W", "U"):
            per[th].append((ns, kind, site))
    out = []
    for th, es in per.items():
        for (before, was, _), (ns, kind, _), (_, after, _) in zip(es, es[1:], es[2:]):
            if kind == "w" and was == "W":
                out.append((ns, th, after == "U", before))
    return sorted(out)


def wake_samples(drops: list[tuple], wakes: list[tuple], keep: int = 1500) -> list[tuple[float, float, int]]:
    """Per wake (at most `keep`, evenly spread): how long its thread had slept when the last signal by another
    thread before the wake returned, the wake's latency after that signal (both us), and 1 if it took the GIL."""
    signals = signals_of(drops)
    out = []
    for ns, th, won, slept_from in wakes:
        sent = signal_before(signals, ns, th)
        if sent is not None and sent >= slept_from:
            out.append((round((sent - slept_from) / 1e3, 2), round((ns - sent) / 1e3, 2), int(won)))
    step = max(1, len(out) // keep)
    return out[::step][:keep]


def main() -> None:
    lib = preloaded(HERE / "giltrace.c", LIBRARY)
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lab/ (record)

    import record
    from cold_start import build
    from gil_churn import churn

    out = Path(sys.argv[1])
    window = float(sys.argv[2]) if len(sys.argv) > 2 else 0.03
    spin = build()
    points = [(n, f) for f in FREES_US for n in THREADS]
    for n, f in points:
        churn(spin, n, f, 0.01)  # warm-up
    dump = Path("/tmp/churntrace.tsv")
    results, take_site = {}, None
    for n, f in points:
        untraced = churn(spin, n, f, window)
        lib.giltrace_start()
        run = churn(spin, n, f, window)
        lib.giltrace_stop()
        lib.giltrace_dump(str(dump).encode())
        events, sites = read_dump(dump)
        mutex, named = gil_of(events, sites)
        take_site = named or take_site
        take = next(s for s, name in sites.items() if name == take_site)
        takes, drops = gil_events(events, mutex, take)
        wakes = wake_ends(events, mutex, take)
        s = summarise(takes, drops, wakes, sum(run["iterations"]))
        results[f"{n}:{f}"] = {"threads": n, "free_us": f, "per_iteration_s": run["per_iteration_s"],
                               "untraced_per_iteration_s": untraced["per_iteration_s"],
                               "held_mean_s": run["held_mean_s"],
                               "switches_per_iteration": run["switches"] / max(sum(run["iterations"]), 1), **s,
                               "wakes_slept_latency_won": wake_samples(drops, wakes)}
        print(f"{n} threads, spin {f:4.1f} us: {run['per_iteration_s'] * 1e6:6.2f} us an iteration traced "
              f"({untraced['per_iteration_s'] * 1e6:.2f} not); per iteration "
              + ", ".join(f"{k} {v:.2f}" for k, v in s["per_iteration"].items())
              + f"; gap mean us {s['gap_us_mean']}; wake deciles {s['wake_us_deciles']}; signal "
              f"{s['signal_us_deciles']}; take's mutex wait {s['take_mutex_wait_us_deciles']}", flush=True)
    record.write(out, torch.device("cpu"), window_s=window, take_site=take_site, results=results)
    print(f"written {out} ({time.strftime('%H:%M:%S')})")


if __name__ == "__main__":
    main()
