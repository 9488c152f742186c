"""`python -m hw calibrate`: measure this machine and write a parsim profile, with the raw samples.

What it measures, each alone and with the GPU's own clock where the GPU is what is timed:
  1. per layer (MlpBlock; with --conv also ConvBlock and DownBlock at each shape of the conv net; with
     --transformer attention, decoder blocks, embeddings and heads: hw/calibrate/transformer.py): forward,
     input-grad and full-backward GPU time over micro-batch sizes (weight-grad = full - input-grad), fitted
     to fixed_s + flops / flops_per_s per kind and per shape;
  2. the host: per layer (of each kind) and per action, from host timers around the actions of hw's own executor;
     for MLP blocks the level (per layer, per action, per step) from whole steps timed as hw measure does
     (hw.calibrate.host_steps), the timers giving each op's share;
  3. host<->device copies, pinned and pageable, both directions (latency + bytes / bandwidth);
  4. the scenarios' costs: one op's launch, a sync, elementwise and matmul kernels;
  5. with >= 2 GPUs: NCCL send/recv between GPU 0 and 1 and an all-reduce over all GPUs, and the collectives
     tensor parallelism issues at its sizes (hw.calibrate.tp_collectives) and DTensor's host cost per split
     matrix (hw.calibrate.tp_host); how far the slowest
     of the ranks' host loops sets a tiny pipeline's step over the mean (hw.calibrate.rank_spread);
  6. with --runtimes graphs: the CUDA-graphed runtimes' host and GPU costs (hw.calibrate.graphs_runtime).
What it cannot measure here (fewer GPUs, no second node) is copied from --base and marked so.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import platform
import statistics
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from hw.calibrate import host_steps, stage_probe
from hw.calibrate import transformer as calibrate_transformer
from hw.calibrate.fallback import Fallback, carry_failed, fall_back
from hw.calibrate.fallback import describe as describe_fallback
from hw.calibrate.fit import Fit
from hw.calibrate.host import grad_add_host, host_costs, host_samples
from hw.calibrate.kernels import autograd_accumulate, measure_all
from hw.calibrate.layers import (
    CONV_KINDS,
    STAGED,
    conv_layers,
    fitted_costs,
    in_step_slowdowns,
    layer_samples,
    stretched,
)
from hw.calibrate.links import copy_links, gpu_links
from hw.calibrate.rank_spread import rank_spread as measure_rank_spread
from hw.calibrate.self_check import BOUND, self_check, verdict
from hw.calibrate.tp_collectives import tp_collectives
from hw.calibrate.tp_host import TpHost, tp_host
from hw.calibrate.tp_host import describe as describe_tp_host
from hw.run.ranks import require_gpus
from parsim import flags
from parsim.errors import ParsimError
from parsim.files import check_output
from parsim.profile import (
    AUTOGRAD_ACCUMULATE,
    HostCosts,
    Profile,
    ResidentComm,
    RuntimeCosts,
    load_profile,
    samples_path,
    save_profile,
)
from parsim.scenarios import with_op_costs
from parsim.workload import Layer, Model

RUNTIME_PROBES = {"torch": "torch.distributed.pipelining's host costs (hw.calibrate.torch_runtime, ~30 s)",
                  "graphs": "graphs and graphs-step: CUDA-graphed actions, or one graph per one-GPU step (~30 s)"}






# --- 1. layers ---------------------------------------------------------------------------------



































# --- 3. host <-> device copies -------------------------------------------------------------------



# --- 5. GPU to GPU -----------------------------------------------------------------------------













# --- the command --------------------------------------------------------------------------------

TRANSFORMERS = "llama-3.2-1b:2:2048,llama-3-8b:1:4096"  # --transformer's default models (the first: in-step)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=flags.path, default="profile.json", metavar="FILE",
                   help="profile to write (default profile.json)")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--base", type=flags.path, metavar="PROFILE",
                   help="where unmeasured parts come from (default: shipped profile)")
    p.add_argument("--hidden", type=flags.whole_list(), default="256,512,1024,2048,4096",
                   help="hidden sizes to cost, each also fitted alone; a width between two of them is priced by "
                        "blending theirs (default 256,512,1024,2048,4096)")
    p.add_argument("--gpus", type=flags.positive_int,
                   help="GPUs for the GPU-GPU links (default: all visible; with --cpu, "
                                            "processes talking over gloo, for tests)")
    p.add_argument("--conv", action="store_true", help="also cost the conv net's layers (`parsim --conv`): each of "
                                                       "its shapes at 4-256 images, and their host cost (~20 s more)")
    p.add_argument("--transformer", nargs="?", const=TRANSFORMERS, metavar="MODELS",
                   help="also cost transformer layers: causal flash attention over sequence lengths and head counts, "
                        "and the decoder blocks, embeddings and heads of these models (specs or presets at a batch "
                        f"and length, comma-separated; default {TRANSFORMERS}), and their host cost")
    p.add_argument("--cpu", action="store_true", help="a small, fast calibration on the CPU (for tests)")
    p.add_argument("--interfaces", action="store_true",
                   help="only what `parsim scenario data-parallel` and `hogwild` need (on GPU 0, else with CPU "
                        "ops: a launch alone, its GIL-free part, one and two threads launching with the GIL held "
                        "longer; a Hogwild step alone and in 3, 6, 12, .. processes; memory bandwidth; ~1 min), "
                        "added to --base")
    p.add_argument("--tp-collectives", action="store_true",
                   help="only the collectives tensor parallelism issues (all-reduce, reduce-scatter, all-gather of "
                        "256-8192 tokens x hidden 2048-8192 in bf16) over --gpus GPUs (default all visible; at least "
                        "2), fitted as collectives.tp_allreduce etc., and DTensor's host cost per split matrix "
                        "(host.tp_forward_s, tp_backward_s), added to --base (~40 s)")
    p.add_argument("--runtimes", default="", metavar="NAME,...",
                   help="also the costs of these pipeline runtimes besides hw's runner (profile.runtimes): "
                        f"{', '.join(f'{n}: {what}' for n, what in RUNTIME_PROBES.items())}")


def main(args: argparse.Namespace) -> int:
    out = check_output(args.out, "--out")
    check_output(samples_path(out), "the samples beside --out")
    if out.exists() and not args.force:
        raise ParsimError(f"{out} exists; pass --force to overwrite it, or choose another --out")
    if args.interfaces:
        from hw.interfaces.calibration import calibrate_interfaces

        return calibrate_interfaces(load_profile(args.base), out, args.cpu)
    if not args.cpu and not torch.cuda.is_available():
        raise ParsimError("no CUDA GPU is visible; calibrate on a GPU machine, or pass --cpu for a small CPU run")
    if args.tp_collectives:
        return _tp_collectives_only(args, out)
    if args.cpu:  # tiny probes gain nothing from more threads; on a busy machine their spinning made it 10x slower
        torch.set_num_threads(1)
    if args.gpus:
        require_gpus(args.gpus, cpu=args.cpu)
    hidden = args.hidden
    base = load_profile(args.base)
    transformers = None
    if args.transformer:
        from hw.calibrate.transformer import parse_models

        transformers = parse_models(args.transformer)
    runtimes = _runtime_names(args.runtimes)
    profile, samples, fits = calibrate(base, hidden, args.cpu, args.gpus, args.conv, transformers, runtimes)
    profile, samples["runtimes"], runtime_meta = runtime_costs(profile, base, runtimes, fits, args.cpu, args.gpus,
                                                               samples["host_steps"])
    meta = {"source": "python -m hw calibrate", "command": "python -m hw " + " ".join(sys.argv[1:]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "gpu": torch.cuda.get_device_name(0) if not args.cpu else "cpu",
            "gpu_count": torch.cuda.device_count() if not args.cpu else 0,
            "driver": _driver(), "fits": {k: f.record() for k, f in fits.items()},
            "in_step_slowdown": samples["in_step_slowdown"], "runtimes": runtime_meta,
            **({"fallbacks": samples["fallbacks"]} if samples["fallbacks"] else {}),
            **({"rank_spread": _spread_meta(samples["rank_spread"])} if "rank_spread" in samples else {}),
            **({"tp_host": samples["tp_host_fit"]} if "tp_host_fit" in samples else {}),
            "carried_from_base": [n for n, link in profile.links.items() if not link.measured]
            + [n for n, c in profile.collectives.items() if not c.measured] + samples["carried"]}
    check = self_check(profile, samples["host_steps"])
    if check is not None:
        meta["self_check"] = verdict(check, str(out), args.force, enforced=not args.cpu)
    memory = torch.cuda.get_device_properties(0).total_memory if not args.cpu else None
    profile = dataclasses.replace(profile, meta=meta, gpu_memory_bytes=memory,
                                  provisional=bool(meta["carried_from_base"]) or "forced" in meta.get("self_check", {}))
    save_profile(profile, out, {"meta": meta, "samples": samples})
    _report(fits, out, samples_path(out))
    for f in samples["fallbacks"]:
        print(describe_fallback(Fallback(**f)))
    if check is not None:
        print(check.summary() + ("" if check.passed else f": past the {BOUND:.0%} bound"
                                 + (", written with --force" if "forced" in meta["self_check"] else
                                    " (not enforced on the CPU)")))
    for family, slow in samples["in_step_slowdown"].items():
        print(f"in-step slowdown of {family} layers x{slow['factor']:.3f} "
              + ("applied to their costs" if slow.get("applied", True)
                 else "(a check: their costs follow hw's runner's stages)")
              + (f": {slow['evidence']}" if "evidence" in slow else ""))
    print(f"adding gradients into .grad: {profile.host.grad_add_s * 1e6:.1f} us of host time per layer (a stage's "
          f"first backward of a step adds none)")
    print(f"a forward right after a backward: {profile.host.after_backward_s * 1e6:.1f} us more of host time")
    if profile.host.recompute_s or profile.host.recompute_call_s:
        print(f"a recomputed micro-batch (torch.utils.checkpoint): {profile.host.recompute_call_s * 1e6:.1f} us + "
              f"{profile.host.recompute_s * 1e6:.1f} us a layer of host time")
    if "tp_host_fit" in samples:
        print(describe_tp_host(TpHost(**samples["tp_host_fit"])))
    if "rank_spread" in samples:
        print(f"the slowest of {meta['rank_spread']['ranks']} ranks' host loops: "
              f"+{samples['rank_spread']['excess']:.1%} over the mean (tiny pipelines), a loop's spread "
              f"{profile.host.rank_spread:.3f}")
    for name, costs in profile.runtimes.items():
        if name in samples["runtimes"]:
            print(f"{name} runtime: {costs.action_s * 1e6:.1f} us per action, {costs.step_s * 1e6:.1f} us per step, "
                  f"per layer x{costs.layer_host:.3f} of hw's runner's, {costs.p2p_s * 1e6:.1f} us per message, "
                  f"{costs.batch_s * 1e6:.1f} us per batch posted, {costs.after_backward_s * 1e6:.1f} us per "
                  f"forward after a backward"
                  + (f" (unmeasured: {', '.join(costs.unmeasured)})" if costs.unmeasured else ""))
    if "graphs" in samples:
        from hw.calibrate.graphs_runtime import report_lines

        print("\n".join(report_lines(samples["graphs"])))
    return 0


def _tp_collectives_only(args: argparse.Namespace, out: Path) -> int:
    """--tp-collectives: TP's collectives over --gpus GPUs (all visible by default), added to --base."""
    from hw.calibrate.tp_collectives import calibrate_tp_collectives

    world = args.gpus or (2 if args.cpu else torch.cuda.device_count())
    if world < 2:
        raise ParsimError(f"--tp-collectives times collectives between GPUs: it needs --gpus 2 or more, got {world}")
    require_gpus(world, cpu=args.cpu)
    return calibrate_tp_collectives(load_profile(args.base), out, world, args.cpu)


