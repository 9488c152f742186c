"""What a launching thread does while it holds the GIL, when 2-8 threads make each hold longer (issue 19).

    python lab/gil/gil_stalls.py OUT.json [WINDOW_S] [--background]

The GIL trace (lab/gil/gil_trace.py, data/interfaces/h200-2026-11-25-gil-trace) showed a launch's held time grow
from 2.8 us at one thread to 5.8, 8.4, 12.1 and 16.5 us at 2, 3, 4 and 8 threads, the GIL locked ~42% of the time
from three threads on: the holder is slower, not the GIL busier. Here the same loops (lab/gil/gil_release_probes.py)
run under the same LD_PRELOAD library, which now also logs each mutex lock's call, so each held interval splits
into: waiting for the GIL's mutex to drop it, waiting for other mutexes (by library), and the rest (the thread's
own work, or its vCPU taken away). Beside each point: the machine's steal time (/proc/stat) and the threads'
involuntary context switches over the traced window, so a vCPU preempted by the host (or another task) shows.
`--background` also traces one launching Python thread beside 1, 3, 7 threads launching without the GIL
(lab/gil/held_interference.py's TorchScript loops, `bg:K`): no GIL contention, the launch path's alone.
"""

from __future__ import annotations

import bisect
import os
import resource
import statistics
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # its sibling scripts, run from anywhere
from gil_trace import LIBRARY, gil_of, intervals, read_dump  # noqa: E402
from preload import preloaded  # noqa: E402

POINTS = (("alloc-after", 2), ("alloc-after", 1), ("alloc-after", 3), ("alloc-after", 4), ("alloc-after", 8),
          ("out-after", 1), ("out-after", 2), ("out-after", 8))
BACKGROUND = (1, 3, 7)  # one launching Python thread beside this many GIL-free launching threads (`--background`)


def steal_ticks() -> tuple[int, int]:
    """(steal, all) clock ticks of every CPU together, from /proc/stat's first line."""
    f = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    v = [int(x) for x in f]
    return v[7] if len(v) > 7 else 0, sum(v[:8])


def involuntary() -> int:
    """Involuntary context switches of this process's threads so far, ended ones included."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


def library(name: str) -> str:
    lib = name.split(":")[0]
    for key in ("c10_cuda", "torch_cuda", "torch_python", "torch_cpu", "c10", "libcuda", "python", "libc"):
        if key in lib:
            return key
    return lib


def stalls(events: list[tuple], sites: dict[int, str], mutex: str, take: int) -> dict:
    """Per held interval of each thread: its drop's wait for the GIL's mutex, its waits for other mutexes (by
    library), the rest; and per take, its wait for the mutex and its condition waits."""
    per = defaultdict(list)
    for th, ns, kind, m, site in events:
        per[th].append((ns, kind, m, site))
    rows = intervals(events, mutex, take)
    held_parts, long_held = [], []
    other_by_lib = defaultdict(float)
    take_lock_wait, cond_wait, signal, dispatch, after_dispatch = [], [], [], [], []
    take_unlock, drop_unlock = {}, {}  # the GIL mutex's unlocks: call time -> how long it took
    for th, evs in per.items():
        evs.sort()
        # lock waits: an 'l' then the same thread's 'L' on the same mutex
        pending, waits, gil_unlock = {}, [], {}  # mutex -> call time; (call, got, mutex, site)
        for ns, kind, m, site in evs:
            if kind == "l":
                pending[m] = ns
            elif kind == "L" and m in pending:
                waits.append((pending.pop(m), ns, m, site))
            elif kind == "W":
                pending[("cond", m)] = ns
            elif kind == "w" and ("cond", m) in pending:
                cond_wait.append(ns - pending.pop(("cond", m)))
            elif kind == "U":
                pending[("unlock", m)] = (ns, site)
            elif kind == "u" and ("unlock", m) in pending:
                t0, where = pending.pop(("unlock", m))
                if m == mutex:
                    gil_unlock[t0] = ns - t0
            elif kind == "s":
                pending[("signal", m)] = ns
            elif kind == "S" and ("signal", m) in pending:
                t0 = pending.pop(("signal", m))
                if library(sites.get(site, "?")) == "python":
                    signal.append(ns - t0)
        take_lock_wait += [got - call for call, got, m, site in waits if m == mutex and site == take]
        drop_call = {got: call for call, got, m, _ in waits if m == mutex}
        others = [w for w in waits if w[2] != mutex]  # in call order
        calls = [w[0] for w in others]
        mine = rows.get(th, [])
        if sum(1 for r in mine if r[0] == "held") < 50:
            continue  # not a launching thread (the main thread; a background thread back from its loop)
        starts = {r[1] for r in mine if r[0] == "held"}
        last_free = 0
        for t0, dt in gil_unlock.items():
            (take_unlock if t0 in starts else drop_unlock)[t0] = dt
        for kind, s, e, _ in mine:
            if kind == "free":
                last_free = e - s
                if last_free > 3000:
                    dispatch.append(last_free)
            if kind != "held":
                continue
            drop_wait = e - drop_call.get(e, e)
            inside = [w for w in others[bisect.bisect_left(calls, s):bisect.bisect_left(calls, e - drop_wait)]
                      if w[1] <= e - drop_wait]
            other = sum(w[1] - w[0] for w in inside)
            for w in inside:
                other_by_lib[library(sites.get(w[3], "?"))] += w[1] - w[0]
            unlocking = take_unlock.get(s, 0)
            part = (e - s, drop_wait, other, e - s - drop_wait - other - unlocking, unlocking)
            held_parts.append(part)
            if last_free > 3000:
                after_dispatch.append(part[3])
            if e - s > 5000:
                long_held.append(part)

    def tot(parts, i):
        return sum(p[i] for p in parts) / 1e3
    q = lambda v: [round(x / 1e3, 2) for x in statistics.quantiles(v, n=10)] if len(v) > 10 else []  # noqa: E731
    return {"held_us": tot(held_parts, 0), "held_drop_wait_us": tot(held_parts, 1),
            "held_other_locks_us": tot(held_parts, 2), "held_rest_us": tot(held_parts, 3),
            "held_take_unlock_us": tot(held_parts, 4),
            "dispatch_deciles_us": q(dispatch), "held_after_dispatch_rest_deciles_us": q(after_dispatch),
            "held_rest_deciles_us": q([p[3] for p in held_parts]),
            "long_held": len(long_held), "long_held_us": tot(long_held, 0),
            "long_held_drop_wait_us": tot(long_held, 1), "long_held_other_locks_us": tot(long_held, 2),
            "long_held_rest_us": tot(long_held, 3), "long_held_take_unlock_us": tot(long_held, 4),
            "take_unlock_deciles_us": q(list(take_unlock.values())),
            "drop_unlock_deciles_us": q(list(drop_unlock.values())),
            "drop_unlock_us": sum(drop_unlock.values()) / 1e3,
            "signal_deciles_us": q(signal), "signal_us": sum(signal) / 1e3, "signals": len(signal),
            "other_locks_in_held_by_library_us": {k: round(v / 1e3, 2) for k, v in other_by_lib.items()},
            "take_lock_wait_deciles_us": q(take_lock_wait), "take_lock_wait_us": sum(take_lock_wait) / 1e3,
            "cond_wait_deciles_us": q(cond_wait), "cond_waits": len(cond_wait)}


def line(key: str, r: dict) -> str:
    """One point's summary: per launch unless said."""
    p, s = r["per_launch"], r["totals"]
    median = lambda v: v[4] if v else None  # noqa: E731
    return (f"{key:14} {r['per_launch_s'] * 1e6:6.2f} us a launch ({r['untraced_per_launch_s'] * 1e6:.2f} untraced); "
            f"held {p['held_us']:.2f} us = drop's mutex wait {p['held_drop_wait_us']:.2f} + other locks "
            f"{p['held_other_locks_us']:.2f} + the take's unlock {p['held_take_unlock_us']:.2f} + rest "
            f"{p['held_rest_us']:.2f} (after the dispatch: median {median(s['held_after_dispatch_rest_deciles_us'])}; "
            f"the dispatch median {median(s['dispatch_deciles_us'])}); signals {s['signals'] / r['launches']:.2f}, "
            f"{p['signal_us']:.2f} us (deciles {s['signal_deciles_us']}); drop's unlock {p['drop_unlock_us']:.2f} us; "
            f"take's mutex wait {p['take_lock_wait_us']:.2f} us; long holds (>5 us, in all) {s['long_held']}: "
            f"{s['long_held_us']:.0f} us = {s['long_held_drop_wait_us']:.0f} + {s['long_held_other_locks_us']:.0f} + "
            f"{s['long_held_take_unlock_us']:.0f} + {s['long_held_rest_us']:.0f}; other locks in held parts by "
            f"library {s['other_locks_in_held_by_library_us']}; steal {r['steal_s'] * 1e3:.1f} ms; involuntary "
            f"switches {r['involuntary_switches']}")


