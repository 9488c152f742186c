"""How fast is the simulator itself? Times per case as ratios to the reference loop (benchmarks/reference.py).

Run: python benchmarks/simulator_speed.py [--repeat N] [--base COMMIT]
Cases are 1F1B on the default MLP model with one layer per stage: the schedule built and predicted in one
process (as `predict` runs them, the cycle collector paused), and the CLI's largest example
(`python -m parsim predict --schedule 1f1b --gpus 64 --microbatches 1024 --layers 64`) end to end, interpreter
start-up included. With --base, the same cases of another commit (checked out into a temporary worktree),
in turns with this checkout's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from reference import interleaved, load, machine, report

ROOT = Path(__file__).resolve().parents[1]
CASES = [(8, 64), (64, 1024)]  # (stages, micro-batches)

# Times build + predict in a fresh process of the given tree; prints seconds and the number of actions.
IN_PROCESS = """
import sys, time
sys.path.insert(0, sys.argv[1])
try:
    from parsim.sim.machine import gc_paused
    from parsim.sim.predict import predict
except ImportError:  # a commit before parsim/sim/ (such as c86fe3d)
    from parsim.machine import gc_paused
    from parsim.predict import predict
from parsim.profile import load_profile
from parsim.schedules import build
from parsim.workload import mlp_model
stages, mbs = int(sys.argv[2]), int(sys.argv[3])
profile, model = load_profile(), mlp_model(layers=stages, tokens=1024 * mbs)
start = time.perf_counter()
with gc_paused():
    schedule = build("1f1b", stages, mbs)
    predict(schedule, model, profile)
print(time.perf_counter() - start, sum(len(a) for a in schedule.actions))
"""


def in_process(tree: Path, stages: int, mbs: int) -> float:
    out = subprocess.run([sys.executable, "-c", IN_PROCESS, str(tree), str(stages), str(mbs)], cwd=tree,
                         capture_output=True, text=True, check=True).stdout.split()
    return float(out[0])


def cli(tree: Path) -> float:
    argv = [sys.executable, "-m", "parsim", "predict", "--schedule", "1f1b", "--gpus", "64", "--microbatches", "1024",
            "--layers", "64"]
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, cwd=tree, env=os.environ | {"PYTHONPATH": str(tree)})
    return time.perf_counter() - start


def cases(tree: Path, tag: str) -> dict:
    out = {f"{tag}1f1b {s} x {m}: build + predict": (lambda s=s, m=m: in_process(tree, s, m)) for s, m in CASES}
    out[f"{tag}CLI predict 1f1b 64 x 1024 (with start-up)"] = lambda: cli(tree)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--base", help="also time this commit's simulator, in turns with this checkout's")
    args = parser.parse_args()
    print(machine())
    print(f"{load()} before; median of {args.repeat}, cases in turns")
    with tempfile.TemporaryDirectory() as tmp:
        todo = cases(ROOT, "")
        if args.base:
            base = Path(tmp) / "base"
            subprocess.run(["git", "worktree", "add", "--detach", str(base), args.base], cwd=ROOT, check=True,
                           capture_output=True)
            todo |= cases(base, f"{args.base[:7]}: ")
        try:
            times = interleaved(todo, args.repeat)
        finally:
            if args.base:
                subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=True)
    print("\n".join(report(times)))
    print(f"{load()} after")


if __name__ == "__main__":
    main()
