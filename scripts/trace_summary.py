"""Where a measured step's compute stream waited, rank by rank, from `hw measure --trace` files.

    python scripts/trace_summary.py TRACE.json [TRACE.rank1.json ...] [--top N]

Every runtime's profiled step labels its actions `hw:<action>` (hw.measure.ProfilerLabels); on a GPU each label
also spans the kernels the action launched. Per trace: the step's span, the actions' GPU time, the idle time between
consecutive actions (the compute stream waiting: for a receive, for the host, for the stream's queue), the NCCL
kernels' time and how much of it ran beside the actions, and the N longest waits with the action that ended each.
Written for issue 12's 2-GPU question (`scripts/gpu-session.sh OUT trace2`): set hw's and torch's runtimes side by
side on the same schedule and see which waits torch's adds. On a CPU trace the host spans stand in for the GPU's.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

LABEL = "hw:"  # hw.measure.ProfilerLabels.PREFIX (this script imports no torch)


@dataclass(frozen=True)
class Span:
    name: str
    start_us: float
    end_us: float


@dataclass(frozen=True)
class Summary:
    on_gpu: bool
    span_us: float  # first action's start to last action's end
    busy_us: float  # inside the actions
    waits: list[tuple[float, str]]  # (idle us, the action it held back), longest first
    nccl_us: float  # NCCL kernels' total time
    nccl_beside_us: float  # of which while an action ran


def spans(events: list[dict], cat: str, keep) -> list[Span]:
    return sorted((Span(e["name"], e["ts"], e["ts"] + e.get("dur", 0.0)) for e in events
                   if e.get("cat") == cat and keep(e["name"])), key=lambda s: s.start_us)


def summarize(events: list[dict]) -> Summary:
    """One rank's profiled step: its labelled actions (on the GPU where the trace has them) and NCCL kernels."""
    labelled = lambda name: name.startswith(LABEL)  # noqa: E731
    actions = spans(events, "gpu_user_annotation", labelled)
    on_gpu = bool(actions)
    actions = actions or spans(events, "user_annotation", labelled)
    if not actions:
        raise SystemExit("no `hw:` action labels in the trace: take it with this checkout's `hw measure --trace`")
    nccl = spans(events, "kernel", lambda name: "nccl" in name.lower())
    waits = sorted(((b.start_us - a.end_us, b.name.removeprefix(LABEL)) for a, b in zip(actions, actions[1:])
                    if b.start_us > a.end_us), reverse=True)
    beside = sum(max(0.0, min(k.end_us, a.end_us) - max(k.start_us, a.start_us)) for k in nccl for a in actions)
    return Summary(on_gpu, actions[-1].end_us - actions[0].start_us, sum(a.end_us - a.start_us for a in actions),
                   waits, sum(k.end_us - k.start_us for k in nccl), beside)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--top", type=int, default=5)
    args = ap.parse_args()
    for path in args.traces:
        s = summarize(json.loads(Path(path).read_text())["traceEvents"])
        where = "GPU" if s.on_gpu else "host (no GPU spans)"
        idle = sum(w for w, _ in s.waits)
        print(f"{path}: step {s.span_us / 1e3:.2f} ms on the {where}: actions {s.busy_us / 1e3:.2f} ms, waits "
              f"{idle / 1e3:.2f} ms in {len(s.waits)}; NCCL kernels {s.nccl_us / 1e3:.2f} ms, "
              f"{s.nccl_beside_us / 1e3:.2f} ms of it beside an action")
        for wait_us, name in s.waits[:args.top]:
            print(f"  {wait_us / 1e3:7.3f} ms before {name}")


if __name__ == "__main__":
    main()
