"""`python -m parsim {predict,sweep,plan,scenario,compare}`: predict a pipeline step from a profile, anywhere."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from parsim import flags, progress
from parsim.budget import check_actions
from parsim.configuration import Configuration, Partition, check, predict, prepare
from parsim.errors import ParsimError, one_line
from parsim.files import Outputs, folder_made, json_text, kept_files
from parsim.inputs import MAX_LAYERS, MAX_SIZE
from parsim.interrupts import Stopped, describe, stopping
from parsim.outputs.report import fmt_bytes, fmt_time, to_json, to_text
from parsim.profile import Profile, load_profile
from parsim.progress import Progress
from parsim.runtimes import DEFAULT_RUNTIME, RUNTIMES, Runtime, get_runtime, runtime_help, runtime_name
from parsim.runtimes.eager import EAGER
from parsim.schedules import SCHEDULES, VIRTUAL, schedule_name
from parsim.sim.collector import gc_paused
from parsim.sim.predict import Prediction, Simulation
from parsim.workload import PARTITIONS, PRESETS, Model, conv_model, mlp_model
from parsim.workload.recompute import MODES
from parsim.workload.tensor_parallel import DEGREES

_positive_int = flags.positive_int
_int_list = flags.whole_list()
_layers = flags.whole(1, MAX_LAYERS)
MAX_JOBS = 1024  # --jobs: processes; more than any machine's cores


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The model flags, shared with `python -m hw measure` so both halves build the same model."""
    g = p.add_argument_group("model (default: 16 MLP blocks; parsim and hw build the same model from these flags)")
    g.add_argument("--layers", type=_layers, help="MLP blocks (default 16)")
    g.add_argument("--hidden", type=_positive_int, help="hidden size (default 2048)")
    g.add_argument("--tokens", type=_positive_int, help="tokens per step, all micro-batches (default 8192)")
    g.add_argument("--conv", action="store_true", help="the ResNet-34-like conv net instead: 16 residual blocks, "
                                                       "64-512 channels on 56x56 to 7x7 maps")
    g.add_argument("--images", type=_positive_int, help="images per step, all micro-batches, with --conv (default 256)")
    g.add_argument("--model", type=flags.path, metavar="FILE|NAME",
                   help=f"a model JSON file, a Hugging Face config.json or a preset ({', '.join(PRESETS)}) instead of "
                        "the flags above")
    g.add_argument("--seq-len", type=_positive_int, metavar="N", help="tokens per sequence, with a transformer --model")
    g.add_argument("--global-batch", type=_positive_int, metavar="B",
                   help="sequences per step, all micro-batches and replicas, with a transformer --model")


def add_partition_args(p: argparse.ArgumentParser, balance: bool = True) -> None:
    """How layers split into stages: equal counts, balanced by the profile's time per layer, or given."""
    if not balance:  # plan: it may try both splits
        p.add_argument("--partition", choices=(*PARTITIONS, "both"), default="both",
                       help="stages of equal layer counts, of balanced time per the profile, or each (default both)")
        return
    p.add_argument("--partition", choices=PARTITIONS, default="equal",
                   help="stages of equal layer counts, or of balanced time per the profile (default equal)")
    if balance:
        p.add_argument("--balance", type=_int_list, metavar="N,N,...",
                       help="layers per stage, first stage first (instead of --partition)")


def _add_model_args(p: argparse.ArgumentParser, balance: bool = True, runtime: str | None = DEFAULT_RUNTIME,
                    recompute: bool = True) -> None:
    add_model_args(p)
    add_partition_args(p, balance)
    p.add_argument("--profile", type=flags.path, metavar="FILE",
                   help="hardware profile (default: the shipped, measured one)")
    p.add_argument("--gpus-per-node", type=flags.whole(1, MAX_TP), metavar="N",
                   help="GPUs one node joins by NVLink, in place of the profile's (a tensor-parallel group stays "
                        "within them; messages between nodes take the network link)")
    p.add_argument("--copy-streams", action="store_true",
                   help="messages on dedicated copy streams, not behind the compute stream (torchgpipe's design)")
    if recompute:
        add_recompute_arg(p)
    add_runtime_arg(p, default=runtime)


