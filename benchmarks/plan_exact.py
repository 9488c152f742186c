"""Does `plan` find the exhaustive search's top 3? The pruned search (floors, the sharing loop's first round as a
floor, alike replicas walked once) against every configuration simulated (no floor, every replica walked), their
top 3 compared: configuration, runtime and step time, to the bit.

Run: python benchmarks/plan_exact.py [--gpus 8,16,32] [--jobs N]
Cases: Llama 3 8B, sequences of 4096 tokens, 8 per GPU (plan --model llama-3-8b --seq-len 4096 --global-batch 8G),
on each GPU count; the 32-layer MLP stacks of scripts/check_predictions_unchanged.py (--layers 32 --tokens 4096)
on 2, 4 and 8 GPUs. Every runtime the shipped profile costs, both splits, its memory limit.
The engines' own exactness (the sharing rounds on the walk against the event-driven machine, one walked replica
against all of them) is tests/test_shortcuts.py's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", default="8,16,32", help="GPU counts for llama-3-8b (default 8,16,32)")
    parser.add_argument("--jobs", type=int, default=None, help="processes (default: all cores)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from parsim.plan import default_jobs, search
    from parsim.profile import load_profile
    from parsim.sim import longest_path
    from parsim.workload import mlp_model, named_model

    profile, jobs = load_profile(), args.jobs or default_jobs()
    cases = [(f"llama-3-8b, {g} GPUs", named_model("llama-3-8b", 4096, 8 * g), g)
             for g in map(int, args.gpus.split(","))]
    cases += [(f"mlp 32 x 2048, 4096 tokens, {g} GPUs", mlp_model(32, 2048, 4096), g) for g in (2, 4, 8)]
    same = True
    for name, model, gpus in cases:
        start = time.perf_counter()
        fast = search(model, gpus, profile, profile.gpu_memory_bytes, top=3, jobs=jobs, partition="both")
        fast_s = time.perf_counter() - start
        longest_path.ALIKE_REPLICAS_ONCE = False
        try:
            start = time.perf_counter()
            every = search(model, gpus, profile, profile.gpu_memory_bytes, top=None, jobs=jobs, partition="both")
            every_s = time.perf_counter() - start
        finally:
            longest_path.ALIKE_REPLICAS_ONCE = True
        ours = [(c.runtime, c.label, c.prediction.step_time_s) for c in fast.fits if c.prediction]
        theirs = [(c.runtime, c.label, c.prediction.step_time_s) for c in every.fits[:3] if c.prediction]
        same &= ours == theirs
        print(f"{name}: top 3 {'the same' if ours == theirs else 'DIFFERENT'} "
              f"(pruned: {fast.simulated} simulated, {fast_s:.1f} s; exhaustive: {every.simulated} simulated, "
              f"{every_s:.1f} s)")
        for row in ours if ours == theirs else ours + [("exhaustive:", "", 0.0)] + theirs:
            print(f"    {row[0]:<11} {row[1]:<48} {row[2]!r}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
