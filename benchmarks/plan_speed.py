"""How fast is `plan`? Wall times of the CLI (start-up included) as ratios to the reference loop
(benchmarks/reference.py), against another commit's plan in the same run.

Run: python benchmarks/plan_speed.py [--repeat N] [--base COMMIT] [--base-repeat N]
Cases, in turns round by round:
- `plan --gpus 32 --layers 64 --top 3` at --base (default c86fe3d, main before runtimes, checked out into a
  temporary worktree: hw's runner, equal splits, its shipped profile and schedules), and this checkout asked
  the same question (`--profile` that commit's shipped profile, `--runtime hw --partition equal --schedules`
  the ones it had); their top 3 (configuration and step time) must be the same;
- `plan --gpus 32 --layers 64 --top 3` as this checkout asks it by default: today's shipped profile, every
  runtime it has costs for (hw, torch, graphs, graphs-step) and both splits;
- `plan --gpus 64 --layers 128`, the same way: every schedule, runtime, data-parallel degree and split.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from reference import interleaved, load, machine, report

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\s+(\d+)\s+(?:(hw|torch|\S+)\s{2,})?(.+?)\s{2,}(\d+\.\d+ [mu]?s)\s")


def run_plan(tree: Path, args: list[str], runs: dict[str, list[str]], key: str) -> float:
    """Wall seconds of `python -m parsim plan ARGS` in `tree`; its output kept in runs[key]."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "parsim", "plan", *args], cwd=tree, capture_output=True, text=True,
                          env=os.environ | {"PYTHONPATH": str(tree)}, check=True)
    seconds = time.perf_counter() - start
    runs.setdefault(key, []).append(done.stdout)
    return seconds


def top_rows(output: str) -> list[tuple[str, str]]:
    """(configuration, step time) of each ranked row; the runtime column, where there is one, left out."""
    return [(m.group(3).strip(), m.group(4)) for m in map(ROW.match, output.splitlines()) if m]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--base", default="c86fe3d")
    parser.add_argument("--base-repeat", type=int, default=3, help="runs of the (slow) base plan (default 3)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    print(machine())
    print(f"{load()} before; median of {args.repeat} ({args.base_repeat} for {args.base}), cases in turns")
    runs: dict[str, list[str]] = {}
    small = ["--gpus", "32", "--layers", "64", "--top", "3"]
    big = ["--gpus", "64", "--layers", "128"]
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.base], cwd=ROOT, check=True,
                       capture_output=True)
        code = "from parsim.schedules import SCHEDULES; print(','.join(SCHEDULES))"
        names = subprocess.run([sys.executable, "-c", code],
                               cwd=base, env=os.environ | {"PYTHONPATH": str(base)}, capture_output=True, text=True,
                               check=True).stdout.strip()
        same_question = small + ["--profile", str(base / "parsim" / "profiles" / "default.json"), "--runtime", "hw",
                                 "--partition", "equal", "--schedules", names]
        rounds = {"n": 0}

        def base_case() -> float:
            rounds["n"] += 1
            if rounds["n"] > args.base_repeat:
                return float("nan")
            return run_plan(base, small, runs, "base")

        cases = {
            f"plan --gpus 32 --layers 64 --top 3 as {args.base} asks it": lambda: run_plan(ROOT, same_question, runs,
                                                                                           "small"),
            f"plan --gpus 32 --layers 64 --top 3 at {args.base}": base_case,
            "plan --gpus 32 --layers 64 --top 3 (every runtime, both splits)":
                lambda: run_plan(ROOT, small, runs, "small-all"),
            "plan --gpus 64 --layers 128 (every runtime, both splits)": lambda: run_plan(ROOT, big, runs, "big"),
        }
        try:
            times = interleaved(cases, args.repeat)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=True)
    times[f"plan --gpus 32 --layers 64 --top 3 at {args.base}"] = [
        t for t in times[f"plan --gpus 32 --layers 64 --top 3 at {args.base}"] if t == t]  # the runs it made
    print("\n".join(report(times)))
    ours, theirs = top_rows(runs["small"][0]), top_rows(runs["base"][0])
    same = all(top_rows(o) == ours for o in runs["small"]) and all(top_rows(o) == theirs for o in runs["base"])
    speedup = statistics.median(times[f"plan --gpus 32 --layers 64 --top 3 at {args.base}"]) / \
        statistics.median(times[f"plan --gpus 32 --layers 64 --top 3 as {args.base} asks it"])
    print(f"32 GPUs: {speedup:.1f}x faster than {args.base}; top 3 {'the same' if ours == theirs else 'DIFFERENT'}"
          f"{'' if same else ' (and not the same across repeats)'}: {ours}"
          + ("" if ours == theirs else f"; {args.base}'s: {theirs}"))
    for key in ("small", "small-all", "big"):
        print(f"{key}: {runs[key][0].splitlines()[-1]}")
    print(f"{load()} after")


if __name__ == "__main__":
    main()
