"""How a receive's kernel waiting on a GPU slows the compute beside it, from two `hw measure --trace` runs of one
point, without and with copy streams: each compute kernel of the copy-streams run that lies wholly inside an NCCL
kernel, against the same kernel (by order) of the plain run, GEMMs apart from the rest.

Usage: python lab/recompute/trace_overlap.py PLAIN_TRACE COPY_TRACE   (rank 0's files; rank 1's are found beside)
"""

from __future__ import annotations

import collections
import json
import lzma
import sys
from pathlib import Path


def kernels(path: Path) -> tuple[list[dict], list[tuple[float, float]]]:
    """A trace's compute kernels in time order, and its NCCL kernels' spans (us)."""
    opener = lzma.open if path.suffix == ".xz" else open
    with opener(path, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"]
                  if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset")]
    compute = sorted((e for e in events if "nccl" not in e["name"].lower()), key=lambda e: e["ts"])
    nccl = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if "nccl" in e["name"].lower())
    return compute, nccl


def rank1(path: Path) -> Path:
    """Rank 1's trace beside rank 0's (`hw measure --trace` writes one per rank)."""
    name = path.name.replace("-trace.json", "-trace.rank1.json")
    return path.with_name(name)


def report(plain: Path, copy: Path) -> None:
    """Per rank: compute time without and with copy streams, and the kernels beside a waiting NCCL kernel."""
    for a, b in ((plain, copy), (rank1(plain), rank1(copy))):
        base, _ = kernels(a)
        beside, nccl = kernels(b)
        totals = collections.defaultdict(lambda: [0, 0.0, 0.0])
        for k0, k1 in zip(base, beside, strict=True):
            if any(x <= k1["ts"] and y >= k1["ts"] + k1["dur"] for x, y in nccl):
                kind = "GEMM" if "nvjet" in k0["name"] or "gemm" in k0["name"].lower() else "other"
                totals[kind][0] += 1
                totals[kind][1] += k0["dur"]
                totals[kind][2] += k1["dur"]
        alone = sum(k["dur"] for k in base) / 1e3
        with_ = sum(k["dur"] for k in beside) / 1e3
        print(f"{b.name}: compute {alone:.2f} ms plain, {with_:.2f} ms with copy streams (x{with_ / alone:.3f})")
        for kind, (n, t0, t1) in sorted(totals.items()):
            print(f"  {kind:5} beside a waiting NCCL kernel: {n} kernels, {t0 / 1e3:.2f} -> {t1 / 1e3:.2f} ms "
                  f"(x{t1 / t0:.3f})")


if __name__ == "__main__":
    report(Path(sys.argv[1]), Path(sys.argv[2]))