MAX_TP = 1024  # --tensor-parallel: GPUs of one node; more than any node has


def add_tensor_parallel_args(p: argparse.ArgumentParser, many: bool = False) -> None:
    """--tensor-parallel (one degree, or for plan the degrees to try) and --sequence-parallel; shared with hw."""
    if many:
        p.add_argument("--tensor-parallel", type=flags.whole_list(1, MAX_TP), default=list(DEGREES), metavar="T,T,..",
                       help="tensor-parallel degrees to try, each dividing the GPUs, a node's GPUs and the model's "
                            "heads and widths (default 1,2,4,8)")
    else:
        p.add_argument("--tensor-parallel", type=flags.whole(1, MAX_TP), default=1, metavar="T",
                       help="GPUs of one node splitting each layer's matmuls (Megatron's column- and row-parallel "
                            "linears); --gpus / (T x D) pipeline ranks (default 1)")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="with tensor parallelism: norms and activations split by sequence too, each all-reduce a "
                        "reduce-scatter and an all-gather")


def add_recompute_arg(p: argparse.ArgumentParser) -> None:
    """--recompute: which micro-batches keep only their stage input and run the forward again in the backward, or
    (selective) which attention cores do."""
    p.add_argument("--recompute", choices=MODES, default="never",
                   help="recompute each micro-batch's forward in its backward, keeping only its stage input: "
                        "always, except-last (all but the last micro-batch, torchgpipe's default) or never; "
                        "selective: only each transformer block's attention core, in every backward (Megatron's; "
                        "under flash attention it frees only the core's log-sum-exp) (default never)")


def add_runtime_arg(p: argparse.ArgumentParser, note: str = "", default: str | None = DEFAULT_RUNTIME) -> None:
    """--runtime: what runs the schedule (parsim.runtimes), shared with `python -m hw` (which adds a note);
    default None: every runtime the profile has costs for (plan)."""
    shown = runtime_help() if default else runtime_help().rsplit(" (default", 1)[0] + \
        " (default: every runtime the profile has costs for)"
    p.add_argument("--runtime", type=runtime_name, default=default, metavar="NAME",
                   help=shown + (f"; {note}" if note else ""))


def model_from_args(args: argparse.Namespace) -> Model:
    """The model the flags of add_model_args name; a flag that does not belong to it is refused."""
    mlp_flags = [f"--{f}" for f in ("layers", "hidden", "tokens") if getattr(args, f) is not None]
    if args.model:
        given = mlp_flags + (["--conv"] if args.conv else []) + (["--images"] if args.images else [])
        if given:
            raise ParsimError(f"--model FILE describes the whole model: drop {', '.join(given)}")
        from parsim.workload.configs import named_model  # here: the configs and files it reads are --model's only

        return named_model(args.model, args.seq_len, args.global_batch)
    if args.seq_len is not None or args.global_batch is not None:
        raise ParsimError("--seq-len and --global-batch go with a transformer --model (a config or a preset)")
    if args.conv:
        if mlp_flags:
            raise ParsimError(f"--conv takes --images, not {', '.join(mlp_flags)}")
        return conv_model(args.images or 256)
    if args.images is not None:
        raise ParsimError("--images goes with --conv; the MLP stack takes --tokens")
    return mlp_model(args.layers or 16, args.hidden or 2048, args.tokens or 8192)


def partition_from_args(args: argparse.Namespace) -> Partition:
    """How --balance or --partition splits the layers into stages (a Configuration's partition)."""
    balance = getattr(args, "balance", None)
    if balance and args.partition != "equal":
        raise ParsimError("pass --partition time or --balance, not both")
    return tuple(balance) if balance else args.partition


