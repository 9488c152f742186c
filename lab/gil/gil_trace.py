"""When the GIL experiment's threads hold the GIL and when it is free: every take and drop, timed (issue 19).

    python lab/gil/gil_trace.py OUT.json [WINDOW_S]

An LD_PRELOAD library (lab/gil/giltrace.c, built here with the C compiler) logs every pthread mutex lock, unlock
and condition wait with its time and calling site while the experiment's loop (lab/gil/gil_release_probes.py)
runs for WINDOW_S (default 0.03 s): allocating (`x + 1`) at 1, 2, 3, 4, 8 threads, into its own tensor (`out=`)
at 1 and 2. CPython 3.12 keeps the GIL as a flag under a mutex: take_gil locks it, may wait on its condition
variable, sets the flag and unlocks; drop_gil locks it, clears the flag, signals and unlocks. So the GIL's mutex is
the one the interpreter locks most, a thread holds the GIL from a take's unlock to its next drop's lock, and the
take site is the one whose locks are followed by waits. Per point: the deciles of the held and free intervals,
how many takes waited, and for takes that did not, how long after another thread's drop they came; each thread's
intervals are kept (times in ns from the window's start). Each point's loop is also timed untraced just before,
so what the hooks cost (a time-stamp read and a store per event, ~25 events a launch) shows beside it.
"""

from __future__ import annotations

import bisect
import gzip
import json
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # its sibling scripts, run from anywhere
from preload import preloaded  # noqa: E402

LIBRARY = Path("/tmp/libgiltrace.so")
POINTS = (("alloc-after", 2), ("alloc-after", 1), ("alloc-after", 3), ("alloc-after", 4), ("alloc-after", 8),
          ("out-after", 2), ("out-after", 1))  # two threads first: their waits name take_gil's site


def read_dump(path: Path) -> tuple[list[tuple], dict[int, str]]:
    events, sites = [], {}
    for line in path.read_text().splitlines():
        f = line.split("\t")
        if f[0] == "site":
            sites[int(f[1])] = Path(f[2]).name + ":" + f[3]
        else:
            events.append((int(f[0]), int(f[1]), f[2], f[3], int(f[4])))
    return events, sites


def gil_of(events: list[tuple], sites: dict[int, str]) -> tuple[str, str | None]:
    """The GIL's mutex (the one locked most from the interpreter) and take_gil's lock site, named (its locks are
    the ones followed by condition waits on it; None where no take waited)."""
    python = {s for s, name in sites.items() if name.startswith(("libpython", "python"))}
    mutex = Counter(e[3] for e in events if e[2] == "L" and e[4] in python).most_common(1)[0][0]
    waited = Counter()
    for es in on_mutex(events, mutex).values():
        for (_, kind, site), (_, after, _) in zip(es, es[1:]):
            if kind == "L" and after == "W":
                waited[site] += 1
    return mutex, sites[waited.most_common(1)[0][0]] if waited else None


def on_mutex(events: list[tuple], mutex: str) -> dict[int, list[tuple]]:
    """Per thread, its (ns, kind, site) events on `mutex`, in order."""
    per = defaultdict(list)
    for th, ns, kind, m, site in events:
        if m == mutex:
            per[th].append((ns, kind, site))
    return per


def intervals(events: list[tuple], mutex: str, take: int) -> dict:
    """Per thread, its GIL intervals in order: ("held", start, end) from a take's unlock to the next drop's lock,
    ("free", start, end) from a drop's unlock to the next take's lock, and each take's waits."""
    out = {}
    for th, es in on_mutex(events, mutex).items():
        rows, state, since, waits = [], None, None, 0
        for ns, kind, site in es:
            if kind == "L" and site == take:
                if state == "free":
                    rows.append(("free", since, ns, 0))
                state, waits = "taking", 0
            elif kind == "W" and state == "taking":
                waits += 1
            elif kind == "U" and state == "taking":
                state, since = "held", ns
                rows.append(("took", ns, ns, waits))
            elif kind == "L" and site != take and state == "held":
                rows.append(("held", since, ns, 0))
                state = "dropping"
            elif kind == "U" and state == "dropping":
                state, since = "free", ns
        out[th] = rows
    return out


