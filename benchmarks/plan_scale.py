"""Issue 46's figures: `plan` at the scale LLMs are trained, and `predict` of a long 1F1B, against main 71809e1
(checked out alongside, into a temporary worktree) and the reference loop (benchmarks/reference.py), in one run.

Run: python benchmarks/plan_scale.py [--repeat N] [--base COMMIT] [--base-repeat N] [--base-timeout S]
Cases, in turns round by round (wall time of the CLI, interpreter start-up included, unless said):
- `plan --model llama-3-8b --seq-len 4096 --top 3 --gpus G --global-batch 8G` for G in 8, 16, 32, 64, 256, 1024;
  the base's is stopped after --base-timeout seconds (its 64 GPUs took more than 300 s), and not run at larger G
  once stopped: its figure is then a floor ("> S");
- `predict --schedule 1f1b --gpus 64 --microbatches 1024 --layers 64`, and the same schedule built and predicted in
  one process (benchmarks/simulator_speed.py's case).
Prints each case's median, its ratio to the loop, the base's, and how many times faster this checkout is; and
whether both print the same top 3 where the base finished.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from plan_speed import top_rows
from reference import interleaved, load, machine
from simulator_speed import in_process

ROOT = Path(__file__).resolve().parents[1]
GPUS = (8, 16, 32, 64, 256, 1024)
PREDICT = ["predict", "--schedule", "1f1b", "--gpus", "64", "--microbatches", "1024", "--layers", "64"]


def plan_args(gpus: int) -> list[str]:
    return ["plan", "--model", "llama-3-8b", "--seq-len", "4096", "--top", "3", "--gpus", str(gpus),
            "--global-batch", str(8 * gpus)]


def timed(tree: Path, args: list[str], timeout_s: float | None = None, out: list[str] | None = None) -> float:
    """Wall seconds of `python -m parsim ARGS` in `tree` (inf where stopped at timeout_s); its stdout kept in out."""
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "parsim", *args], cwd=tree, capture_output=True, text=True,
                              env=os.environ | {"PYTHONPATH": str(tree)}, check=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return float("inf")
    if out is not None:
        out.append(done.stdout)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--base", default="71809e1")
    parser.add_argument("--base-repeat", type=int, default=1, help="rounds that run the (slow) base plan (default 1)")
    parser.add_argument("--base-timeout", type=float, default=150.0, help="seconds before a base plan is stopped")
    args = parser.parse_args()
    print(machine())
    print(f"{load()} before; median of {args.repeat} ({args.base_repeat} for {args.base}'s plan), cases in turns")
    outputs: dict[str, list[str]] = {}
    stopped: dict[str, float] = {}  # base plans stopped, and when
    rounds = {"n": 0}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.base], cwd=ROOT, check=True,
                       capture_output=True)

        def base_plan(g: int) -> float:
            key = f"base plan {g}"
            if rounds["n"] > args.base_repeat or any(int(k.split()[-1]) <= g for k in stopped):
                return float("nan")
            t = timed(base, plan_args(g), args.base_timeout, outputs.setdefault(key, []))
            if t == float("inf"):
                stopped[key] = args.base_timeout
            return t

        def start_round() -> float:
            rounds["n"] += 1
            return 0.0

        cases = {"round": start_round}
        for g in GPUS:
            cases[f"plan {g}"] = lambda g=g: timed(ROOT, plan_args(g), None, outputs.setdefault(f"plan {g}", []))
            cases[f"base plan {g}"] = lambda g=g: base_plan(g)
        cases["predict"] = lambda: timed(ROOT, PREDICT)
        cases["base predict"] = lambda: timed(base, PREDICT)
        cases["in-process"] = lambda: in_process(ROOT, 64, 1024)
        cases["base in-process"] = lambda: in_process(base, 64, 1024)
        try:
            times = interleaved(cases, args.repeat)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=True)
    ref = statistics.median(times["reference"])
    print(f"reference loop: {ref:.2f} s")
    print(f"{'case':<58} {'this':>8} {'/loop':>7} {args.base:>9} {'/loop':>7} {'faster':>8}")
    rows = [(f"plan llama-3-8b --top 3 on {g} GPUs", f"plan {g}", f"base plan {g}") for g in GPUS]
    rows += [("predict 1f1b 64 x 1024 (CLI, with start-up)", "predict", "base predict"),
             ("1f1b 64 x 1024: build + predict (in one process)", "in-process", "base in-process")]
    for label, ours_key, base_key in rows:
        ours = statistics.median(times[ours_key])
        ran = [t for t in times[base_key] if t == t]
        theirs = statistics.median(ran) if ran else float("inf")
        floor = "> " if theirs == float("inf") or base_key in stopped else ""
        theirs_s = args.base_timeout if floor else theirs
        base_cell = f"{floor}{theirs_s:.2f} s" if ran or base_key in stopped else "not run"
        base_ratio = f"{floor}{theirs_s / ref:.1f}x" if ran or base_key in stopped else ""
        faster = f"{'>' if floor else ''}{theirs_s / ours:.1f}x" if ran or base_key in stopped else ""
        print(f"{label:<58} {ours:6.2f} s {ours / ref:6.2f}x {base_cell:>9} {base_ratio:>7} {faster:>8}")
    for g in GPUS:
        ours_top = [top_rows(o) for o in outputs.get(f"plan {g}", [])]
        theirs_top = [top_rows(o) for o in outputs.get(f"base plan {g}", [])]
        same_runs = all(t == ours_top[0] for t in ours_top)
        verdict = ("the same as " + args.base + "'s" if theirs_top and theirs_top[0] == ours_top[0] else
                   f"{args.base} did not finish" if not theirs_top else f"DIFFERENT from {args.base}'s {theirs_top[0]}")
        print(f"{g} GPUs: top 3 {ours_top[0]} ({verdict}{'' if same_runs else '; NOT the same across repeats'})")
    print(f"{load()} after")


if __name__ == "__main__":
    main()
