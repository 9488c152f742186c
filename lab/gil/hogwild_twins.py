"""How far apart are two timings of the same Hogwild run in the same rounds, with long or short runs? (issue 19)

    python lab/gil/hogwild_twins.py OUT.json [REPEATS]

The lone Hogwild process ran at 87-89 or 110-116 steps a second from one 1 s run to the next
(data/interfaces/h200-2026-11-25-lease), the vCPUs' two speeds (lab/gil/vcpu_speed.py), so the experiment's one
process and the calibration's differed by up to 26%. hw.interfaces.hogwild.hogwild_rounds times each point as `rounds` runs
of `duration_s` in shuffled turns and takes the median. Here twins, ("a", N) and ("b", N) for N = 1, 2, 8 processes
training the scenario's model, are timed under two designs of the same time per point: long (3 runs of 1 s,
hw's default) and short (12 of 0.25 s), the designs alternating REPEATS times; per design and N: the twins' ratio
by the median of the runs and by their mean.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's hw, run from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lab/ (record)
from hw.interfaces.hogwild import hogwild_rounds  # noqa: E402
from parsim.scenarios.interfaces import HOGWILD_MODEL  # noqa: E402
import record  # noqa: E402
from twin_timings import compare  # noqa: E402

DESIGNS = {"long": (1.0, 3), "short": (0.25, 12)}  # (duration_s, rounds)
COUNTS = (1, 2, 8)


def main() -> None:
    out = Path(sys.argv[1])
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    points = [(twin, n) for n in COUNTS for twin in ("a", "b")]

    def twins(params: tuple[float, int]) -> dict:
        times = hogwild_rounds(HOGWILD_MODEL, points, *params)
        return {n: tuple([r["step_s"] for r in times[(t, n)]["runs"]] for t in ("a", "b")) for n in COUNTS}

    runs, summary = compare(DESIGNS, COUNTS, repeats, twins)
    record.write(out, torch.device("cpu"), model=HOGWILD_MODEL, designs=DESIGNS, runs=runs, summary=summary)

if __name__ == "__main__":
    main()
