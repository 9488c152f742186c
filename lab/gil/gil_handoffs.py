"""What a GIL hand-off costs between launching threads, and whether it is the wake-up of an idle core.

    python lab/gil/gil_handoffs.py OUT.json [ROUNDS [VARIANTS]]

The GIL experiment (hw.interfaces.launch_threads.launch_loop: N threads, each launching `y = x + 1` on its own stream of GPU 0) at
N = 1..8 under four placements of its threads, all in turns within each round (the lent hosts drift):
`free` (as the experiment runs: the OS places them), `one` (all on one CPU: the woken thread runs only once the
thread that woke it sleeps, on a core that never idles), `two` (alternating between two CPUs of different physical
cores) and `spread` (each on a physical core of its own). Each launch's start and end are logged, so every GIL
interval is known: a thread holds the GIL from the end of its previous launch (the launch returns once it has the
GIL back) to the start of the next, where torch's binding drops it. Per (placement, N): the time per launch of all,
and each hand-off's gap (from one thread's launch start to the next holder's launch end, which includes the
launch's GIL-held part) against how long the thread taking the GIL had waited, binned. If the gap grows with the
waiting time under `free` and `spread` but not under `one`, a hand-off's cost is the wake-up of an idle core; if it
grows with N at equal waiting times, something else sets it. A variant's suffix sets what each launch does with
memory (`logged_loop`): none, it allocates its result and frees it (as the experiment); `-out`, neither; `-keep`, it
allocates and frees nothing; `-del`, it frees a tensor made beforehand and allocates nothing; e.g. `free-keep`.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's hw, run from anywhere
from hw.interfaces.launch_threads import ELEMENTS, keep_clocks_up  # noqa: E402
from hw.interfaces.hogwild import machine  # noqa: E402

COUNTS = range(1, 9)
WINDOW_S = 0.2
LOGGED = 3000  # launches whose (start, end) the first round keeps, per (placement, N)
BINS_US = (0, 10, 20, 40, 80, 160, 320, 640, 1e9)  # the taking thread's wait, us


def physical_cpus() -> list[int]:
    """One CPU per physical core this process may use (the first sibling of each), then the rest."""
    allowed = sorted(os.sched_getaffinity(0))
    first, rest, seen = [], [], set()
    for cpu in allowed:
        try:
            core = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/core_id").read_text().strip()
            pkg = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id").read_text().strip()
        except OSError:
            core, pkg = str(cpu), "0"
        (rest if (pkg, core) in seen else first).append(cpu)
        seen.add((pkg, core))
    return first + rest


def placement_cpus(placement: str, threads: int, cpus: list[int]) -> list[set[int] | None]:
    """The CPU set each thread is bound to (None: unbound)."""
    if placement == "free":
        return [None] * threads
    def cpu(k: int) -> set[int]:  # from the second CPU on (interrupts and the main thread like the first)
        return {cpus[(1 + k) % len(cpus)]}

    if placement == "one":
        return [cpu(0)] * threads
    if placement == "two":
        return [cpu(i % 2) for i in range(threads)]
    return [cpu(i) for i in range(threads)]  # spread


MEMORY = ("alloc", "out", "keep", "del")  # what a launch does with memory: variant suffixes "", "-out", "-keep", "-del"
KEPT = {"cuda": 40_000, "cpu": 150_000}  # tensors a thread may keep (-keep) or free (-del): more than it launches
                                        # in WINDOW_S (a launch takes 6 us at least on the H200s, 1.5 us on a CPU)


def logged_loop(device: torch.device, threads: int, placement: str, cpus: list[int], memory: str = "alloc") -> dict:
    """`threads` threads launching for WINDOW_S, each bound as `placement` says; every launch's (start, end).
    memory: "alloc", each launch allocates its result and frees it (`x + 1`, as the experiment); "out", it writes
    into a tensor of its thread's (torch.add(x, 1, out=y)): no allocation, no free; "keep", it allocates its result
    and keeps it (freed after the window): an allocation without a free; "del", it writes into its thread's tensor
    and frees one tensor made before the window: a free without an allocation."""
    xs = [torch.ones(ELEMENTS[device.type], device=device) for _ in range(threads)]
    ys = [torch.empty_like(x) for x in xs]
    spare = [[torch.empty_like(x) for _ in range(KEPT[device.type] if memory == "del" else 0)] for x in xs]
    streams = [torch.cuda.Stream(device) if device.type == "cuda" else None for _ in range(threads)]
    bound = placement_cpus(placement, threads, cpus)
    go = threading.Barrier(threads + 1)
    logs: list[list[tuple[float, float]]] = [[] for _ in range(threads)]
    counts, deadline, clock = [0] * threads, [0.0], time.perf_counter

    def work(i: int) -> None:
        if bound[i] is not None:
            os.sched_setaffinity(threading.get_native_id(), bound[i])
        x, y, log, n, kept, pool = xs[i], ys[i], logs[i], 0, [], spare[i]
        with torch.cuda.stream(streams[i]) if streams[i] is not None else contextlib.nullcontext():
            go.wait()
            end = deadline[0]
            while True:
                t0 = clock()
                if t0 >= end:
                    break
                if memory == "alloc":
                    x + 1
                elif memory == "out":
                    torch.add(x, 1, out=y)
                elif memory == "keep":
                    kept.append(x + 1)
                else:
                    torch.add(x, 1, out=y)
                    pool.pop()
                log.append((t0, clock()))
                n += 1
        counts[i] = n

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    keep_clocks_up(device, WINDOW_S + 0.05)
    start = clock()
    deadline[0] = start + WINDOW_S
    go.wait()
    for w in workers:
        w.join()
    ends = [log[-1][1] for log in logs if log]
    elapsed = max(ends) - start
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {"per_launch_s": elapsed / max(sum(counts), 1), "launches": counts, "logs": logs}


def handoffs(logs: list[list[tuple[float, float]]]) -> tuple[list[float], list[float], int]:
    """Each hand-off's (gap, the taker's wait) and the launches that kept the GIL: the GIL intervals are
    (end of a thread's launch k, start of its launch k+1), ordered by their start."""
    intervals = sorted((log[k][1], log[k + 1][0], i, log[k][1] - log[k][0]) for i, log in enumerate(logs)
                       for k in range(len(log) - 1))
    gaps, waits, kept = [], [], 0
    for (s1, e1, a, _), (s2, e2, b, wait) in zip(intervals, intervals[1:]):
        if a == b:
            kept += 1
            continue
        gaps.append(s2 - e1 + 0.0)  # from a's launch start (it drops the GIL in it) to b's launch end (b has it)
        waits.append(wait)
    return gaps, waits, kept


def summary(run: dict, sample: bool) -> dict:
    gaps, waits, kept = handoffs(run["logs"])
    out = {"per_launch_s": run["per_launch_s"], "launches": run["launches"], "handoffs": len(gaps), "kept": kept}
    if gaps:
        out["gap_median_s"] = statistics.median(gaps)
        out["wait_median_s"] = statistics.median(waits)
        binned = []
        for lo, hi in zip(BINS_US, BINS_US[1:]):
            g = [x for x, w in zip(gaps, waits) if lo <= w * 1e6 < hi]
            if g:
                binned.append({"wait_us": [lo, hi], "n": len(g), "gap_median_s": statistics.median(g)})
        out["by_wait"] = binned
    if sample:  # the raw (start, end) pairs of each thread's first launches, in units of 100 ns
        out["sample_logs_100ns"] = [[(round(a * 1e7), round(b * 1e7)) for a, b in log[:LOGGED // len(run["logs"])]]
                                    for log in run["logs"]]
    return out


def variant(name: str) -> tuple[str, str]:
    """A variant's (placement, memory): "spread-keep" -> ("spread", "keep"); no suffix: "alloc"."""
    placement, _, memory = name.partition("-")
    if memory not in MEMORY[1:] + ("",) or placement not in ("free", "one", "two", "spread"):
        raise SystemExit(f"gil_handoffs.py: unknown variant {name!r}")
    return placement, memory or "alloc"


def main() -> None:
    out = Path(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    cpus = physical_cpus()
    variants = sys.argv[3].split(",") if len(sys.argv) > 3 else ["free", "one", "two", "spread"]
    points = [(v, n) for v in variants for n in COUNTS if not (n == 1 and v in ("two", "spread"))]
    def loop(v: str, n: int) -> dict:
        placement, memory = variant(v)
        return logged_loop(device, n, placement, cpus, memory)

    for v, n in points:  # warm-up
        loop(v, n)
    runs: dict[str, list[dict]] = {f"{v}:{n}": [] for v, n in points}
    for r in range(rounds):
        for v, n in points:
            runs[f"{v}:{n}"].append(summary(loop(v, n), sample=r == 0))
    for key, rs in runs.items():
        med = statistics.median(x["per_launch_s"] for x in rs)
        gap = statistics.median(x.get("gap_median_s", float("nan")) for x in rs)
        wait = statistics.median(x.get("wait_median_s", float("nan")) for x in rs)
        share = sum(x["handoffs"] for x in rs) / max(sum(x["handoffs"] + x["kept"] for x in rs), 1)
        print(f"{key:10} {med * 1e6:7.2f} us a launch; hand-offs {share:4.0%} of launches, gap {gap * 1e6:6.2f} us "
              f"after {wait * 1e6:7.1f} us waiting")
    out.write_text(json.dumps({"command": "python lab/gil/gil_handoffs.py " + " ".join(sys.argv[1:]),
                               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "torch": torch.__version__, "device": str(torch.cuda.get_device_name(device)
                                                                          if device.type == "cuda" else "cpu"),
                               "machine": machine(), "cpus_by_core": cpus, "window_s": WINDOW_S,
                               "rounds": rounds, "runs": runs}) + "\n")


if __name__ == "__main__":
    main()
