"""Every `predict --json` output of this checkout, byte for byte against another commit's (default: where this
branch left main), over a grid of schedules x GPUs x micro-batches x runtimes x data parallelism x copy streams, and
hw's recomputation modes without copy streams.

Run: python scripts/check_predictions_unchanged.py [--base COMMIT] [--quick]
It checks the base commit out into a temporary git worktree, runs the grid in one process per tree (each
importing its own parsim), prints the points whose output differs (errors included) and exits 1 if any does.
Every runtime runs with the shipped profile's costs for it; the torch runtime also with made-up ones (the shipped
profile's hw costs, slower per action and message, with per-step bookkeeping), as "torch*".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Runs inside each tree's interpreter: reads a JSON list of argument lists on stdin; prints one JSON list of
# [exit status, stdout, stderr] per point.
RUNNER = """
import contextlib, io, json, sys
from parsim.cli import main
out = []
for argv in json.load(sys.stdin):
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = main(argv)
    out.append([status, stdout.getvalue(), stderr.getvalue()])
print(json.dumps(out))
"""

HW = ["gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb", "zb-h1", "zbv", "dualpipev", "looped-bfs"]
TORCH = ["gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb", "zbv", "dualpipev", "looped-bfs"]
SCHEDULES = {"hw": HW, "torch": TORCH, "torch*": TORCH, "graphs": HW, "graphs-step": HW}
COPY_STREAMS = {"hw", "graphs"}  # the runtimes that take --copy-streams


def grid(torch_profile: str, quick: bool) -> list[list[str]]:
    """Argument lists for `predict --json`: 8 GPUs span two of the shipped profile's 4-GPU nodes, so messages
    cross a shared network link (and interleaved schedules contend for it)."""
    gpus = (1, 2, 4, 8) if not quick else (2, 8)
    microbatches = (1, 2, 4, 8, 16) if not quick else (4, 8)
    points = []
    for runtime, names in SCHEDULES.items():
        for name in names:
            for g in gpus if runtime != "graphs-step" else (1, 2):  # graphs-step: one GPU (2: refused alike)
                for m in microbatches:
                    for dp in (1, 2):
                        for copy in ((False, True) if runtime in COPY_STREAMS else (False,)):
                            argv = ["predict", "--json", "--layers", "32", "--tokens", "4096", "--schedule", name,
                                    "--gpus", str(g), "--microbatches", str(m), "--data-parallel", str(dp),
                                    "--runtime", runtime.rstrip("*")]
                            points.append(argv + (["--copy-streams"] if copy else [])
                                          + (["--profile", torch_profile] if runtime == "torch*" else []))
    for name in HW:  # recomputation on hw's runner, without copy streams (with them it may recompute early)
        for g in gpus:
            for m in microbatches:
                for mode in ("except-last", "always"):
                    points.append(["predict", "--json", "--layers", "32", "--tokens", "4096", "--schedule", name,
                                   "--gpus", str(g), "--microbatches", str(m), "--recompute", mode])
    for v in (3, 4):  # more stages per GPU
        points.append(["predict", "--json", "--layers", "32", "--schedule", "interleaved-1f1b", "--gpus", "4",
                       "--microbatches", "8", "--virtual-stages", str(v)])
    points.append(["predict", "--json", "--conv", "--schedule", "1f1b", "--gpus", "4", "--microbatches", "8",
                   "--partition", "time"])
    points.append(["predict", "--json", "--schedule", "1f1b", "--gpus", "32", "--microbatches", "128",
                   "--layers", "32", "--data-parallel", "2"])
    for runtime in ("hw", "graphs"):  # a transformer preset, split by time, with the shipped transformer costs
        for name in ("1f1b", "zbv"):
            points.append(["predict", "--json", "--model", "llama-3.2-1b", "--seq-len", "512", "--global-batch", "16",
                           "--schedule", name, "--gpus", "4", "--microbatches", "8", "--partition", "time",
                           "--runtime", runtime])
    return points


def torch_costed_profile(path: Path) -> None:
    """The shipped profile with torch runtime costs: 1.5x hw's per action and message, 40 us per step."""
    from parsim.profile import RuntimeCosts, load_profile, save_profile

    profile = load_profile()
    costs = RuntimeCosts(profile.host.action_s * 1.5, profile.host.p2p_s * 1.5, step_s=40e-6)
    save_profile(dataclasses.replace(profile, runtimes={"torch": costs}), path)


def run_tree(tree: Path, points: list[list[str]]) -> list[list]:
    """Each point's [exit status, stdout, stderr] as `tree`'s parsim prints it."""
    code = f"import sys; sys.path.insert(0, {str(tree)!r})\n" + RUNNER
    done = subprocess.run([sys.executable, "-c", code], input=json.dumps(points), capture_output=True, text=True,
                          cwd=tree, check=True)
    return json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", help="commit to compare with (default: git merge-base HEAD main)")
    parser.add_argument("--quick", action="store_true", help="a smaller grid")
    args = parser.parse_args()
    base = args.base or subprocess.run(["git", "merge-base", "HEAD", "main"], capture_output=True, text=True,
                                       cwd=ROOT, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base_tree), base], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            profile = Path(tmp) / "torch-profile.json"
            torch_costed_profile(profile)
            points = grid(str(profile), args.quick)
            ours, theirs = run_tree(ROOT, points), run_tree(base_tree, points)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT, check=True)
    differ = [p for p, a, b in zip(points, ours, theirs) if a != b]
    ran = sum(1 for status, _, _ in ours if status == 0)
    print(f"{len(points)} points ({ran} predicted, {len(points) - ran} refused alike or not), "
          f"against {base[:12]}: {len(differ)} differ")
    for p in differ[:20]:
        print("  differs: python -m parsim " + " ".join(p))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