def _spread_meta(spread: dict) -> dict:
    """The rank spread's provenance: its excess on how many ranks, per probed schedule (hw.calibrate.rank_spread)."""
    return {"excess": spread["excess"], "ranks": spread["rows"][0]["ranks"], "by": "hw.calibrate.rank_spread",
            "excess_by_schedule": {r["schedule"]: r["excess"] for r in spread["rows"]}}


def _torch_costs(profile: Profile, cpu: bool, gpus: int, host_steps: list[dict]) -> tuple:
    from hw.calibrate.torch_runtime import measure

    return measure(profile.host.p2p_s, "cpu" if cpu else "cuda", gpus, host_steps, profile.host.grad_add_s)


# runtime -> (profile, cpu, gpus, host-step rows) -> (RuntimeCosts, samples, fits, meta)
RUNTIME_COSTS = {"torch": _torch_costs}


def _runtime_names(text: str) -> list[str]:
    """--runtimes: those with a calibration here (hw's runner's costs are the profile's own, always measured)."""
    names = [n.strip() for n in text.split(",") if n.strip() and n.strip() != "hw"]
    unknown = [n for n in names if n not in RUNTIME_PROBES]
    if unknown:
        raise ParsimError(f"no calibration for runtime(s) {', '.join(unknown)}; --runtimes takes: "
                          f"{', '.join(['hw', *RUNTIME_PROBES])}")
    return list(dict.fromkeys(names))


