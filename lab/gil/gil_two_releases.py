"""A trial outside the model: the GIL experiment with two GIL releases per launch (the launch's own and the free of
its result, which torch runs with the GIL released) and every release handed to the woken thread.

    python lab/gil/gil_two_releases.py RUN.json     # a `hw scenario data-parallel --calibrate` output

The wake-up curve is re-read by the same model: each two-thread hold probe of RUN.json's calibration is simulated
and its cost per wake-up adjusted until the simulation gives the probe's measured time; then 1-8 threads are
predicted and set beside the experiment's measured times (docs/lab/data-parallel-interfaces.md, item 6).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's hw and parsim, run from anywhere
from hw.interfaces.launch_threads import paired_extra  # noqa: E402
from parsim.profile import GilCosts  # noqa: E402
from parsim.sim.gil import Gil, GilLaunch, gil_thread, wake_cost, wake_curve  # noqa: E402
from parsim.sim.machine import Machine  # noqa: E402

RELEASES = 2
FREE_RELEASED_S = 0.3e-6  # the free's GIL-free part (not measured; the pace barely depends on it under hand-offs)
ITERATIONS = 12


class HandingGil(Gil):
    """The GIL, every release handed to the woken sleeper (the launcher never takes it back first)."""

    def release(self, thread: object, coming_back: bool) -> float:
        return super().release(thread, False)


def pace(curve, held_s: float, released_s: float, threads: int, hold_s: float,
         launches: int = 150) -> tuple[float, float]:
    """Time per launch of `threads` threads, and the median idle time of a sleeper when woken."""
    m = Machine()
    lock = HandingGil(m.env, None, None)
    slept: list[float] = []
    cost = wake_cost(curve)
    lock.wake = lambda s: (slept.append(s), cost(s))[1]
    steps = [GilLaunch(None, held_s / 2 + hold_s, released_s), GilLaunch(None, held_s / 2, FREE_RELEASED_S)]
    workers = [gil_thread(m, f"t{i}", lock) for i in range(threads)]
    for w in workers:
        w.steps += steps * launches
    m.run()
    done = min(w.finished_at for w in workers)
    ends = sorted(end for w in workers for _, _, end in w.launch_spans if end <= done)
    skip = 2 * threads * RELEASES
    return (ends[-1] - ends[skip - 1]) / (len(ends) - skip) * RELEASES, statistics.median(slept) if slept else 0.0


def main() -> None:
    run = json.loads(Path(sys.argv[1]).read_text())
    gil = GilCosts(**{k: tuple(map(tuple, v)) if k == "wake" else v for k, v in run["calibrated"]["gil"].items()})
    times = {(p["threads"], p["hold_s"], "probe"): p for p in run["raw"]["calibration"]["holds"]}
    holds = sorted(hold for n, hold, _ in times if n == 2)
    one = [times[(1, h, "probe")]["per_launch_s"] for h in holds]
    two = [o + paired_extra(times, n=2, hold=h) for o, h in zip(one, holds)]  # as hw.interfaces.launch_threads.gil_costs reads them
    held, released = gil.held_s, gil.released_s or 0.0
    cost, slept = [3e-6] * len(holds), list(one)
    for _ in range(ITERATIONS):
        sims = [pace(wake_curve(list(zip(slept, cost))), held, released, 2, h) for h in holds]
        cost = [max(c + (t - s) / RELEASES, 0.0) for c, t, (s, _) in zip(cost, two, sims)]
        slept = [s for _, s in sims]
    curve = wake_curve(list(zip(slept, cost)))
    print("curve (idle us, cost us):", [(round(s * 1e6), round(c * 1e6, 1)) for s, c in curve])
    measured = {int(n): t["per_launch_s"] for n, t in run["raw"]["times"].items()}
    for n in sorted(measured):
        p, s = pace(curve, held, released, n, 0.0)
        print(f"{n} threads: measured {measured[n] * 1e6:6.2f} us, predicted {p * 1e6:6.2f} us "
              f"({p / measured[n] - 1:+.0%}), sleepers idle {s * 1e6:.0f} us")


if __name__ == "__main__":
    main()
