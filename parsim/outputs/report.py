"""Turns a Prediction into the text table and the JSON object that `predict` prints."""

from __future__ import annotations

from typing import Any

from parsim.sim.predict import GpuReport, Prediction
from parsim.workload.recompute import RECOMPUTED


def fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def to_json(p: Prediction) -> dict[str, Any]:
    """The prediction as plain data; keys are stable for scripts ("runtime" only where it is not hw's runner,
    so that the default output stays as it was)."""
    return ({"runtime": p.runtime} if p.runtime != "hw" else {}) | {
        "schedule": p.schedule,
        "gpus": p.gpus,
        "data_parallel": p.data_parallel,
        "microbatches": p.microbatches,
        "model": p.model,
        "tokens": p.tokens,
        "sample": p.sample,
        "step_time_s": p.step_time_s,
        "throughput_tokens_per_s": p.throughput_tokens_per_s,
        "single_gpu_step_s": p.single_gpu_step_s,
        "speedup": p.speedup,
        "bubble_fraction": p.bubble_fraction,
        "per_gpu": [
            {"rank": g.rank, "stages": list(g.stages), "busy_s": g.busy_s,
             "bubble_fraction": g.bubble_fraction, "peak_activation_bytes": g.peak_activation_bytes}
            for g in p.per_gpu
        ],
        "profile": p.profile,
    } | ({"recompute": p.recompute} if p.recompute != "never" else {}) | (
        {"tensor_parallel": p.tensor_parallel, "sequence_parallel": p.sequence_parallel}
        if p.tensor_parallel > 1 else {})


def to_text(p: Prediction, max_rows: int = 16) -> str:
    """A short human report: the headline figures, then one row per GPU (elided past max_rows)."""
    lines = [
        f"parsim prediction: {p.schedule} on {p.gpus} GPU(s), {p.microbatches} micro-batches"
        + (f", {p.data_parallel} data-parallel replicas of {len(p.per_gpu) // p.data_parallel} stages"
           if p.data_parallel > 1 else "")
        + (f", tensor-parallel groups of {p.tensor_parallel}{' with sequence parallelism' * p.sequence_parallel} "
           "(one row per group)" if p.tensor_parallel > 1 else "")
        + (f", run by {p.runtime}" if p.runtime != "hw" else "")
        + (f", recomputing {RECOMPUTED[p.recompute]}" if p.recompute != "never" else ""),
        f"  model     {p.model}",
        f"  profile   {p.profile}",
        "",
        f"  step time   {fmt_time(p.step_time_s)}",
        f"  throughput  {p.throughput_tokens_per_s:,.0f} {p.sample}s/s",
        f"  speedup     {p.speedup:.2f}x over one GPU ({fmt_time(p.single_gpu_step_s)} for the same batch)",
        f"  bubble      {p.bubble_fraction:.1%} of GPU time idle",
        "",
        f"  {'gpu':>4}  {'stages':<10} {'busy':>11} {'idle':>6}  peak activations",
    ]
    rows: list[GpuReport | None] = list(p.per_gpu)
    shown = rows if len(rows) <= max_rows else rows[: max_rows // 2] + [None] + rows[-max_rows // 2:]
    for g in shown:
        if g is None:
            lines.append(f"  {'...':>4}")
            continue
        stages = ",".join(map(str, g.stages))
        lines.append(f"  {g.rank:>4}  {stages:<10} {fmt_time(g.busy_s):>11} {g.bubble_fraction:>6.1%}  "
                     f"{fmt_bytes(g.peak_activation_bytes)}")
    return "\n".join(lines)