def runtime_costs(profile: Profile, base: Profile, names: list[str], fits: dict[str, Fit], cpu: bool,
                  gpus: int | None, host_steps: list[dict]) -> tuple[Profile, dict, dict]:
    """The profile with each named runtime's host costs measured where RUNTIME_COSTS measures them (its fits added
    to `fits`; calibrate itself measures the graphed ones), and the base's other runtimes carried, every field
    marked unmeasured; the raw samples and provenance per runtime."""
    count = gpus or (0 if cpu else torch.cuda.device_count())
    every = tuple(f.name for f in dataclasses.fields(RuntimeCosts) if f.name != "unmeasured")
    carried = {k: dataclasses.replace(v, unmeasured=every) for k, v in base.runtimes.items()
               if k not in names and k not in profile.runtimes}
    measured, samples, meta = {}, {}, {k: "carried from the base profile" for k in carried}
    for name in (n for n in names if n in RUNTIME_COSTS):
        measured[name], samples[name], runtime_fits, meta[name] = RUNTIME_COSTS[name](profile, cpu, count, host_steps)
        fits |= runtime_fits
        theirs = base.runtimes.get(name)  # a message's cost it could not measure: the base's own measurement of it
        if "p2p_s" in measured[name].unmeasured and theirs is not None and "p2p_s" not in theirs.unmeasured:
            measured[name] = dataclasses.replace(measured[name], p2p_s=theirs.p2p_s)
    return dataclasses.replace(profile, runtimes={**carried, **profile.runtimes, **measured}), samples, meta