class OneLineErrors(argparse.ArgumentParser):
    """Bad flags get one line and exit status 2, not a usage dump."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {one_line(message)} (see {self.prog} --help)\n")


QUESTIONS = {  # each command's --help opens with what it answers
    "predict": "How long does one training step take, and where do the GPUs idle?",
    "sweep": "How do step time and bubble change over schedules and micro-batch counts?",
    "plan": "What should I run? Every configuration that fits, ranked by step time.",
    "scenario": "What does the model predict for a textbook experiment (hw scenario)?",
    "compare": "How far are the predictions from measured steps or a profiled timeline?",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: every subcommand with its flags, or with `command` only that one's flags (the
    others are listed, flagless), so that a command neither builds nor imports what the others' flags need."""
    parser = OneLineErrors(prog="python -m parsim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineErrors)
    for name, add_flags in FLAGS.items():
        p = sub.add_parser(name, help=QUESTIONS[name], description=QUESTIONS[name])
        if command in (None, name):
            add_flags(p)
    return parser


def add_predict_flags(p: argparse.ArgumentParser) -> None:
    """`predict`'s flags."""
    p.add_argument("--schedule", type=schedule_name, default="1f1b", metavar="NAME",
                   help=f"{', '.join(sorted(SCHEDULES))}, torch:CLASS or a torch schedule CSV (default 1f1b)")
    p.add_argument("--gpus", type=_positive_int, default=4, help="GPUs in all (default 4)")
    p.add_argument("--data-parallel", type=_positive_int, default=1, metavar="D",
                   help="pipeline replicas whose gradients are all-reduced; --gpus / D stages each (default 1)")
    p.add_argument("--microbatches", type=_positive_int, help="micro-batches per step (default 4 x GPUs)")
    p.add_argument("--virtual-stages", type=_positive_int, metavar="V",
                   help="stages per GPU, for interleaved-1f1b (default 2)")
    add_tensor_parallel_args(p)
    _add_model_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--trace", type=flags.path, metavar="FILE",
                   help="write the timeline as a Chrome/Perfetto trace (JSON)")
    p.add_argument("--plot", type=flags.path, metavar="FILE", help="write the timeline as a Gantt chart (PNG)")


def add_sweep_flags(s: argparse.ArgumentParser) -> None:
    """`sweep`'s flags."""
    s.add_argument("--schedules", default="gpipe,1f1b", help="comma-separated (default gpipe,1f1b)")
    s.add_argument("--gpus", type=_positive_int, default=4)
    s.add_argument("--data-parallel", type=_positive_int, default=1, metavar="D")
    s.add_argument("--virtual-stages", type=_positive_int, metavar="V", help="for interleaved-1f1b (default 2)")
    s.add_argument("--microbatches", type=_int_list, default=[1, 2, 4, 8, 16, 32],
                   help="comma-separated counts (default 1,2,4,8,16,32)")
    add_tensor_parallel_args(s)
    _add_model_args(s)
    s.add_argument("--json", action="store_true", help="print a JSON list instead of the table")


def add_plan_flags(pl: argparse.ArgumentParser) -> None:
    """`plan`'s flags."""
    from parsim.workload.memory import OPTIMIZERS  # here, as in _plan: what memory holds is plan's question

    pl.add_argument("--gpus", type=_positive_int, default=4)
    pl.add_argument("--memory-limit", type=flags.number(0, 1e9), metavar="GB",
                    help="GPU memory per device, in GB (10^9 bytes; default: the profile's GPU's, where it has it)")
    pl.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adam",
                    help="state held per parameter: mixed-precision Adam, or none (weights and gradients, as "
                         "`hw measure` runs; default adam)")
    pl.add_argument("--schedules", help="comma-separated (default: all)")
    pl.add_argument("--top", type=_positive_int, default=10, help="rows to show (default 10)")
    pl.add_argument("--trace", type=flags.path, metavar="FILE",
                    help="write the best configuration's timeline (Chrome trace)")
    pl.add_argument("--jobs", type=flags.whole(1, MAX_JOBS), metavar="N",
                    help="processes simulating at once (default: all cores)")
    pl.add_argument("--recompute", choices=("auto", "never"), default="auto",
                    help="auto: a configuration over the memory limit is offered recomputed (except-last, else "
                         "always) where that fits it, on hw's runner (selective is not tried: it frees only the "
                         "attention cores' log-sum-exp); never: every activation kept (default auto)")
    add_tensor_parallel_args(pl, many=True)
    _add_model_args(pl, balance=False, runtime=None, recompute=False)  # its own --recompute, above