def main() -> None:
    lib = preloaded(HERE / "giltrace.c", LIBRARY)
    import torch
    from gil_release_probes import loop
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lab/ (record)
    import record
    from held_interference import background

    args = [a for a in sys.argv[1:] if a != "--background"]
    out = Path(args[0])
    window = float(args[1]) if len(args) > 1 else 0.03
    points = POINTS + (tuple(("bg", k) for k in BACKGROUND) if "--background" in sys.argv else ())
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    for place, n in POINTS:
        loop(device, n, place, 0.0, 0.02)  # warm-up
    results, take_site = {}, None
    dump = Path("/tmp/gilstalls.tsv")
    tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
    for place, n in points:
        bg = n if place == "bg" else 0
        threads = 1 if bg else n
        with background(device, "launch", bg):
            untraced = loop(device, threads, "alloc-after" if bg else place, 0.0, window)["per_launch_s"]
        with background(device, "launch", bg):
            steal0, all0, inv0 = *steal_ticks(), involuntary()
            lib.giltrace_start()
            run = loop(device, threads, "alloc-after" if bg else place, 0.0, window)
            lib.giltrace_stop()
            steal1, all1, inv1 = *steal_ticks(), involuntary()
        lib.giltrace_dump(str(dump).encode())
        events, sites = read_dump(dump)
        mutex, named = gil_of(events, sites)
        take_site = named or take_site
        take = next(s for s, name in sites.items() if name == take_site)
        launches = sum(run["launches"])
        s = stalls(events, sites, mutex, take)
        per_launch = {k: (v / launches if isinstance(v, float) and k.endswith("_us") else v) for k, v in s.items()}
        key = f"{place}:{n}"
        results[key] = {"threads": threads, "background_threads": bg, "launches": launches,
                        "per_launch_s": run["per_launch_s"],
                        "untraced_per_launch_s": untraced, "steal_s": (steal1 - steal0) * tick_s,
                        "cpu_s": (all1 - all0) * tick_s, "involuntary_switches": inv1 - inv0,
                        "per_launch": per_launch, "totals": s}
        print(line(key, results[key]), flush=True)
    record.write(out, device, window_s=window, results=results)


if __name__ == "__main__":
    main()
