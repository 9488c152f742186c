"""`python -m hw measure`: run the real pipeline, time it, and report what `parsim predict` predicts."""

from __future__ import annotations

import argparse
import os

from hw.measure.steps import DTYPES, MAX_STEPS, Config, deadline_s, keep_traces, run, steps_per_job, trace_path
from hw.run.ranks import require_gpus
from hw.run.runtimes import check_runs
from hw.run.stage_runner import check_recompute
from hw.run.tensor_parallel import check_model
from parsim import flags
from parsim.budget import check_cpu_run
from parsim.cli import (
    MAX_TP,
    add_model_args,
    add_partition_args,
    add_recompute_arg,
    add_runtime_arg,
    model_from_args,
    partition_from_args,
)
from parsim.configuration import Configuration, prepare
from parsim.errors import ParsimError
from parsim.files import check_output, json_text, write_atomic
from parsim.profile import load_profile
from parsim.schedules import SCHEDULES, schedule_name
from parsim.sim.check import validate

PINNING_NOTE = ("hw's runner is timed with its host thread pinned to a core (HW_PIN=0 unpins it), the others "
                "unpinned, as people run them")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--schedule", type=schedule_name, default="1f1b", metavar="NAME",
                   help=f"{', '.join(sorted(SCHEDULES))}, torch:CLASS or a torch schedule CSV (default 1f1b)")
    p.add_argument("--gpus", type=flags.positive_int, default=4,
                   help="GPUs in all: pipeline ranks x replicas x tensor-parallel degree (default 4)")
    p.add_argument("--microbatches", type=flags.positive_int, default=8)
    p.add_argument("--virtual-stages", type=flags.positive_int, metavar="V", help="for interleaved-1f1b (default 2)")
    p.add_argument("--copy-streams", action="store_true",
                   help="post sends and receives on a dedicated CUDA stream, as torchgpipe does (GPU only)")
    p.add_argument("--data-parallel", type=flags.positive_int, default=1, metavar="D",
                   help="D replicas of a GPUS/D-rank pipeline, gradients all-reduced as DDP does (default 1)")
    p.add_argument("--tensor-parallel", type=flags.whole(1, MAX_TP), default=1, metavar="T",
                   help="split each pipeline rank's MLP blocks over T GPUs with torch's tensor-parallel API (fc1 "
                        "column-, fc2 row-parallel), the batch replicated over them; hw and torch runtimes (default 1)")
    add_recompute_arg(p)
    add_runtime_arg(p, PINNING_NOTE)
    add_model_args(p)
    add_partition_args(p)
    p.add_argument("--profile", type=flags.path, metavar="FILE",
                   help="the profile --partition time balances by, as `parsim predict "
                                                    "--partition time` does (default: the shipped one)")
    p.add_argument("--steps", type=flags.whole(1, MAX_STEPS), default=10, help="timed steps (default 10)")
    p.add_argument("--warmup", type=flags.whole(0, MAX_STEPS), default=3, help="untimed steps first (default 3)")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="default bf16 on GPUs, fp32 on the CPU")
    p.add_argument("--cpu", action="store_true", help="run the ranks on the CPU with gloo (a tiny model unless one is "
                                                      f"given: {CPU_MODEL[0]} MLP blocks of {CPU_MODEL[1]}, "
                                                      f"{CPU_MODEL[2]} tokens)")
    p.add_argument("--timeout", type=flags.seconds, default=120.0, help="seconds any one wait may take (default 120)")
    p.add_argument("--no-baseline", dest="baseline", action="store_false",
                   help="skip the one-device baseline (the whole batch in one micro-batch on one GPU, which a model "
                        "that needs a pipeline may not fit): no speedup is reported")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--trace", type=flags.path, metavar="FILE",
                   help="torch.profiler Chrome trace of one more step: FILE for rank 0, "
                                                  "FILE's stem + .rankR for the others")


CPU_MODEL = (4, 64, 256)  # --cpu's default model: layers, hidden, tokens (the GPU's default would not finish there)


def cpu_defaults(args: argparse.Namespace) -> None:
    """--cpu with no model flag: the tiny CPU_MODEL, as --cpu's help says."""
    if args.cpu and not (args.model or args.conv) and all(getattr(args, f) is None for f in ("layers", "hidden",
                                                                                             "tokens")):
        args.layers, args.hidden, args.tokens = CPU_MODEL


