"""The yardstick the benchmarks divide by: 10^7 bare-Python additions, timed in the same run.

Machines (and the load on them) differ by 2x or more, so each benchmark states its times as ratios to this
loop, timed between its cases. The loop runs at module level (`s += i` on a global), as
`python -c 's = 0\nfor i in range(10_000_000): s += i'` does.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

REFERENCE = "s = 0\nfor i in range(10_000_000):\n    s += i\n"


def reference_loop_s() -> float:
    """Seconds for one run of the reference loop, in this process."""
    start = time.perf_counter()
    exec(REFERENCE, {})
    return time.perf_counter() - start


def interleaved(cases: dict[str, Callable[[], float]], repeat: int) -> dict[str, list[float]]:
    """Each case's times (a case returns its own), the reference loop's as "reference", run in turns, round by
    round, so that a change in load falls on every case alike."""
    times: dict[str, list[float]] = {"reference": []}
    for _ in range(repeat):
        times["reference"].append(reference_loop_s())
        for name, case in cases.items():
            times.setdefault(name, []).append(case())
    return times


def machine() -> str:
    """The machine, the Python and the date, for the record."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return (f"{time.strftime('%Y-%m-%d %H:%M')} on {platform.node()}: {cpu}, {os.cpu_count()} cores; "
            f"Python {platform.python_version()} ({sys.executable})")


def load() -> str:
    """The load averages over 1, 5 and 15 minutes."""
    return "load average " + ", ".join(f"{x:.1f}" for x in os.getloadavg())


def report(times: dict[str, list[float]]) -> list[str]:
    """One line per case: median seconds, its ratio to the reference loop's median, and every time measured."""
    ref = statistics.median(times["reference"])
    lines = []
    for name, ts in times.items():
        median = statistics.median(ts)
        every = ", ".join(f"{t:.2f}" for t in ts)
        lines.append(f"{name:<66} {median:8.2f} s {median / ref:7.2f}x reference   [{every}]")
    return lines