def calibrate(base: Profile, hidden: list[int], cpu: bool, gpus: int | None, conv: bool = False,
              transformers: list[Model] | None = None, runtimes: list[str] | tuple[str, ...] = (),
              ) -> tuple[Profile, dict, dict[str, Fit]]:
    """Measure this machine (the module docstring's steps 1-6): the profile, its raw samples and every fit."""
    device = torch.device("cpu") if cpu else torch.device("cuda", 0)
    dtype = torch.float32 if cpu else torch.bfloat16
    tokens = [64, 256, 1024] if cpu else [128, 256, 512, 1024, 2048, 4096, 8192, 16384]
    hidden = [64, 128] if cpu else hidden
    shapes = conv_layers(cpu) if conv else []
    images = [2, 8, 32] if cpu else [4, 16, 64, 256]  # 256 images in 1-64 micro-batches: 4-256 per micro-batch
    steps = len(hidden) * len(tokens) + len(shapes) * len(images) + 4 + (len(CONV_KINDS) if conv else 0)
    if transformers:
        steps += calibrate_transformer.steps(transformers, cpu)
    with tqdm(total=steps, desc="calibrating", file=sys.stderr, disable=None) as progress:  # drawn on a terminal only
        layer_rows = layer_samples(device, dtype, [Layer("mlp", h) for h in hidden], tokens, progress)
        layer_rows += layer_samples(device, dtype, shapes, images, progress)
        host_rows = {"mlp": host_samples(device, dtype, split=True)}
        spans, _, fits = host_costs(host_rows["mlp"])
        grad_add_s, grad_add_rows = grad_add_host(device, dtype)
        step_rows = host_steps.probe_rows("cpu" if cpu else "cuda", "fp32" if cpu else "bf16", "torch" in runtimes)
        level = host_steps.hw_level(step_rows, spans["forward_s"] + spans["backward_s"], grad_add_s)
        host, fits["host hw whole steps"] = host_steps.leveled(spans, level), level.fit
        if level.recompute is not None:
            fits["host hw recompute"] = level.recompute.fit
        progress.update()
        hosts = {"mlp": host}
        for kind in CONV_KINDS if conv else ():  # a conv block issues other kernels than an MLP block
            host_rows[kind] = host_samples(device, dtype, kind, microbatches=4 if cpu else 16)
            hosts[kind], _, kind_fits = host_costs(host_rows[kind])
            fits |= {name.replace("host", f"host {kind}", 1): f for name, f in kind_fits.items()}
            progress.update()
        layers, layer_fits = fitted_costs(layer_rows, hosts)
        stage_rows = stage_probe.stage_samples(device, dtype, hidden, graphed="graphs" in runtimes,
                                               steps=3 if cpu else 8)
        layers = stage_probe.stage_corrections(layers, stage_rows)
        progress.update()
        if transformers:
            more, more_fits, transformer_samples = calibrate_transformer.calibrate_transformer(
                transformers, device, dtype, cpu, progress)
            layers, layer_fits = layers | more, layer_fits | more_fits
        load = in_step_slowdowns(layers, base, device, dtype,
                                 {"transformer": calibrate_transformer.in_step_model(transformers)} if transformers
                                 else None)
        for family in STAGED & load.keys():
            load[family]["applied"] = False
        layers = stretched(layers, load)
        fits |= layer_fits
        layers, fallbacks = fall_back(layers, layer_fits, None if cpu else base, gpu=not cpu)
        autograd_add, add_rows = autograd_accumulate(device, dtype, hidden, cpu)
        fits["autograd add"] = add_rows["fit"]
        copy_sizes = [1 << k for k in range(12, 30 if not cpu else 21, 2)]  # 4 KiB .. 256 MiB
        links, link_fits, copy_rows = copy_links(device, copy_sizes)
        progress.update()
        op_costs = measure_all(device, quick=cpu)
        resident, resident_rows = resident_comm(device, cpu, base)
        progress.update()
    fits |= {f"link {k}": f for k, f in link_fits.items()}
    links = {**{k: dataclasses.replace(v, measured=False) for k, v in base.links.items()}, **links}
    collectives = {k: dataclasses.replace(v, measured=False) for k, v in base.collectives.items()}
    samples = {"layers": layer_rows, "stages": stage_rows, "in_step_slowdown": load, "host": host_rows.pop("mlp"),
               "copies": copy_rows,
               "op_costs": op_costs, "host_steps": step_rows, "host_level": dataclasses.asdict(level),
               "autograd_accumulate": add_rows["rows"], "grad_add_host": grad_add_rows,
               "fallbacks": [dataclasses.asdict(f) for f in fallbacks]}
    if conv:
        samples["host_by_kind"] = host_rows
    if transformers:
        samples["transformer"] = transformer_samples
    count = gpus or (0 if cpu else torch.cuda.device_count())
    p2p_s = base.host.p2p_s
    rank_spread = 0.0
    dtensor = TpHost(0.0, 0.0, {})  # uncalibrated on one GPU
    if count >= 2:
        sizes = [1 << k for k in range(12, 29 if not cpu else 21, 2)]
        nvlink, allreduce, gpu_fits, raw = gpu_links(count, "cpu" if cpu else "cuda", sizes)
        p2p_s = statistics.median(raw.post_s)
        links["nvlink"], collectives["allreduce"] = nvlink, allreduce
        fits |= {f"link {k}": f for k, f in gpu_fits.items()}
        samples["gpu_links"] = dataclasses.asdict(raw)
        tp_specs, tp_fits, samples["tp_collectives"] = tp_collectives(count, cpu)
        dtensor, samples["tp_host"] = tp_host(count, cpu)
        samples["tp_host_fit"] = dataclasses.asdict(dtensor)
        collectives |= tp_specs
        fits |= {f"link {k}": f for k, f in tp_fits.items()}
        rank_spread, samples["rank_spread"] = measure_rank_spread(count, "cpu" if cpu else "cuda",
                                                                  "fp32" if cpu else "bf16")
    # one visible GPU says nothing of the node: its size comes from the base, like the links it cannot measure
    node = count if count >= 2 and not cpu else base.gpus_per_node
    samples["carried"] = ([] if count >= 2 else ["host.p2p_s"]) + ([] if node == count else ["gpus_per_node"]) \
        + [f"layers.{f.key}.{f.op}" for f in fallbacks if f.used == "base"] \
        + (["resident_comm"] if resident_rows is None and resident is not None else [])
    if resident_rows is not None:
        samples["resident_comm"] = resident_rows
    profile = Profile(node, links, HostCosts(level.action_s, p2p_s, step_s=level.step_s,
                                             split_backward_s=host.get("split_backward_s", 0.0), grad_add_s=grad_add_s,
                                             after_backward_s=level.after_backward_s, rank_spread=rank_spread,
                                             tp_forward_s=dtensor.forward_s, tp_backward_s=dtensor.backward_s,
                                             **level.recompute_costs()),
                      layers, collectives=collectives, resident_comm=resident)
    if "graphs" in runtimes:
        from hw.calibrate.graphs_runtime import calibrate_graphs

        graphs, samples["graphs"], graph_fits = calibrate_graphs(device, dtype, profile, hidden, spans,
                                                                 p2p_carried=count < 2, rows=stage_rows)
        profile, fits = dataclasses.replace(profile, runtimes={**profile.runtimes, **graphs}), fits | graph_fits
    profile, carried = carry_failed(with_op_costs(profile, op_costs), fits, None if cpu else base)
    samples["fallbacks"] += [dataclasses.asdict(f) for f in carried]
    samples["carried"] += [f.key for f in carried if f.used == "base" and not f.key.startswith("link ")]
    return dataclasses.replace(profile, kernels={**profile.kernels, AUTOGRAD_ACCUMULATE: autograd_add}), samples, fits


