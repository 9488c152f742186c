"""`python -m hw validate`: measure a grid of pipeline steps and predict each; one CSV row a point.

The profile comes from --profile, or from a calibration run first (written into --out). Every turn also steps
the host probe (parsim.hostprobe), so that each point's prediction can be given at the host speed of its turn too.
The CSV is what `python -m parsim compare --measured FILE` reads to print the error table and plots.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from hw.calibrate.command import RUNTIME_COSTS
from hw.measure.steps import (
    MAX_STEPS,
    Config,
    Job,
    RankTiming,
    Turn,
    baseline_job,
    deadline_s,
    measure_turns,
    on_rank,
    report,
    steps_per_job,
)
from hw.run.ranks import require_gpus
from hw.run.runtimes import RUNNERS, check_runs
from hw.run.stage_runner import check_recompute
from hw.run.teardown import child_env
from hw.run.tensor_parallel import check_model
from parsim import flags
from parsim.budget import check_cpu_run
from parsim.cli import MAX_TP
from parsim.compare import COLUMNS, compare
from parsim.configuration import Configuration, prepare
from parsim.errors import ParsimError
from parsim.files import check_output, json_text, write_atomic
from parsim.hostprobe import probe as host_probe
from parsim.interrupts import Stopped, note
from parsim.profile import Profile, load_profile
from parsim.runtimes import get_runtime
from parsim.schedules import SCHEDULES, schedule_name
from parsim.workload import MODEL_SPECS, Model, model_from_spec, model_spec
from parsim.workload.recompute import MODES, check_layers
from parsim.workload.tensor_parallel import TensorParallel, check_tensor_parallel, collective_spec


def _models(text: str) -> list[Model]:
    """'16x2048x8192,conv:256' -> the models those specs name (see model_from_spec)."""
    specs = [spec for spec in text.split(",") if spec.strip()]
    if not specs:
        raise ParsimError(f"--models names none; it takes specs separated by commas: {MODEL_SPECS}")
    return [model_from_spec(spec) for spec in specs]


GRID = {"gpus": "2,4", "microbatches": "1,2,4,8,16,32", "models": "16x2048x8192,8x256x1024"}
CPU_GRID = {"gpus": "1,2", "microbatches": "1,4", "models": "4x64x256"}  # --cpu: tiny, as its help says


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=flags.whole_list(),
                   help=f"GPU counts, comma-separated (default {GRID['gpus']}; with --cpu {CPU_GRID['gpus']})")
    p.add_argument("--data-parallel", type=flags.whole_list(), default="1", metavar="D,...",
                   help="replica counts: each point runs GPUS/D-rank pipelines on D replicas (default 1)")
    p.add_argument("--tensor-parallel", type=flags.whole_list(1, MAX_TP), default="1", metavar="T,...",
                   help="tensor-parallel degrees: each point runs GPUS/T-rank pipelines, each rank's MLP blocks split "
                        "over T GPUs (hw and torch runtimes; predicted by parsim's TP model) (default 1)")
    p.add_argument("--copy-streams", action="store_true", help="measure every point once more with copy streams")
    p.add_argument("--recompute", type=recompute_modes, default="never", metavar="MODE,...",
                   help=f"recomputation modes ({', '.join(MODES)}): each point of hw's runner is measured under each, "
                        "in turns; the other runtimes and split-backward schedules run `never` only (default never)")
    p.add_argument("--runtimes", default="hw", metavar="NAME,...",
                   help=f"what runs the schedules (parsim's runtimes hw runs: {', '.join(RUNNERS)}): each point is "
                        "measured under each, in turns (a step of each per round), and predicted as that runtime runs "
                        "it; hw's runner is timed with its host thread pinned, the others unpinned (default hw)")
    p.add_argument("--schedules", default="gpipe,1f1b")
    p.add_argument("--microbatches", type=flags.whole_list(),
                   help=f"micro-batch counts, comma-separated (default {GRID['microbatches']}; with --cpu "
                        f"{CPU_GRID['microbatches']})")
    p.add_argument("--models", help="model specs, comma-separated: LAYERSxHIDDENxTOKENS (an MLP stack), conv:IMAGES "
                                     "(the conv net) or conv:IMAGES:WIDTHS:BLOCKS:SIDE, e.g. conv:8:4-8:1-2:8, or a "
                                     "transformer: llama:BATCH:SEQ:BLOCKS:HIDDEN:HEADS:KV_HEADS:FFN:VOCAB or "
                                     f"PRESET:BATCH:SEQ (default {GRID['models']}: a compute-bound and a "
                                     f"dispatch-bound MLP stack; with --cpu {CPU_GRID['models']})")
    p.add_argument("--profile", type=flags.path, metavar="FILE", help="use this profile instead of calibrating first")
    p.add_argument("--out", type=flags.path, default="validation", metavar="DIR",
                   help="folder for the CSV, profile and plots")
    p.add_argument("--force", action="store_true", help="overwrite an earlier run's outputs in --out")
    p.add_argument("--steps", type=flags.whole(1, MAX_STEPS), default=10)
    p.add_argument("--warmup", type=flags.whole(0, MAX_STEPS), default=3)
    p.add_argument("--cpu", action="store_true", help="tiny run on the CPU with gloo (for tests): a tiny grid "
                                                      "unless --gpus, --microbatches or --models say otherwise")
    p.add_argument("--timeout", type=flags.seconds, default=120.0)


def _profile(args: argparse.Namespace, out: Path, given: Profile | None, conv: bool = False,
             transformers: Sequence[str] = (), runtimes: tuple[str, ...] = ()) -> tuple[Profile, str]:
    """--profile's (`given`, loaded), or a fresh calibration's (with the conv layers' costs if a model is a conv net,
    the transformer layers' of the transformers' specs, and the host costs of each runtime other than hw's); one
    clear error if it lacks a runtime's costs."""
    if given is not None:
        profile, path = given, args.profile
    else:
        path = out / "profile.json"
        others = [r for r in runtimes if r in RUNTIME_COSTS]  # those with costs of their own to measure
        cmd = ([sys.executable, "-m", "hw", "calibrate", "--out", str(path), "--force"]
               + (["--cpu"] if args.cpu else []) + (["--conv"] if conv else [])
               + (["--transformer", ",".join(transformers)] if transformers else [])
               + (["--runtimes", ",".join(others)] if others else []))
        try:  # the calibration dies with this process (hw.run.teardown), and is stopped when this one is interrupted
            done = subprocess.run(cmd, text=True, stdout=sys.stderr, env=child_env())
        except (KeyboardInterrupt, Stopped) as e:
            note(e, "stopped its calibration (`hw calibrate`)")
            raise
        if done.returncode:
            raise ParsimError(f"calibration failed (exit {done.returncode}); see its output above")
        profile, path = load_profile(path), str(path)
    for name in runtimes:
        get_runtime(name).costs(profile)
    if max(args.tensor_parallel) > 1:
        collective_spec(profile, "allreduce")  # what TP's collectives are priced by: one clear error if it has none
    return profile, str(path)


def _runtimes(text: str) -> tuple[str, ...]:
    """--runtimes: parsim's runtimes that hw runs, in the order given."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise ParsimError("--runtimes names none; it takes runtime names separated by commas, e.g. hw,torch")
    for name in names:
        get_runtime(name)
        check_runs(name)
    return names


def recompute_modes(text: str) -> tuple[str, ...]:
    """--recompute's comma-separated modes, each one known (parsim.workload.recompute)."""
    modes = tuple(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise argparse.ArgumentTypeError(f"unknown recompute mode(s) {', '.join(unknown) or '(none)'}; "
                                         f"choose from {', '.join(MODES)}")
    return modes


def _job(name: str, gpus: int, microbatches: int, model: Model, config: Config, replicas: int = 1,
         copy_streams: bool = False, runtime: str = "hw", recompute: str = "never", tp: int = 1) -> Job | None:
    """A grid point run by `runtime`, or None where it cannot run: GPUs that do not split into the replicas of
    `tp`-GPU ranks, a schedule that refuses these sizes (or the runtime that, or recomputing or tensor parallelism
    under it, or selective on a profiled model), a model that does not split `tp` ways, more stages than layers, or
    tokens that do not split evenly."""
    if gpus % (replicas * tp) or model.tokens % (microbatches * replicas):
        return None
    try:
        check_runs(runtime, replicas, copy_streams, recompute, tp)
        check_tensor_parallel(model, TensorParallel(tp))
        if tp > 1:
            check_model(model, runtime)
        schedule = get_runtime(runtime).build(name, gpus // (replicas * tp), microbatches)
        check_recompute(schedule, recompute)
        check_layers(recompute, model.layers)
    except ParsimError:
        return None
    if schedule.num_stages > len(model.layers):
        return None
    return Job(schedule, model, config, replicas, copy_streams, runtime, recompute, tp)


def _probe_job(ranks: int, config: Config) -> Job:
    """The host probe on `ranks` (parsim.hostprobe), timed in every turn beside the points."""
    schedule, model = host_probe(ranks)
    return Job(schedule, model, config)


def _row(job: Job, measured: dict, profile: Profile, profile_path: str, probe_s: float) -> dict:
    """One CSV row: the point, its measured median and spread, the host probe's median step in its turn, and
    parsim's prediction."""
    s, model = job.schedule, job.model
    config = Configuration(model, s.name, job.ranks, s.num_microbatches, data_parallel=job.data_parallel,
                           runtime=job.runtime, copy_streams=job.copy_streams, recompute=job.recompute,
                           tensor_parallel=job.tensor_parallel)
    prepared = prepare(config, profile)
    predicted, _ = prepared.predict()
    c = measured["config"]
    measured_peaks = [stage["peak_memory_bytes"] for stage in measured["per_stage"]]
    return {"schedule": s.name, "gpus": job.ranks, "microbatches": s.num_microbatches, "model": model_spec(model),
            "layers": len(model.layers), "hidden": model.layers[0].hidden, "tokens": model.tokens,  # for old readers
            "measured_s": measured["step_time_s"],
            "measured_min_s": measured["step_time_min_s"], "measured_max_s": measured["step_time_max_s"],
            "measured_single_gpu_s": measured["single_device_step_s"],
            "predicted_s": predicted.step_time_s, "predicted_single_gpu_s": predicted.single_gpu_step_s,
            "excluded": "", "data_parallel": job.data_parallel, "copy_streams": job.copy_streams,
            # the most any GPU holds: weights, gradients made in the step, activations and working memory
            "predicted_peak_bytes": prepared.runtime.peak_bytes(prepared.run_model, s, job.data_parallel, "none",
                                                                job.recompute),
            "measured_peak_bytes": max(measured_peaks) if None not in measured_peaks else "",
            "runtime": job.runtime, "host_probe_s": probe_s, "recompute": job.recompute,
            "tensor_parallel": job.tensor_parallel,
            "dtype": c["dtype"], "device": c["device"], "torch": c["torch"], "date": c["date"], "profile": profile_path}


def _samples(row: dict, measured: dict, probe: RankTiming) -> dict:
    """A CSV row's raw timings (samples.json): every timed sample's steps of the point and of its turn's host
    probe, so that other estimators than the median of sample means can be redone offline; each stage's rank's peak
    memory, and a graphed job's pools."""
    keys = ("schedule", "gpus", "microbatches", "model", "runtime", "data_parallel", "copy_streams", "recompute",
            "tensor_parallel")
    memory = {"peak_memory_bytes": [s["peak_memory_bytes"] for s in measured["per_stage"]]}
    if any(s.get("graph_pool_bytes") for s in measured["per_stage"]):  # each stage's rank's pool (a graphed job)
        memory["graph_pool_bytes"] = [s["graph_pool_bytes"] for s in measured["per_stage"]]
    return {**{k: row[k] for k in keys}, "steps_s": measured["step_blocks_s"], "probe_steps_s": probe.blocks, **memory}


def _check_cpu_grid(model: Model, turns: list[Turn], args: argparse.Namespace) -> None:
    """Refuse a model's grid on the CPU that cannot finish in time (parsim.budget.check_cpu_run): its points, the
    host probe beside each and the one-device baseline, in one process group."""
    if not turns:
        return
    heavy = sum(map(len, turns)) + 1  # the points and the baseline (the host probes are tiny)
    deadline = deadline_s(args.timeout, heavy + len(turns))  # as measure_turns counts: a probe in every turn
    try:
        check_cpu_run(model, "fp32", steps_per_job(args.steps, args.warmup), heavy, args.timeout, deadline,
                      max(turn[0].ranks for turn in turns) > 1, "smaller --models")
    except ParsimError as e:
        raise ParsimError(f"{model_spec(model)}: {e}") from None


def _write_csv(path: Path, rows: list[dict]) -> None:
    """The CSV of `rows`: compare's columns first, then validate's own."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(COLUMNS) + ["model", "excluded", "data_parallel", "copy_streams",
                                                             "runtime", "dtype", "device", "torch", "date", "profile",
                                                             "predicted_peak_bytes", "measured_peak_bytes",
                                                             "host_probe_s", "recompute", "tensor_parallel"])
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(path, buf.getvalue())


def _out_folder(text: str, force: bool = False) -> tuple[Path, bool]:
    """--out, checked before any work: an existing, writable folder, or one that can be made (in an existing,
    writable folder); whether it is new. What validate writes there must not be a folder already, nor, unless
    `force`, an earlier run's output (nothing a user had is lost)."""
    out = Path(text)
    if not out.exists():
        check_output(out, "--out")  # its parent: there and writable
        return out, True
    if not out.is_dir():
        raise ParsimError(f"--out {out} exists and is not a folder")
    for name in OUTPUT_NAMES:
        check_output(out / name, "--out's")
    earlier = [name for name in OUTPUT_NAMES if (out / name).exists()]
    if earlier and not force:
        raise ParsimError(f"--out {out} holds an earlier run's {', '.join(earlier)}; pass --force to overwrite them, "
                          "or choose another --out")
    return out, False


def _remove_if_empty(out: Path) -> None:
    """The --out folder this run made, removed where a failure left it empty."""
    with contextlib.suppress(OSError):
        out.rmdir()


OUTPUT_NAMES = ("results.csv", "summary.json", "profile.json", "profile.samples.json", "results-step-times.png",
                "results-speedups.png")


def main(args: argparse.Namespace) -> int:
    """Check the grid's flags, then measure, predict and compare it into --out (removed again if left empty)."""
    defaults = CPU_GRID if args.cpu else GRID
    gpus = args.gpus or flags.whole_list()(defaults["gpus"])
    mbs = args.microbatches or flags.whole_list()(defaults["microbatches"])
    replicas = args.data_parallel
    schedules = [s.strip() for s in args.schedules.split(",") if s.strip()]
    if not schedules:
        raise ParsimError(f"--schedules names none; choose from {', '.join(sorted(SCHEDULES))} or torch:CLASS")
    try:
        schedules = [schedule_name(s) for s in schedules]
    except argparse.ArgumentTypeError as e:
        raise ParsimError(str(e)) from None
    models = _models(defaults["models"] if args.models is None else args.models)
    runtimes = _runtimes(args.runtimes)
    require_gpus(max(gpus), cpu=args.cpu)
    given = load_profile(args.profile) if args.profile else None
    device, dtype = ("cpu", "fp32") if args.cpu else ("cuda", "bf16")
    config = Config(args.steps, args.warmup, dtype)
    variants = [(d, c, t) for d in replicas for c in ((False, True) if args.copy_streams else (False,))
                for t in args.tensor_parallel]
    # one process group per model and GPU count, so that a run cut off keeps what it measured before
    grid = [(model, [turn for d, c, t in variants for s in schedules for m in mbs
                     if (turn := tuple(job for r in runtimes for rc in args.recompute
                                       if (job := _job(s, p, m, model, config, d, c, r, rc, t))))])
            for model in models for p in gpus]
    if not any(turns for _, turns in grid):
        raise ParsimError("no point of the grid can run: each needs layers >= stages, tokens divisible by the "
                          "micro-batch count, GPUs divisible by replicas x tensor-parallel degree (TP: an MLP "
                          "stack, hw or torch runtime, no replicas), and sizes its schedule accepts (interleaved: "
                          "micro-batches divisible by GPUs)")
    if args.cpu:  # refused at once, before calibrating, where even a CPU at its peak could not finish in time
        for model, turns in grid:
            _check_cpu_grid(model, turns, args)
    out, new = _out_folder(args.out, args.force)
    if new:
        try:
            out.mkdir()
        except OSError as e:
            raise ParsimError(f"cannot make --out {out}: {e.strerror or e}") from None
    try:
        return _validate(args, out, given, models, runtimes, grid, device, config)
    except BaseException:
        if new:
            _remove_if_empty(out)
        raise


def _validate(args: argparse.Namespace, out: Path, given: Profile | None, models: list[Model],
              runtimes: tuple[str, ...], grid: list[tuple[Model, list[Turn]]], device: str, config: Config) -> int:
    """The grid measured, predicted and compared, into `out`."""
    transformers = [model_spec(m) for m in models if m.transformer is not None]
    profile, profile_path = _profile(args, out, given, any(m.layers[0].kind in ("conv", "down") for m in models),
                                     transformers, runtimes)
    csv_path, rows, samples = out / "results.csv", [], []
    for model, turns in grid:  # one process group per model and GPU count; the CSV grows after each
        if not turns:
            continue
        world = max(turn[0].ranks for turn in turns)
        probed = [turn + (_probe_job(turn[0].ranks, config),) for turn in turns]  # the host's speed in each turn
        *measured, (baseline,) = measure_turns(probed + [(baseline_job(model, config),)], world, device,
                                               args.timeout)
        for turn, (*results, probe) in zip(turns, measured, strict=True):
            probe_timing = on_rank(probe, 0)
            probe_s = statistics.median(probe_timing.times)
            for job, result in zip(turn, results, strict=True):
                measured_job = report(job, result, on_rank(baseline, 0), device)
                rows.append(_row(job, measured_job, profile, profile_path, probe_s))
                samples.append(_samples(rows[-1], measured_job, probe_timing))
        _write_csv(csv_path, rows)
        write_atomic(out / "samples.json", json_text({"points": samples}) + "\n")
    table, plots = compare(csv_path, out, host_profile=profile)
    print(table)
    print(f"wrote {csv_path}, " + ", ".join(map(str, plots)))
    write_atomic(out / "summary.json", json_text({"points": len(rows), "profile": profile_path}, indent=2) + "\n")
    return 0