def _check(args: argparse.Namespace) -> list[str]:
    """What can be refused before any work (the flags' ranges are their types'); the rank traces' paths, checked."""
    check_runs(args.runtime, args.data_parallel, args.copy_streams, args.recompute, args.tensor_parallel)
    if args.cpu and args.copy_streams:
        raise ParsimError("--copy-streams posts messages on a dedicated CUDA stream: GPU only, not with --cpu")
    require_gpus(args.gpus, cpu=args.cpu)
    traces = [trace_path(args.trace, r) for r in range(args.gpus)] if args.trace else []
    for path in traces:
        check_output(path, "--trace")
    return traces


def main(args: argparse.Namespace) -> int:
    cpu_defaults(args)
    traces = _check(args)
    given = load_profile(args.profile) if args.profile else None  # a bad --profile fails now, used or not
    if args.gpus % (args.data_parallel * args.tensor_parallel):
        raise ParsimError(f"--gpus {args.gpus} does not split into {args.data_parallel} equal pipeline replicas of "
                          f"{args.tensor_parallel}-GPU ranks")
    config = Configuration(model_from_args(args), args.schedule, args.gpus, args.microbatches, args.virtual_stages,
                           args.data_parallel, args.runtime, args.copy_streams, partition_from_args(args),
                           args.recompute, args.tensor_parallel)
    prepared = prepare(config, given or load_profile())  # checked, built and split as `parsim predict` does
    schedule, model = prepared.schedule, prepared.model
    if args.tensor_parallel > 1:
        check_model(model, args.runtime)
    check_recompute(schedule, args.recompute)
    validate(schedule, args.copy_streams)  # a deadlock (in a schedule read from a file) is named now, not at --timeout
    dtype = args.dtype or ("fp32" if args.cpu else "bf16")
    if args.cpu:  # refused at once where even a CPU at its peak could not finish in time
        check_cpu_run(model, dtype, steps_per_job(args.steps, args.warmup, args.trace), 2, args.timeout,
                      deadline_s(args.timeout, 2), args.gpus > 1)
    token = str(os.getpid())
    try:
        report = run(schedule, model, Config(args.steps, args.warmup, dtype, args.trace, token),
                     "cpu" if args.cpu else "cuda", args.timeout, args.data_parallel, args.copy_streams, args.runtime,
                     args.recompute, args.tensor_parallel, args.baseline)
    except BaseException:
        keep_traces(traces, token, keep=False)
        raise
    text = json_text(report, indent=2) if args.json else report_text(report)
    keep_traces(traces, token, keep=True)
    print(text)
    return 0


def report_text(r: dict) -> str:
    c = r["config"]
    replicas = f" ({c['data_parallel']} data-parallel replicas)" if c["data_parallel"] > 1 else ""
    replicas += f", tensor-parallel {c['tensor_parallel']}" if c.get("tensor_parallel", 1) > 1 else ""
    replicas += f", {c['runtime']} runtime" if c.get("runtime", "hw") != "hw" else ""
    replicas += f", recompute {c['recompute']}" if c.get("recompute", "never") != "never" else ""
    lines = [f"measured: {c['schedule']} on {c['gpus']} x {c['device']}{replicas}, {c['microbatches']} micro-batches, "
             f"{c['model']}, {c['dtype']}",
             f"  step time  {r['step_time_s'] * 1e3:.3f} ms (min {r['step_time_min_s'] * 1e3:.3f}, "
             f"max {r['step_time_max_s'] * 1e3:.3f}, {c['steps']} steps)",
             f"  speedup    {r['speedup']:.2f}x over one device ({r['single_device_step_s'] * 1e3:.3f} ms)"
             if r["speedup"] is not None else "  speedup    - (no one-device baseline run)",
             f"  {'stage':>5} {'rank':>4} {'forward':>10} {'backward':>10}  peak memory"]
    for s in r["per_stage"]:
        mem = "-" if s["peak_memory_bytes"] is None else f"{s['peak_memory_bytes'] / 2**20:.0f} MiB"
        if s.get("graph_pool_bytes"):
            mem += f" (graphs' pool {s['graph_pool_bytes']['reserved'] / 2**20:.0f} MiB)"
        fwd = "-" if s["forward_s"] is None else f"{s['forward_s'] * 1e3:.3f} ms"
        bwd = "-" if s["backward_s"] is None else f"{s['backward_s'] * 1e3:.3f} ms"
        lines.append(f"  {s['stage']:>5} {s['rank']:>4} {fwd:>10} {bwd:>10}  {mem}")
    return "\n".join(lines)


def write_report(report: dict, path: str) -> None:
    write_atomic(path, json_text(report, indent=2) + "\n")
