"""What `hw validate` recorded as the graphed runtime's peak memory before issue 44's fix, rebuilt from parsim's
graphed memory model (parsim.workload.graph_memory), beside the old prediction (eager's walk) and the new one.

Until the fix, hw.measure.steps counted a graphed job's "resident" bytes as weights + gradients + its pool's reserved
+ its pool's allocated bytes (the gradients, in the pool, twice; the pool's allocated blocks twice), and took its own
peak as the process's peak less (allocated - resident), floored at 0. So it recorded min(R, A) + what the step
allocated, where R is that resident sum and A all the process had allocated: the turn's other jobs (their weights,
gradients and batches) included where R > A. A graph replay allocates nothing, so the step adds ~0. This script
puts the model's pool peak for the reserved bytes (a lower bound: the allocator's free space in its segments is
not modelled) and, for A, a lower bound: each job's weights and batch, the eager jobs' gradients, the graphed job's
static buffers and what its pool keeps (no cuBLAS workspaces, nothing torch's stages keep). Points measured before
2026-11-23 23:17 UTC (commit f177896) recorded the process's peak, A.

Usage: python lab/graph-memory/recorded.py [RESULTS.csv ...]   (default: every committed results.csv with graphs rows)
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from parsim.runtimes import get_runtime  # noqa: E402
from parsim.workload import graphed_ranks, microbatch_tokens, model_from_spec, peak_bytes, stage_layers  # noqa: E402

OWN_PEAK_FROM = "2026-11-23T23:17"  # f177896: a job's peak less what the turn's other jobs held
TURN = ("schedule", "gpus", "microbatches", "model", "data_parallel", "copy_streams", "recompute")


def rebuilt(row: dict, runtimes: set[str]) -> tuple[int, int, int, bool]:
    """(eager's prediction, the graphed model's, what the old accounting recorded as the model rebuilds it, whether
    the point is one whose record is R, the resident sum, on its every rank: R below A's lower bound)."""
    model = model_from_spec(row["model"])
    m, gpus = int(row["microbatches"]), int(row["gpus"])
    schedule = get_runtime("graphs").build(row["schedule"], gpus, m)
    samples = microbatch_tokens(model, m)
    ids = stage_layers(model, schedule.num_stages)
    batch = 2 * model.tokens * model.layers[0].hidden * model.layers[0].dtype_bytes  # each job's inputs and targets
    eager_jobs = len(runtimes - {"graphs"})
    own_peak = row["date"] >= OWN_PEAK_FROM
    recorded, resident_only = [], own_peak
    for r, rank in enumerate(graphed_ranks(model, schedule, samples, "none")):
        weights = sum(model.layers[i].params * model.layers[i].dtype_bytes
                      for s, owner in enumerate(schedule.stage_to_rank) if owner == r for i in ids[s])
        resident = 2 * weights + rank.pool_peak + rank.pool_end
        process = eager_jobs * 2 * weights + weights + rank.buffers + rank.pool_end + (eager_jobs + 1) * batch
        recorded.append(min(resident, process) if own_peak else process)
        resident_only = resident_only and resident < process
    return (peak_bytes(model, schedule, 1, "none"), get_runtime("graphs").peak_bytes(model, schedule, 1, "none"),
            max(recorded), resident_only)


def summary(errors: list[float]) -> str:
    """Median and worst |error|, or a dash for none."""
    if not errors:
        return "-"
    return f"{statistics.median(map(abs, errors)):.1%} / {max(map(abs, errors)):.1%}"


def main(paths: list[str]) -> None:
    files = [Path(p) for p in paths] or sorted(p for p in ROOT.glob("data/**/results.csv")
                                               if ",graphs," in p.read_text())
    print("median / worst |error| against the recorded peak: the old model (eager's walk), the new one (graphed), "
          "the record rebuilt (min(R, A) per rank), and that at the points whose every rank's R is below A's "
          "bound (how many)")
    for path in files:
        rows = list(csv.DictReader(path.open()))
        turns: dict[tuple, set[str]] = {}
        for row in rows:
            turns.setdefault(tuple(row.get(k, "") for k in TURN), set()).add(row["runtime"])
        errors: list[list[float]] = [[], [], [], []]
        for row in rows:
            if row["runtime"] != "graphs" or not row.get("measured_peak_bytes"):
                continue
            measured = int(row["measured_peak_bytes"])
            old, new, record, resident = rebuilt(row, turns[tuple(row.get(k, "") for k in TURN)])
            for e, value in zip(errors, (old, new, record), strict=False):
                e.append(value / measured - 1)
            if resident:
                errors[3].append(record / measured - 1)
        if errors[0]:
            name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
            print(f"{name}: {len(errors[0])} points | old {summary(errors[0])} | new {summary(errors[1])} | "
                  f"rebuilt {summary(errors[2])} | R ({len(errors[3])}) {summary(errors[3])}")


if __name__ == "__main__":
    main(sys.argv[1:])
