"""Where a measured step's compute stream waited, rank by rank, from `hw measure --json` output or `--trace` files.

    python scripts/trace_summary.py MEASURE.json | TRACE.json [TRACE.rank1.json ...] [--top N]
                                    [--predicted [--profile FILE]]

`hw measure --json` reports each rank's compute actions on the GPU's clock (`timeline`: CUDA events around each, one
step, no profiler); a `--trace` file labels every action `hw:<action>` (hw.measure.steps.ProfilerLabels), on a GPU over
the kernels it launched, and shows the NCCL kernels too, but the profiler slows the host several-fold, so a GPU-bound
step can turn host-bound under it: read its waits for where they fall, the timeline's for how long they are. Per
rank: the step's span, the actions' time, the idle time between consecutive actions (the compute stream waiting: for
a receive, for the host, for the stream's queue), the NCCL kernels' time and how much of it ran beside the actions
(traces only), and the N longest waits with the action each held back. Written for issue 12's 2-GPU question
(`scripts/gpu-session.sh OUT trace2`): hw's and torch's runtimes side by side on the same schedule. On a CPU trace
the host spans stand in for the GPU's. With --predicted, each report's step is also simulated by parsim (MLP stacks;
the runtime, schedule and sizes the report names; the shipped profile or --profile) and each rank's predicted waits
printed beside the measured ones: where the model and the runtime part. Read waits so where the GPU sets the pace:
a measured action's span runs from the mark queued as its host starts it to the one queued as it ends, so where
the host is slower than the GPU its gaps fall inside the actions (on one H200, 16x512x4096 at 8 micro-batches:
0.3 ms of waits measured in a 58 ms step, 4.2 ms simulated between kernels that the host feeds late).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's parsim, run from anywhere
from parsim.profile import load_profile  # noqa: E402
from parsim.runtimes import get_runtime  # noqa: E402
from parsim.schedules import VIRTUAL  # noqa: E402
from parsim.sim.lower import compute_track  # noqa: E402
from parsim.sim.predict import predict  # noqa: E402
from parsim.workload.models import model_from_spec  # noqa: E402

LABEL = "hw:"  # hw.measure.steps.ProfilerLabels.PREFIX (this script imports no torch)


@dataclass(frozen=True)
class Span:
    """A labelled action (or a kernel) on one timeline, in microseconds."""

    name: str
    start_us: float
    end_us: float


@dataclass(frozen=True)
class Summary:
    """One rank's step: where its compute stream waited."""

    on_gpu: bool
    span_us: float  # first action's start to last action's end
    busy_us: float  # inside the actions
    waits: list[tuple[float, str]]  # (idle us, the action it held back), longest first
    nccl_us: float  # NCCL kernels' total time
    nccl_beside_us: float  # of which while an action ran


def spans(events: list[dict], cat: str, keep) -> list[Span]:
    return sorted((Span(e["name"], e["ts"], e["ts"] + e.get("dur", 0.0)) for e in events
                   if e.get("cat") == cat and keep(e["name"])), key=lambda s: s.start_us)


def from_trace(events: list[dict]) -> Summary:
    """One rank's profiled step: its labelled actions (on the GPU where the trace has them) and NCCL kernels."""
    labelled = lambda name: name.startswith(LABEL)  # noqa: E731
    actions = spans(events, "gpu_user_annotation", labelled)
    on_gpu = bool(actions)
    actions = actions or spans(events, "user_annotation", labelled)
    if not actions:
        raise SystemExit("no `hw:` action labels in the trace: take it with this checkout's `hw measure --trace`")
    return summarize(actions, spans(events, "kernel", lambda name: "nccl" in name.lower()), on_gpu)


