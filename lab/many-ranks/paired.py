"""Per-round ratios of each variant against its one-rank control, from host_trace.py's trace.json.

    python lab/many-ranks/paired.py TRACE.json

Variants are timed in rounds (one block of each per round), so a ratio taken within a round is free of the host's
drift between rounds. For each variant: per round the median plain step, and per rank the median traced host time
of F, B, messages and the runner's whole loop; printed as the median (min-max) over rounds of variant / control,
where the control is alone:RUNTIME:m (the same stage on rank 0 alone) for both/gradin/pipe variants, probe:1 for
probe:N (N = 2, 4: any number of ranks).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict

med = statistics.median


def load_trace(path: str) -> dict:
    """host_trace.py's trace.json, or its compressed copy (trace.json.gz or .xz, as committed)."""
    import gzip
    import lzma

    opener = gzip.open if path.endswith(".gz") else lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def kinds(step: dict) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for name, _, a, b, _, depth in step["spans"]:
        if name == "frame:runner.step":
            out["loop"] += b - a
        elif depth == 1 and name.startswith("action:"):
            op = name.split(":", 1)[1]
            out[op if op in ("F", "B") else "msg"] += b - a
        elif depth == 1 and name.startswith("torch.") and name != "torch._wait_batch_p2p":
            out["msg"] += b - a
    return out


def per_round(v: dict) -> tuple[dict[int, float], dict[int, dict[str, float]]]:
    plain: dict[int, list[float]] = defaultdict(list)
    for rnd, s in v["plain"]:
        plain[rnd].append(s)
    traced: dict[int, list[dict]] = defaultdict(list)
    for t in v["traced"]:
        traced[t["round"]].append(kinds(t))
    return ({r: med(s) for r, s in plain.items()},
            {r: {k: med(x.get(k, 0.0) for x in ts) for k in ("F", "B", "msg", "loop")} for r, ts in traced.items()})


def control_of(name: str) -> str | None:
    parts = name.split(":")
    if parts[0] == "probe":
        return "probe:1" if parts[1] != "1" else None  # probe:N (N ranks) against probe:1
    if parts[0] in ("both", "gradin", "spin", "alone1f1b") or (parts[0] == "alone" and parts[-1] == "same"):
        return f"alone:{parts[1]}:{parts[2]}"
    if parts[0] == "pipe":
        return f"alone:{parts[1]}:{parts[3]}"
    return None


def fmt(xs: list[float]) -> str:
    return f"{med(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})" if xs else "-"


def main() -> None:
    trace = load_trace(sys.argv[1])
    ranks = trace["ranks"]
    names = list(ranks[0]["variants"])
    for name in names:
        ctrl = control_of(name)
        if ctrl is None:
            continue
        p_var, _ = per_round(ranks[0]["variants"][name])
        p_ctl, t_ctl = per_round(ranks[0]["variants"][ctrl])
        step = [p_var[r] / p_ctl[r] for r in p_var if r in p_ctl]
        line = [f"{name:30s} step/control {fmt(step)}"]
        for rk in ranks:
            v = rk["variants"][name]
            if not v["active"]:
                continue
            _, t_var = per_round(v)
            for k in ("F", "B", "loop"):
                xs = [t_var[r][k] / t_ctl[r][k] for r in t_var if r in t_ctl and t_ctl[r][k] > 0]
                line.append(f"r{rk['rank']} {k} {fmt(xs)}")
        print("  ".join(line))


if __name__ == "__main__":
    main()