def summarise(rows_by_thread: dict, launches: int, threads: int) -> dict:
    held = [r[2] - r[1] for rs in rows_by_thread.values() for r in rs if r[0] == "held"]
    free = [r[2] - r[1] for rs in rows_by_thread.values() for r in rs if r[0] == "free"]
    takes = [r for rs in rows_by_thread.values() for r in rs if r[0] == "took"]
    drops = sorted((r[1], th) for th, rs in rows_by_thread.items() for r in rs if r[0] == "free")
    times = [t for t, _ in drops]
    # for each take that did not wait: how long after the last drop by another thread it came
    lag = []
    for th, rs in rows_by_thread.items():
        for r in rs:
            if r[0] == "took" and r[3] == 0:
                i = bisect.bisect_right(times, r[1]) - 1
                while i >= 0 and drops[i][1] == th:
                    i -= 1
                if i >= 0:
                    lag.append(r[1] - times[i])
    q = lambda v: [round(x / 1e3, 2) for x in statistics.quantiles(v, n=10)] if len(v) > 10 else []  # noqa: E731
    return {"threads": threads, "launches": launches, "drops_per_launch": len(free) / max(launches, 1),
            "held_us_deciles": q(held), "free_us_deciles": q(free),
            "takes_waited_share": sum(1 for r in takes if r[3]) / max(len(takes), 1),
            "waits_per_launch": sum(r[3] for r in takes) / max(launches, 1),
            "other_drop_to_take_us_deciles": q(lag)}


def main() -> None:
    lib = preloaded(HERE / "giltrace.c", LIBRARY)
    import torch
    from gil_release_probes import loop  # a sibling script: puts this checkout's hw on the path

    out = Path(sys.argv[1])
    window = float(sys.argv[2]) if len(sys.argv) > 2 else 0.03
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    for place, n in POINTS:
        loop(device, n, place, 0.0, 0.02)  # warm-up
    results, raw, take_site = {}, {}, None
    dump = Path("/tmp/giltrace.tsv")
    for place, n in POINTS:
        untraced = loop(device, n, place, 0.0, window)["per_launch_s"]  # what the hooks cost, beside the trace
        lib.giltrace_start()
        run = loop(device, n, place, 0.0, window)
        lib.giltrace_stop()
        lib.giltrace_dump(str(dump).encode())
        events, sites = read_dump(dump)
        mutex, named = gil_of(events, sites)
        take_site = named or take_site  # one thread never waits: the site named by an earlier point's waits
        take = next(s for s, name in sites.items() if name == take_site)
        rows = intervals(events, mutex, take)
        key = f"{place}:{n}"
        results[key] = {"per_launch_s": run["per_launch_s"], "untraced_per_launch_s": untraced, "take_site": take_site,
                        **summarise(rows, sum(run["launches"]), n)}
        t0 = min(e[1] for e in events)
        raw[key] = {str(th): [(kind, r0 - t0, r1 - t0, w) for kind, r0, r1, w in rs] for th, rs in rows.items()}
        s = results[key]
        print(f"{key:14} {run['per_launch_s'] * 1e6:6.2f} us a launch traced ({untraced * 1e6:.2f} not), "
              f"{s['drops_per_launch']:.2f} drops "
              f"and {s['waits_per_launch']:.2f} waits a launch, {s['takes_waited_share']:.0%} of takes waited; held us "
              f"deciles {s['held_us_deciles']}; free {s['free_us_deciles']}; a take that did not wait came after "
              f"another's drop by {s['other_drop_to_take_us_deciles']} us", flush=True)
    out.write_text(json.dumps({"command": "python lab/gil/gil_trace.py " + " ".join(sys.argv[1:]),
                               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "torch": torch.__version__, "python": sys.version.split()[0],
                               "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                               "window_s": window, "results": results}, indent=1) + "\n")
    with gzip.open(out.with_suffix(".intervals.json.gz"), "wt") as f:
        json.dump(raw, f)


if __name__ == "__main__":
    main()