def add_scenario_flags(sc: argparse.ArgumentParser) -> None:
    """`scenario`'s name and flags."""
    from parsim.scenarios import SCENARIOS  # here: it imports every scenario's setup, which no other command needs

    sc.add_argument("name", choices=sorted(SCENARIOS))
    sc.add_argument("--profile", type=flags.path, metavar="FILE", help="hardware profile (default: the shipped one)")
    add_runtime_arg(sc)
    sc.add_argument("--json", action="store_true")


def add_compare_flags(c: argparse.ArgumentParser) -> None:
    """`compare`'s flags."""
    c.add_argument("--measured", type=flags.path, metavar="CSV", help="results written by `python -m hw validate`")
    c.add_argument("--out", type=flags.path, metavar="DIR",
                   help="folder for the plots, made if missing (default: the current folder)")
    c.add_argument("--profile", type=flags.path, metavar="FILE",
                   help="redo the predictions from this profile instead of the CSV's")
    c.add_argument("--runtime", type=runtime_name, metavar="NAME",
                   help="redo the predictions as run by this runtime (default: each row's `runtime` column, else hw)")
    c.add_argument("--timeline", type=flags.path, metavar="TRACE",
                   help="a `hw measure --trace` file to lay over the simulated step")
    c.add_argument("--point", metavar="SCHEDULE,GPUS,M,SPEC", help="the measured point of --timeline, e.g. "
                   "1f1b,2,8,16x2048x8192 or gpipe,2,8,conv:256 (SPEC as in `hw validate --models`)")
    c.add_argument("--gpu", type=flags.whole(0), default=0, help="the rank the trace is of (default 0)")


FLAGS = {"predict": add_predict_flags, "sweep": add_sweep_flags, "plan": add_plan_flags,
         "scenario": add_scenario_flags, "compare": add_compare_flags}  # each command's, in --help's order


def _predict(args: argparse.Namespace, profile: Profile, model: Model, schedule: str,
             microbatches: int) -> tuple[Prediction, Simulation]:
    # predict passes --virtual-stages on, so a schedule that has none refuses it; sweep mixes
    # schedules, so there it applies to the interleaved ones only
    virtual = args.virtual_stages if schedule in VIRTUAL or args.command == "predict" else None
    dp, t = args.data_parallel, args.tensor_parallel
    if args.gpus % dp:
        raise ParsimError(f"--gpus {args.gpus} does not split into {dp} data-parallel replicas")
    if args.gpus % (dp * t):
        raise ParsimError(f"--gpus {args.gpus} does not split into {dp} data-parallel replica(s) of "
                          f"--tensor-parallel {t} GPUs per pipeline rank")
    config = Configuration(model, schedule, args.gpus, microbatches, virtual, dp, args.runtime, args.copy_streams,
                           partition_from_args(args), args.recompute, t, args.sequence_parallel)
    check(config)  # before anything is built
    runtime_for(args)
    with gc_paused():  # a large schedule is 400k actions: the cycle collector would walk them again and again
        progress.phase(f"{schedule} m={microbatches}: building the schedule")
        prepared = prepare(config, profile)
        progress.phase(f"{schedule} m={microbatches}: simulating")
        return prepared.predict()


def runtime_for(args: argparse.Namespace) -> Runtime:
    """The runtime --runtime names, refusing what only hw's runners do (copy streams)."""
    runtime = get_runtime(args.runtime)
    if not runtime.copy_streams and getattr(args, "copy_streams", False):
        raise ParsimError(f"--copy-streams is hw's runner's; the {runtime.name} runtime posts its messages itself")
    return runtime


def profile_from_args(args: argparse.Namespace) -> Profile:
    """--profile's profile (the shipped one by default), its node size replaced by --gpus-per-node where given."""
    profile = load_profile(args.profile)
    if args.gpus_per_node is None:
        return profile
    carried = [name for name in profile.meta.get("carried_from_base") or [] if name != "gpus_per_node"]
    carried.append("gpus_per_node from --gpus-per-node")
    return replace(profile, gpus_per_node=args.gpus_per_node, meta={**profile.meta, "carried_from_base": carried})


