"""What is live at a one-GPU step's peak, by the CUDA caching allocator's own trace: issue 44's remaining memory gap
(GPipe and 1F1B at 4 micro-batches of 16x2048x8192 held ~110 MiB more than parsim predicts, under hw's runner and the
graphed one alike, and not at 16 micro-batches nor on the CPU: a GPU kernel's working memory, unmodelled).

One process, one GPU, the allocator's history recorded (torch.cuda.memory._record_memory_history) over one span:
(graphs) the runner's prepare, its static tensors, eager warm-up and captures, the weights and the batch made before;
(hw) one step after a warm-up step, gradients cleared. Then the trace walked: the peak of the bytes allocated in the
span and the blocks live there, summed by the innermost frame of this checkout that allocated them (hw's runner, a
layer's module) and by the innermost frame of all, beside parsim's peak for the same span (graphs: static buffers and
pool; hw: activations, working memory and the step's gradients).
Writes OUT.pickle (the allocator's snapshot, for torch's memory_viz) and OUT.txt (the table).

Usage: python lab/graph-memory/snapshot.py OUT [--model 16x2048x8192] [--schedule 1f1b] [--microbatches 4]
       [--runtime graphs|hw]   (~20 s on one H200; --cpu: the CPU allocator's peak only, in fp32 against the model's
       bf16 bytes: a check of the script)
"""

from __future__ import annotations

import argparse
import pickle
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from hw.nets.blocks import loss_for  # noqa: E402
from hw.run.cuda_graphs import GraphRunner, graph_maker  # noqa: E402
from hw.run.stage_runner import local_runner, make_batch, split_batch, stage_modules, stage_shapes  # noqa: E402
from parsim.runtimes import get_runtime  # noqa: E402
from parsim.workload import graphed_ranks, microbatch_tokens, model_from_spec, rank_peak_bytes  # noqa: E402


def live_at_peak(trace: Iterable[dict]) -> tuple[int, dict[int, dict]]:
    """The most bytes a trace of allocator events held at once (allocations less frees, from its start, as
    max_memory_allocated counts them: a free counts when requested, not when a stream's use of the block completes)
    and the blocks live at that moment, by address."""
    live: dict[int, dict] = {}
    held = peak = 0
    at_peak: dict[int, dict] = {}
    for event in trace:
        if event["action"] == "alloc":
            live[event["addr"]] = event
            held += event["size"]
        elif event["action"] == "free_requested" and event["addr"] in live:
            held -= live.pop(event["addr"])["size"]
        if held > peak:
            peak, at_peak = held, dict(live)
    return peak, at_peak


def where(event: dict, mine: bool) -> str:
    """The innermost frame that allocated a block: of this checkout (`mine`), or any."""
    for frame in event.get("frames", []):
        if not mine or str(ROOT) in frame["filename"]:
            return f"{Path(frame['filename']).name}:{frame['line']} {frame['name']}"
    return "?"


def table(blocks: dict[int, dict], mine: bool) -> list[str]:
    """Live bytes at the peak by allocating frame, largest first."""
    sums: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for event in blocks.values():
        s = sums[where(event, mine)]
        s[0] += event["size"]
        s[1] += 1
    return [f"  {size / 2**20:10.1f} MiB {count:5d} blocks  {frame}"
            for frame, (size, count) in sorted(sums.items(), key=lambda kv: -kv[1][0])]


def predicted(spec: str, schedule_name: str, m: int, runtime: str) -> int:
    """parsim's peak for the span recorded: the graphed rank's static buffers and pool peak (graphs), or its peak
    beyond the weights (hw)."""
    model = model_from_spec(spec)
    schedule = get_runtime(runtime).build(schedule_name, 1, m)
    samples = microbatch_tokens(model, m)
    if runtime == "graphs":
        rank = graphed_ranks(model, schedule, samples, "none")[0]
        return rank.buffers + rank.pool_peak
    return rank_peak_bytes(model, schedule, samples, "none")[0] - sum(x.params * x.dtype_bytes for x in model.layers)


def run(args: argparse.Namespace) -> tuple[int, dict[int, dict] | None, object]:
    """The recorded span's peak bytes, its live blocks (GPU) and the allocator's snapshot (GPU)."""
    device = torch.device("cpu" if args.cpu else "cuda")
    dtype = torch.float32 if args.cpu else torch.bfloat16
    model = model_from_spec(args.model)
    schedule = get_runtime(args.runtime).build(args.schedule, 1, args.microbatches)
    if args.runtime == "graphs":
        graphed = GraphRunner(schedule, 0, stage_modules(model, schedule, 0, device, dtype), {}, graph_maker(device),
                              loss_for(model))
        io = split_batch(*make_batch(model, device, dtype), schedule.num_microbatches, stage_shapes(model, 1))
        span = lambda: graphed.prepare(io)  # noqa: E731
    else:
        runner, io = local_runner(model, schedule, device, dtype)
        runner.step(io)  # warm-up: cuBLAS handles and workspaces, outside the span
        for module in runner.stages.values():
            for p in module.parameters():
                p.grad = None
        span = lambda: runner.step(io)  # noqa: E731
    if args.cpu:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            span()
        held = peak = 0
        for _, nbytes in sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                                if e.name() == "[memory]"):
            held += nbytes
            peak = max(peak, held)
        return peak, None, None
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    span()
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    trace = snapshot["device_traces"][torch.cuda.current_device()]
    peak, blocks = live_at_peak(trace)
    return peak, blocks, snapshot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--model", default="16x2048x8192")
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--runtime", choices=("graphs", "hw"), default="graphs")
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()
    peak, blocks, snapshot = run(args)
    model = predicted(args.model, args.schedule, args.microbatches, args.runtime)
    lines = [" ".join(sys.argv), f"{args.runtime} {args.schedule} m={args.microbatches} {args.model}: peak "
             f"{peak / 2**20:.1f} MiB recorded; parsim {model / 2**20:.1f} MiB ({model / peak - 1:+.1%})"]
    if blocks is not None:
        lines += ["live at the peak, by this checkout's allocating frame:", *table(blocks, True),
                  "by the innermost frame:", *table(blocks, False)]
        Path(args.out + ".pickle").write_bytes(pickle.dumps(snapshot))
    Path(args.out + ".txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
