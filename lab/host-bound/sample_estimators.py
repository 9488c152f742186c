"""Does timing a block of steps per sample steady `hw validate`'s host-bound points? One run, two estimators.

    python lab/host-bound/sample_estimators.py GRID_DIR PROFILE   # GRID_DIR holds results.csv and samples.json

Since blocks (hw.measure.steps.BLOCK_S), a timed sample's first step is what a sample was before them: one step after
the job's lead. From the same run's samples.json, each point's and its turn's host probe's step, as
  first: the median of each sample's first step (one step a sample, as before blocks)
  block: the median of each sample's mean step (as `hw validate` now reports it)
and per runtime the median / worst |error| from the profile and at the probe's host speed in each turn (as
`parsim compare` prints them, parsim.compare.host_speed_lines), with each estimator's spread: the median over
points of the samples' interquartile range over their median.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's parsim, run from anywhere
from parsim import compare  # noqa: E402
from parsim.profile import load_profile  # noqa: E402

ESTIMATORS = {"first": lambda block: block[0], "block": statistics.mean}


def spread(values: list[float]) -> float:
    """Interquartile range over the median."""
    q1, _, q3 = statistics.quantiles(values, n=4)
    return (q3 - q1) / statistics.median(values)


def main(grid: Path, profile_path: str) -> None:
    profile = load_profile(profile_path)
    points = compare.mark_host_sensitive(compare.repredict(compare.read_points(grid / "results.csv"), profile),
                                         profile)
    samples = json.loads((grid / "samples.json").read_text())["points"]
    if [(s["schedule"], s["runtime"], s["microbatches"]) for s in samples] != [
            (p.schedule, p.runtime, p.microbatches) for p in points]:
        raise SystemExit("samples.json and results.csv list different points")
    print(f"{grid}: {len(points)} points, "
          f"{statistics.median(len(b) for s in samples for b in s['steps_s']):.0f} steps a sample (median)")
    for name, of in ESTIMATORS.items():
        pts = [replace(p, measured_s=statistics.median(map(of, s["steps_s"])),
                       host_probe_s=statistics.median(map(of, s["probe_steps_s"])))
               for p, s in zip(points, samples)]
        spreads = {runtime: statistics.median(spread([of(b) for b in s["steps_s"]])
                                              for s in samples if s["runtime"] == runtime)
                   for runtime in sorted({p.runtime for p in pts})}
        print(f"{name}: spread " + ", ".join(f"{runtime} {v:.1%}" for runtime, v in spreads.items()))
        print("\n".join(compare.host_speed_lines(compare.at_measured_host(pts, profile))[2:]))  # its runtimes' lines


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]), sys.argv[2])
