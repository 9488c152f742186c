"""How far apart are two timings of the same GIL-experiment loop in the same rounds, with long or short windows?
(issue 19)

    python lab/gil/twin_timings.py OUT.json [REPEATS]

Each vCPU of the lent H200 machines runs at one of two speeds at a time, flipping from one 0.1 s window to the next
(data/interfaces/h200-2026-11-25-vcpu-speed: a pinned thread's pure Python loop at ~0.75 or ~1.45 us, its launches
at ~7.5 or ~11 us), so two timings of the same loop (the calibration's one thread and the experiment's) differed by
up to 28% within the same rounds. hw.interfaces.launch_threads.launch_rounds times each point over `rounds` windows of `window_s` in
shuffled turns and takes the median. Here twins, (N, 0, "a") and (N, 0, "b") for N = 1, 2, 8, are timed under two
designs of the same total time per point, long (7 windows of 0.4 s, hw's default) and short (70 of 0.04 s), the
designs alternating REPEATS times; per design and N: the twins' ratio by the median of the windows and by their
mean.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's hw, run from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lab/ (record)
from hw.interfaces.launch_threads import launch_rounds  # noqa: E402
import record  # noqa: E402

DESIGNS = {"long": (0.4, 7), "short": (0.04, 70)}  # (window_s, rounds)
COUNTS = (1, 2, 8)


def compare(designs: dict, counts: tuple[int, ...], repeats: int, twins) -> tuple[list[dict], dict]:
    """Per repeat and design, the twins' times of each count (twins(params) -> {n: (a_times, b_times)}), their
    ratios by the median and by the mean; and per design and estimator the median and worst |b/a - 1|."""
    runs = []
    for k in range(repeats):
        for design, params in designs.items():
            row = {"design": design, "repeat": k, "params": params, "twins": {}}
            for n, (a, b) in twins(params).items():
                row["twins"][n] = {"a": a, "b": b, "median_ratio": statistics.median(b) / statistics.median(a),
                                   "mean_ratio": statistics.mean(b) / statistics.mean(a)}
            runs.append(row)
            print(f"{design:5} repeat {k}: " + "; ".join(
                f"N={n}: b/a {t['median_ratio']:.3f} (median), {t['mean_ratio']:.3f} (mean)"
                for n, t in row["twins"].items()), flush=True)
    summary = {}
    for design in designs:
        for est in ("median_ratio", "mean_ratio"):
            devs = [abs(r["twins"][n][est] - 1) for r in runs if r["design"] == design for n in counts]
            summary[f"{design}:{est}"] = {"worst": max(devs), "median": statistics.median(devs)}
            print(f"{design:5} {est:12}: |b/a - 1| median {statistics.median(devs):.1%}, worst {max(devs):.1%}")
    return runs, summary


def main() -> None:
    out = Path(sys.argv[1])
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    points = tuple((n, 0.0, twin) for n in COUNTS for twin in ("a", "b"))

    def twins(params: tuple[float, int]) -> dict:
        times = launch_rounds(device, points, *params)
        return {n: tuple([r["per_launch_s"] for r in times[(n, 0.0, t)]["rounds"]] for t in ("a", "b"))
                for n in COUNTS}

    runs, summary = compare(DESIGNS, COUNTS, repeats, twins)
    record.write(out, device, designs=DESIGNS, runs=runs, summary=summary)

if __name__ == "__main__":
    main()
