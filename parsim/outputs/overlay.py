"""One GPU's timeline twice: as `hw measure --trace` profiled it and as parsim simulated it.

The measured side is a torch.profiler Chrome trace (plain or gzipped JSON): its GPU kernels,
NCCL ones drawn as messages, on a clock that starts at the step's first kernel. Laid over the
simulated rank, it shows where the model's time goes wrong (kernels, gaps the host leaves, waits).
"""

from __future__ import annotations

from pathlib import Path

from parsim.errors import ParsimError
from parsim.inputs import decode, gunzip, number, parse_json, read_bytes
from parsim.sim.lower import compute_track
from parsim.sim.predict import Simulation

Spans = list[tuple[float, float]]  # (start_s, duration_s)


def measured_kernels(trace: str | Path) -> tuple[Spans, Spans]:
    """(compute kernels, NCCL kernels) of a profiler trace, in seconds from the first kernel's start."""
    path = Path(trace)
    raw = read_bytes(trace, "trace")
    doc = parse_json(decode(gunzip(raw, f"trace {path}") if raw[:2] == b"\x1f\x8b" else raw, f"trace {path}"),
                     f"trace {path}")
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise ParsimError(f"trace {path} is not a Chrome trace: it has no \"traceEvents\" list")
    kernels = [e for e in events if isinstance(e, dict) and e.get("cat") == "kernel"]
    if not kernels:
        raise ParsimError(f"trace {path} holds no GPU kernels (was it profiled on a GPU?)")
    spans = [(str(e.get("name", "")), number(e.get("ts"), f"trace {path}: kernel event {i}'s ts", -1e18, 1e18),
              number(e.get("dur"), f"trace {path}: kernel event {i}'s dur", 0, 1e18)) for i, e in enumerate(kernels)]
    t0 = min(ts for _, ts, _ in spans)
    compute: list[tuple[float, float]] = []
    comm: list[tuple[float, float]] = []
    for name, ts, dur in spans:
        (comm if "nccl" in name.lower() else compute).append(((ts - t0) / 1e6, dur / 1e6))
    return compute, comm


def simulated_spans(sim: Simulation, gpu: int) -> tuple[Spans, Spans]:
    """(compute ops, messages touching it) of one simulated GPU, from the step's start."""
    compute = [(op.start_s, op.end_s - op.start_s) for op in sim.ops if op.track == compute_track(gpu)]
    comm = [(op.start_s, op.end_s - op.start_s) for op in sim.ops
            if op.category == "comm" and f"{gpu}" in op.track.split()[-1].split("->")]
    return compute, comm


def write_overlay(sim: Simulation, gpu: int, trace: str | Path, path: str | Path, title: str = "") -> None:
    """Write overlay_png's PNG at `path`, atomically."""
    from parsim.files import write_atomic

    write_atomic(path, overlay_png(sim, gpu, trace, title), "overlay")


def overlay_png(sim: Simulation, gpu: int, trace: str | Path, title: str = "") -> bytes:
    """A PNG with the measured and the simulated compute (and message) rows of `gpu`, one above the other."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from parsim.files import png_bytes

    measured, simulated = measured_kernels(trace), simulated_spans(sim, gpu)
    rows = [("measured kernels", measured[0], "tab:blue"), ("measured NCCL", measured[1], "tab:gray"),
            ("simulated compute", simulated[0], "tab:orange"), ("simulated messages", simulated[1], "tab:gray")]
    fig, ax = plt.subplots(figsize=(12, 2.8))
    for y, (_, spans, colour) in enumerate(rows):
        ax.broken_barh([(s * 1e3, d * 1e3) for s, d in spans], (y - 0.4, 0.8), facecolors=colour)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("time from the step's first kernel (ms)")
    ends = [max((s + d for s, d in spans), default=0.0) for _, spans, _ in rows]
    ax.set_title(title or f"GPU {gpu}: measured {max(ends[:2]) * 1e3:.2f} ms of kernels, "
                          f"simulated step {sim.step_time_s * 1e3:.2f} ms")
    return png_bytes(fig)