def from_report(report: dict) -> list[Summary]:
    """Each rank's timed step from `hw measure --json` (its `timeline`, seconds)."""
    if "timeline" not in report:
        raise SystemExit("no `timeline` in the report: take it with this checkout's `hw measure --json`")
    gpu = not report["config"]["device"].startswith("cpu")
    return [summarize(sorted((Span(LABEL + name, start * 1e6, end * 1e6) for name, start, end in rank["actions"]),
                             key=lambda s: s.start_us), [], gpu) for rank in report["timeline"]]


def predicted(report: dict, profile_path: str | None) -> list[Summary]:
    """Each rank's compute ops as parsim simulates the report's step (its runtime, schedule and MLP stack)."""
    c = report["config"]
    if "mlp" not in c["model"]:
        raise SystemExit(f"--predicted simulates MLP stacks only, not {c['model']}")
    ranks = c["gpus"] // c["data_parallel"]
    runtime = get_runtime(c["runtime"])
    schedule = runtime.build(c["schedule"], ranks, c["microbatches"],
                             c["stages"] // ranks if c["schedule"] in VIRTUAL else None)
    model = replace(model_from_spec(f"{c['layers']}x{c['hidden']}x{c['tokens']}"), balance=tuple(c["balance"]))
    _, sim = predict(schedule, model, load_profile(profile_path), c["copy_streams"], c["data_parallel"], runtime)
    return [summarize([Span(LABEL + str(op.label), op.start_s * 1e6, op.end_s * 1e6)
                       for op in sim.machine.streams[compute_track(rank)].ops], [], True) for rank in range(ranks)]


def summarize(actions: list[Span], nccl: list[Span], on_gpu: bool) -> Summary:
    """Waits between consecutive actions (sorted by start), and the NCCL kernels' time beside them."""
    waits = sorted(((b.start_us - a.end_us, b.name.removeprefix(LABEL)) for a, b in zip(actions, actions[1:])
                    if b.start_us > a.end_us), reverse=True)
    beside = sum(max(0.0, min(k.end_us, a.end_us) - max(k.start_us, a.start_us)) for k in nccl for a in actions)
    return Summary(on_gpu, actions[-1].end_us - actions[0].start_us, sum(a.end_us - a.start_us for a in actions),
                   waits, sum(k.end_us - k.start_us for k in nccl), beside)


def load(text: str) -> dict:
    """A trace, a report, or a log whose first line that opens a JSON object begins the report (warnings may come
    before it, as in gpu-session's logs of `hw measure --json`)."""
    text = text.lstrip()
    if not text.startswith("{"):
        start = text.find("\n{")
        if start < 0:
            raise SystemExit("neither a trace nor an `hw measure --json` report")
        text = text[start + 1:]
    return json.JSONDecoder().raw_decode(text)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--predicted", action="store_true", help="also simulate each report's step with parsim")
    ap.add_argument("--profile", help="the profile --predicted simulates with (default: the shipped one)")
    args = ap.parse_args()
    for path in args.traces:
        data = load(Path(path).read_text())
        if "traceEvents" in data:
            show(path, [from_trace(data["traceEvents"])], args.top)
            continue
        show(path, from_report(data), args.top)
        if args.predicted:
            show(f"{path} as parsim predicts it", predicted(data, args.profile), args.top)


def show(name: str, summaries: list[Summary], top: int) -> None:
    for rank, s in enumerate(summaries):
        where = "GPU" if s.on_gpu else "host (no GPU spans)"
        idle = sum(w for w, _ in s.waits)
        print(f"{name if len(summaries) == 1 else f'{name}, rank {rank}'}: step {s.span_us / 1e3:.2f} ms on the "
              f"{where}: actions {s.busy_us / 1e3:.2f} ms, waits {idle / 1e3:.2f} ms in {len(s.waits)}; NCCL kernels "
              f"{s.nccl_us / 1e3:.2f} ms, {s.nccl_beside_us / 1e3:.2f} ms of it beside an action")
        for wait_us, held in s.waits[:top]:
            print(f"  {wait_us / 1e3:7.3f} ms before {held}")


if __name__ == "__main__":
    main()
