"""The 2-GPU reference of torch.distributed.pipelining (../shared/data/peer-torch-pipelining/*.jsonl, taken with
../shared/probes/peer_pipelining.py) as a results CSV that `parsim compare` reads, so that

    python -m parsim compare --measured data/reference/torch-pipelining-h200x2-2026-11-22.csv --runtime torch

predicts it from the shipped profile. Its predicted columns are left at the measured step (compare redoes
them); measured_min_s and measured_max_s are the median too (the file has no spread).
usage: python scripts/peer_reference.py JSONL CSV
"""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from parsim.compare import COLUMNS  # noqa: E402
from parsim.files import write_atomic  # noqa: E402

SCHEDULES = {"gpipe": "gpipe", "1f1b": "1f1b", "interleaved1f1b": "interleaved-1f1b"}


def rows(lines: list[dict]) -> list[dict]:
    single = {(r["layers"], r["d"], r["tokens"]): r["step_s"] for r in lines if r["schedule"] == "single"}
    out = []
    for r in lines:
        if r["schedule"] not in SCHEDULES:
            continue
        one = single[r["layers"], r["d"], r["tokens"]]
        out.append({"schedule": SCHEDULES[r["schedule"]], "gpus": r["gpus"], "microbatches": r["mb"],
                    "layers": r["layers"], "hidden": r["d"], "tokens": r["tokens"], "measured_s": r["step_s"],
                    "measured_min_s": r["step_s"], "measured_max_s": r["step_s"], "measured_single_gpu_s": one,
                    "predicted_s": r["step_s"], "predicted_single_gpu_s": one, "runtime": "torch",
                    "source": "peer_pipelining.py, 2 H200, torch 2.11.0+cu130, 2026-11-22"})
    return out


def main(src: str, dst: str) -> int:
    table = rows([json.loads(line) for line in Path(src).read_text().splitlines() if line.strip()])
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=[*COLUMNS, "runtime", "source"])
    writer.writeheader()
    writer.writerows(table)
    write_atomic(Path(dst), text.getvalue())
    print(f"wrote {dst}: {len(table)} points")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