def resident_comm(device: torch.device, cpu: bool, base: Profile) -> tuple[ResidentComm | None, dict | None]:
    """Compute's speed beside a waiting kernel (hw.calibrate.resident) and its raw times, on a GPU with Triton;
    elsewhere the base profile's, carried (None for the times)."""
    if cpu:
        return base.resident_comm, None
    try:
        import triton  # noqa: F401
    except ImportError:
        return base.resident_comm, None
    from hw.calibrate.resident import measure

    return measure(device)






def _driver() -> str | None:
    try:
        import subprocess

        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return None


def _report(fits: dict[str, Fit], out: Path, samples: Path) -> None:
    print(f"{'fit':<28} {'fixed':>10} {'rate':>12} {'R^2':>8} {'worst':>7}")
    for name, f in fits.items():
        flag = "  POOR FIT" if f.poor else ""
        rate = (f"{1e6 / f.rate:>8.2f}us/L" if name.startswith("host")  # host: per call + per layer
                else f"{f.rate:>10.3g}{'B' if name.startswith('link') or name.endswith(' add') else 'F'}")
        print(f"{name:<28} {f.fixed_s * 1e6:>8.2f}us {rate} {f.r2:>8.4f} {f.max_rel_residual:>6.1%}{flag}")
    print(f"wrote {out} and {samples}")
