"""How fast is the simulator itself? Prints simulated ops per second and wall time per case.

Run: python benchmarks/simulator_speed.py [--repeat N]
Cases are 1F1B on the default MLP model with one layer per stage, and the CLI's largest example
(`python -m parsim predict --schedule 1f1b --gpus 64 --microbatches 1024 --layers 64`) end to end.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # time this checkout's parsim, not whichever one is installed

from parsim.sim.predict import predict  # noqa: E402
from parsim.profile import load_profile  # noqa: E402
from parsim.schedules import build  # noqa: E402
from parsim.workload import mlp_model  # noqa: E402

CASES = [(8, 64), (64, 1024)]  # (stages, micro-batches)


def time_case(stages: int, microbatches: int, repeat: int) -> tuple[float, int]:
    """Median wall time of build + validate + simulate + metrics, and the number of actions."""
    profile = load_profile()
    model = mlp_model(layers=stages, tokens=1024 * microbatches)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        schedule = build("1f1b", stages, microbatches)
        predict(schedule, model, profile)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), sum(len(a) for a in schedule.actions)


def time_cli(repeat: int) -> float:
    argv = [sys.executable, "-m", "parsim", "predict", "--schedule", "1f1b", "--gpus", "64",
            "--microbatches", "1024", "--layers", "64"]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, cwd=ROOT)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, median of {args.repeat}")
    print(f"{'case':<22} {'actions':>9} {'wall':>9} {'actions/s':>11}")
    for stages, mbs in CASES:
        wall, actions = time_case(stages, mbs, args.repeat)
        print(f"1f1b {stages:>3} x {mbs:<5} mb  {actions:>9,} {wall:>8.3f}s {actions / wall:>11,.0f}")
    print(f"CLI, 64 x 1024 (with interpreter start-up): {time_cli(args.repeat):.3f} s")


if __name__ == "__main__":
    main()