def cmd_predict(args: argparse.Namespace) -> int:
    with Outputs() as outputs:  # both files or neither, checked before the work
        trace, plot = outputs.add(args.trace, "--trace"), outputs.add(args.plot, "--plot")
        profile, model = profile_from_args(args), model_from_args(args)
        m = args.microbatches or 4 * (args.gpus // (args.data_parallel * args.tensor_parallel) or 1)
        if trace or plot:  # a timeline holds every op: refused past a smaller bound, before anything runs
            check_actions(args.schedule, args.gpus, m, args.virtual_stages, timeline=True)
        with Progress("predict"):
            prediction, sim = _predict(args, profile, model, args.schedule, m)
            progress.phase("the timeline")
            if trace:
                from parsim.outputs.trace import trace_json

                outputs.write(trace, trace_json(sim))
            if plot:
                from parsim.outputs.plot import gantt_png

                outputs.write(plot, gantt_png(sim, f"{args.schedule}, {args.gpus} GPUs, {m} micro-batches: "
                                                   f"{fmt_time(prediction.step_time_s)}"))
        _say(json_text(to_json(prediction), indent=2) if args.json else to_text(prediction))
    return 0


def _say(text: str) -> None:
    """Print and flush, so that stdout failing (a full disk) fails the command before its files are kept."""
    print(text)
    sys.stdout.flush()


def cmd_sweep(args: argparse.Namespace) -> int:
    profile, model = profile_from_args(args), model_from_args(args)
    names = _schedule_names(args.schedules, runtime_for(args))
    with Progress("sweep"):
        results = [_predict(args, profile, model, n, m)[0] for n in names or () for m in args.microbatches]
    if args.json:
        print(json_text([to_json(r) for r in results], indent=2))
        return 0
    print(f"model {model.name} on {args.gpus} GPU(s); profile {profile.describe()}")
    print(f"{'schedule':<17} {'m':>5} {'step time':>12} {'speedup':>8} {'bubble':>7}  max peak activations")
    for r in results:
        peak = max(g.peak_activation_bytes for g in r.per_gpu)
        print(f"{r.schedule:<17} {r.microbatches:>5} {fmt_time(r.step_time_s):>12} {r.speedup:>7.2f}x "
              f"{r.bubble_fraction:>7.1%}  {fmt_bytes(peak)}")
    return 0


def _schedule_names(text: str | None, runtime: Runtime | None = EAGER) -> list[str] | None:
    """--schedules: names the runtime runs (with no runtime, that some runtime runs)."""
    if text is None:
        return None
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    known = runtime.schedules() if runtime else sorted({n for r in RUNTIMES.values() for n in r.schedules()})
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ParsimError(f"unknown schedule(s) {', '.join(unknown) or '(none given)'}"
                          f"{f' for the {runtime.name} runtime' if runtime else ''}; choose from: {', '.join(known)}")
    return names


def cmd_plan(args: argparse.Namespace) -> int:
    with Outputs() as outputs:
        return _plan(args, outputs, outputs.add(args.trace, "--trace"))


def _plan(args: argparse.Namespace, outputs: Outputs, trace: Path | None) -> int:
    from parsim.plan import default_jobs, search
    from parsim.workload.memory import OPTIMIZERS

    profile, model = profile_from_args(args), model_from_args(args)
    limit = args.memory_limit * 1e9 if args.memory_limit else profile.gpu_memory_bytes
    runtimes = [runtime_for(args)] if args.runtime else None
    found = search(model, args.gpus, profile, limit, _schedule_names(args.schedules, runtimes[0] if runtimes else None),
                   args.partition, runtimes, args.top, args.jobs or default_jobs(), progress=True,
                   optimizer=args.optimizer, recompute=args.recompute == "auto",
                   degrees=tuple(args.tensor_parallel), sequence=args.sequence_parallel)
    fits, too_big = found.fits, found.too_big
    print(f"model {model.name} on {args.gpus} GPU(s); profile {profile.describe()}")
    print(f"memory per GPU: {OPTIMIZERS[args.optimizer]}, plus peak activations and working memory; limit "
          + (f"{limit / 1e9:.1f} GB" + ("" if args.memory_limit else " (the profile's GPU)") if limit else
             "none (the profile does not record its GPU's memory: pass --memory-limit GB)"))
    if not fits and not too_big:
        raise ParsimError("no configuration can run this model on these GPUs")
    if not fits:
        assert limit is not None, "only a memory limit leaves configurations out"
        smallest = min(too_big, key=lambda c: c.memory_bytes)
        raise ParsimError(f"no configuration fits in {limit / 1e9:g} GB per GPU; the smallest, "
                          f"{smallest.label}, needs {smallest.memory_bytes / 1e9:.1f} GB")
    width = max([34] + [len(c.label) for c in fits[: args.top]])
    print(f"{'rank':>4}  {'runtime':<11} {'configuration':<{width}} {'step time':>11} {'speedup':>8} {'bubble':>7} "
          f"{'memory/GPU':>11}")
    for i, c in enumerate(fits[: args.top], start=1):
        p = c.prediction
        assert p is not None, "what fits was simulated"
        print(f"{i:>4}  {c.runtime:<11} {c.label:<{width}} {fmt_time(p.step_time_s):>11} {p.speedup:>7.2f}x "
              f"{p.bubble_fraction:>7.1%} {c.memory_bytes / 1e9:>8.2f} GB")
    redone = sum(c.recompute != "never" for c in fits[: args.top])
    if redone:
        print(f"{redone} of these fit only by recomputing (torchgpipe's checkpointing: each recomputed micro-batch's "
              "forward runs again in its backward; `hw measure --recompute` runs it)")
    print(f"tensor-parallel degree (tp=T in a configuration; 1 where not shown) tried: "
          f"{', '.join(map(str, found.degrees)) or 'none'}" + (", with sequence parallelism" * args.sequence_parallel))
    print(f"considered {found.considered} configurations: {found.pruned} pruned by a lower bound on step time, "
          f"{len(too_big)} over the memory limit, {found.cannot_run} that the schedule or runtime refuses, "
          f"{found.simulated} simulated; {found.seconds:.1f} s on {found.jobs} process(es)"
          + (f"; {found.too_large} more left out, too large to simulate" if found.too_large else ""))
    if trace:
        from parsim.outputs.trace import trace_json

        best = fits[0]
        check_actions(best.schedule, args.gpus, best.microbatches, best.virtual_stages, timeline=True)
        config = best.configuration(model, args.gpus, args.copy_streams and get_runtime(best.runtime).copy_streams)
        outputs.write(trace, trace_json(predict(config, profile)[1]))
    return 0


def cmd_scenario(args: argparse.Namespace) -> int:
    from parsim.scenarios import PIPELINE_SCENARIOS, SCENARIOS, predict_pipeline_scenario

    runtime = get_runtime(args.runtime)
    if args.name in PIPELINE_SCENARIOS:
        result = predict_pipeline_scenario(PIPELINE_SCENARIOS[args.name], load_profile(args.profile), runtime)
    elif runtime is not EAGER:
        raise ParsimError(f"the {args.name} scenario runs no pipeline; --runtime applies to "
                          f"{', '.join(PIPELINE_SCENARIOS)}")
    else:
        result = SCENARIOS[args.name](load_profile(args.profile))
    if args.json:
        doc = {"name": result.name, "headline": result.headline, "figures": result.figures}
        if result.assumptions:
            doc["assumptions"] = list(result.assumptions)
        print(json_text(doc, indent=2))
        return 0
    print(f"{result.name}: {result.description}")
    for key, value in result.figures.items():
        shown = (f"{value:.3f}" if key.endswith("_ratio") else f"{value:.0f}" if key.endswith("_count")
                 else fmt_bytes(value) if key.endswith("_bytes") else fmt_time(value))
        mark = "   <- headline" if key == result.headline else ""
        print(f"  {key:<34} {shown:>12}{mark}")
    for line in result.assumptions:
        print(f"assumes: {line}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from parsim.compare import compare

    if not (args.measured or args.timeline):
        raise ParsimError("compare needs --measured CSV, or --timeline TRACE with --point")
    # the plots and the overlay: all or none, their paths checked first; a folder made for them goes if they do
    with folder_made(args.out or ".") as out, Outputs() as outputs:
        overlay = None
        if args.timeline:
            overlay = outputs.add(out / f"{Path(args.timeline).name.split('.')[0]}-overlay.png", "overlay")
        if args.measured:
            profile = load_profile(args.profile) if args.profile else None
            with Progress("compare"), gc_paused():  # each row's schedule: up to millions of actions, as predict's
                table, plots = compare(args.measured, out, profile, args.runtime, outputs=outputs)
            print(table)
            print("plots: " + ", ".join(map(str, plots)))
        if overlay:
            _overlay(args, outputs, overlay)
            _say(f"timeline: {overlay}")
    return 0


def _overlay(args: argparse.Namespace, outputs: Outputs, path: Path) -> None:
    """Simulate --point with the profile and draw it under the profiled --timeline, as the PNG at `path`."""
    from parsim.outputs.overlay import overlay_png
    from parsim.workload.configs import model_from_spec

    try:
        schedule, gpus, m, spec = (args.point or "").split(",")
        gpus, m = flags.positive_int(gpus), flags.positive_int(m)
    except (ValueError, argparse.ArgumentTypeError):
        raise ParsimError(f"--point takes SCHEDULE,GPUS,M,SPEC with GPUS and M whole numbers from 1 to {MAX_SIZE:,}, "
                          f"got {args.point!r}") from None
    model = model_from_spec(spec)
    if not 0 <= args.gpu < gpus:
        raise ParsimError(f"--gpu must name one of the point's {gpus} GPUs, got {args.gpu}")
    check_actions(schedule, gpus, m, timeline=True)
    _, sim = predict(Configuration(model, schedule, gpus, m), load_profile(args.profile))
    outputs.write(path, overlay_png(sim, args.gpu, args.timeline))


COMMANDS = {"predict": cmd_predict, "sweep": cmd_sweep, "plan": cmd_plan, "scenario": cmd_scenario,
            "compare": cmd_compare}


STDOUT_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)  # stdout on a full or failing device


def run_command(command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a subcommand; a user error becomes one line on stderr and exit status 2, never a traceback; Ctrl-C,
    SIGTERM and SIGHUP one line saying so (and what they stopped) and 128 + the signal's number.

    stdout is flushed here, so that a full device (`> /dev/full`) is one line and exit 2 too; a reader that
    leaves (`| head`) ends the command quietly with 141, as a shell tool's SIGPIPE does.
    """
    if sys.stdout is None:  # started with standard output closed (`>&-`): nowhere to write an answer
        print("error: standard output is closed; give the command somewhere to write (a file, a pipe)", file=sys.stderr)
        return 2
    if hasattr(sys.stdout, "reconfigure"):  # a name given in bytes that are not UTF-8 is echoed as those bytes
        sys.stdout.reconfigure(errors="surrogateescape")
    try:
        with stopping():  # SIGTERM and SIGHUP unwind as Ctrl-C does
            status = command(args)
            sys.stdout.flush()
        return status
    except ParsimError as e:
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(describe(e, "interrupted"), file=sys.stderr)
        return 130
    except Stopped as e:
        print(describe(e, str(e)), file=sys.stderr)
        return e.status
    except BrokenPipeError:  # the reader left (`| head`): stop quietly, as a shell tool does on SIGPIPE
        _drop_stdout()
        return 141
    except OSError as e:
        if e.errno not in STDOUT_FULL:
            raise
        _drop_stdout()
        kept = kept_files()  # hw's measurements (a profile, a grid, traces), written before the report: kept
        print(f"error: cannot write to standard output: {e.strerror}"
              + (f"; kept what it measured: {', '.join(map(str, kept))}" if kept else ""), file=sys.stderr)
        return 2


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that the exit's flush of what is still buffered cannot fail again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no file (captured in tests)
        pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv[0] if argv and argv[0] in COMMANDS else None).parse_args(argv)
    return run_command(COMMANDS[args.command], args)
