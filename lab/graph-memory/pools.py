"""The graphed runtime's measured memory against parsim's model of it (parsim.workload.graph_memory), from one run
of lab/graph-memory/session.sh: each pool of scripts/graphs_gpu_check.py (its peak at the captures against the
model's pool peak, what it keeps allocated against the model's end, what it reserved), and each point of the hw
validate grids (the job's own peak, hw's runner's beside it, and each graphed rank's pool).

Usage: python lab/graph-memory/pools.py DIR   (DIR: the run's folder, data/graph-memory/RUN)
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from parsim.runtimes import get_runtime  # noqa: E402
from parsim.schedules import build  # noqa: E402
from parsim.workload import Model, conv_model, graphed_ranks, microbatch_tokens, mlp_model, model_from_spec  # noqa: E402

# scripts/graphs_gpu_check.py's models, on a GPU (bf16) and on the CPU (fp32)
CHECKED = [mlp_model(8, 512, 2048), conv_model(images=64, widths=(32, 64), blocks=(2, 2), side=16),
           mlp_model(8, 64, 64, dtype_bytes=4),
           conv_model(images=16, widths=(4, 8), blocks=(1, 1), side=8, dtype_bytes=4)]


def error(predicted: float, measured: float) -> float:
    return predicted / measured - 1 if measured else float("nan")


def summary(errors: list[float]) -> str:
    """Median and worst |error| (signed range beside), or a dash for none."""
    if not errors:
        return "-"
    return (f"{statistics.median(map(abs, errors)):.1%} / {max(map(abs, errors)):.1%} "
            f"({min(errors):+.1%} to {max(errors):+.1%})")


def graphs_check(path: Path) -> None:
    """Each case's pool: its captures' peak and what stays allocated, against the model's peak and end."""
    cases = json.loads(path.read_text())["cases"]
    models = {m.name: m for m in CHECKED}
    peaks, ends = [], []
    print(f"{path}:")
    for c in cases:
        pool, model = c["graph_pool_bytes"], models.get(c["model"])
        if not pool or model is None:
            continue
        m = c["microbatches"]
        (rank,) = graphed_ranks(model, build(c["schedule"], 1, m, c["virtual_stages"]), model.tokens // m, "none")
        peak = pool.get("peak", 0)  # recorded since issue 44
        if peak:
            peaks.append(error(rank.pool_peak, peak))
        ends.append(error(rank.pool_end, pool["allocated"]))
        print(f"  {c['model'][:28]:<28} {c['schedule']:<17} {c['mode']:<12} peak {peak / 2**20:8.2f} MiB "
              f"model {rank.pool_peak / 2**20:8.2f} ({error(rank.pool_peak, peak):+.1%})  "
              f"allocated {pool['allocated'] / 2**20:8.2f} "
              f"model {rank.pool_end / 2**20:8.2f}  reserved {pool['reserved'] / 2**20:7.1f}")
    print(f"  pools' peaks {summary(peaks)}; what they keep {summary(ends)}")


def validate_grid(folder: Path) -> None:
    """Each point's peak (the job's own), graphed and eager, against the model; each graphed rank's pool peak."""
    rows = list(csv.DictReader((folder / "results.csv").open()))
    samples = json.loads((folder / "samples.json").read_text())["points"]
    by_runtime: dict[str, list[float]] = {}
    pools: list[float] = []
    print(f"{folder}:")
    for row, sample in zip(rows, samples, strict=True):
        if not row.get("measured_peak_bytes"):
            continue
        model: Model = model_from_spec(row["model"])
        runtime = get_runtime(row["runtime"])
        m, gpus = int(row["microbatches"]), int(row["gpus"])
        schedule = runtime.build(row["schedule"], gpus, m)
        predicted, measured = runtime.peak_bytes(model, schedule, 1, "none"), int(row["measured_peak_bytes"])
        by_runtime.setdefault(row["runtime"], []).append(error(predicted, measured))
        line = (f"  {row['runtime']:<7} {row['schedule']:<6} {gpus} GPU m={m:<3} {row['model']:<30} "
                f"measured {measured / 2**20:9.1f} MiB predicted {predicted / 2**20:9.1f} "
                f"({by_runtime[row['runtime']][-1]:+.1%})")
        if sample.get("graph_pool_bytes"):
            ranks = graphed_ranks(model, schedule, microbatch_tokens(model, m), "none")
            for stage, pool in enumerate(sample["graph_pool_bytes"]):
                if pool and stage == schedule.stage_to_rank.index(schedule.stage_to_rank[stage]):
                    r = schedule.stage_to_rank[stage]
                    pools.append(error(ranks[r].pool_peak, pool["peak"]))
                    line += f" | rank {r} pool {pool['peak'] / 2**20:.1f} ({pools[-1]:+.1%})"
        print(line)
    for name, errors in sorted(by_runtime.items()):
        print(f"  {name}: {len(errors)} points, peak per GPU {summary(errors)}")
    print(f"  graphed ranks' pools at their captures' peak: {summary(pools)}")


def main(folder: Path) -> None:
    for path in sorted(folder.glob("graphs-check.json")):
        graphs_check(path)
    for results in sorted(folder.glob("validate-*/results.csv")):
        validate_grid(results.parent)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
