"""`python -m hw calibrate`: measure this machine and write a parsim profile, with the raw samples.

What it measures, each alone and with the GPU's own clock where the GPU is what is timed:
  1. per layer (MlpBlock; with --conv also ConvBlock and DownBlock at each shape of the conv net; with
     --transformer attention, decoder blocks, embeddings and heads: hw/calibrate_transformer.py): forward,
     input-grad and full-backward GPU time over micro-batch sizes (weight-grad = full - input-grad), fitted
     to fixed_s + flops / flops_per_s per kind and per shape;
  2. the host: per layer (of each kind) and per action, from host timers around the actions of hw's own executor;
     for MLP blocks the level (per layer, per action, per step) from whole steps timed as hw measure does
     (hw.host_steps), the timers giving each op's share;
  3. host<->device copies, pinned and pageable, both directions (latency + bytes / bandwidth);
  4. the scenarios' costs: one op's launch, a sync, elementwise and matmul kernels;
  5. with >= 2 GPUs: NCCL send/recv between GPU 0 and 1 and an all-reduce over all GPUs;
  6. with --runtimes graphs: the CUDA-graphed runtimes' host and GPU costs (hw.graphcosts).
What it cannot measure here (fewer GPUs, no second node) is copied from --base and marked so.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import least_squares
from tqdm import tqdm

from hw.models import LAYER_KINDS
from hw.opcosts import gpu_time_s, measure_all, median_s, sync
from hw.workers import host_pinned, local_rank
from parsim import flags
from parsim.errors import ParsimError
from parsim.files import check_output
from parsim.profile import (AUTOGRAD_ACCUMULATE, CollectiveSpec, HostCosts, KernelCost, LayerCosts, LinkSpec, OpCost,
                            Profile, ResidentComm, RuntimeCosts, load_profile, samples_path, save_profile)
from parsim.scenarios import with_op_costs
from parsim.sim.dataparallel import DDP_BUCKET_BYTES
from parsim.workload import Layer, Model, conv_model, mlp_model

POOR_FIT = 0.15  # a fit whose worst relative residual passes this is reported as poor
RUNTIME_PROBES = {"torch": "torch.distributed.pipelining's host costs (hw.torch_costs, ~30 s)",
                  "graphs": "graphs and graphs-step: CUDA-graphed actions, or one graph per one-GPU step (~30 s)"}


@dataclasses.dataclass(frozen=True)
class Fit:
    fixed_s: float
    rate: float
    r2: float
    max_rel_residual: float

    @property
    def poor(self) -> bool:
        return self.max_rel_residual > POOR_FIT


def fit_affine(work: list[float], seconds: list[float]) -> Fit:
    """seconds ~ fixed_s + work / rate, least squares on relative residuals (sizes span decades)."""
    w, t = np.asarray(work, float), np.asarray(seconds, float)
    if len(w) < 2 or np.any(t <= 0):
        raise ParsimError("a fit needs at least two positive timings")

    def residuals(p: np.ndarray) -> np.ndarray:
        return (p[0] + w * p[1]) / t - 1

    slope0 = max((t[-1] - t[0]) / max(w[-1] - w[0], 1e-30), 1e-30)
    sol = least_squares(residuals, x0=[t.min() / 2, slope0], bounds=([0, 1e-30], [np.inf, np.inf]))
    fixed, per_unit = sol.x
    pred = fixed + w * per_unit
    r2 = 1 - np.sum((t - pred) ** 2) / max(np.sum((t - t.mean()) ** 2), 1e-300)
    return Fit(float(fixed), float(1 / per_unit), float(r2), float(np.max(np.abs(pred / t - 1))))


# --- 1. layers ---------------------------------------------------------------------------------

LEAD_CYCLES = 20_000_000  # a spin kernel of ~10 ms on an H200: longer than the host takes to queue what follows
IN_STEP_LEAD_CYCLES = 2_000_000  # ~1 ms: short beside a step, so the GPU stays as loaded as in hw measure
LAYER_DEPTH = 4  # layers per timing: each reads the one before's output where it can, as in a real stage
SUSTAINED_S = 0.25  # GPU-bound layer probes run this long back to back first: the clock a sustained step holds


def layer_samples(device: torch.device, dtype: torch.dtype, layers: list[Layer], tokens: list[int],
                  progress: tqdm) -> list[dict]:
    """GPU time of one layer's forward, input-grad and full backward, per (layer shape, samples).

    Timed through LAYER_DEPTH layers of the shape and divided: one layer fed the same input again and
    again keeps it in L2 and ran ~10% faster than the layers of a real step. Where the GPU, not the host, would
    set the pace, the probe runs back to back for SUSTAINED_S first and is timed so, at the clock of a GPU at its
    power cap (gpu_time_s): a step that keeps the GPU busy runs there, one fresh from idle ran ~10% faster. Layers whose output fits
    their input are chained, as in a stage; a downsampling block cannot be, so each copy gets its own input.
    """
    samples = []
    for layer in layers:
        blocks = [LAYER_KINDS[layer.kind](layer.hidden).to(device, dtype) for _ in range(LAYER_DEPTH)]
        params = [p for b in blocks for p in b.parameters()]
        chained = layer.in_shape == layer.out_shape
        stack = torch.nn.Sequential(*blocks)
        for n in tokens:
            xs = [torch.randn(n, *layer.in_shape, device=device, dtype=dtype, requires_grad=True)
                  for _ in range(1 if chained else LAYER_DEPTH)]

            def forward() -> list[torch.Tensor]:
                return [stack(xs[0])] if chained else [b(x) for b, x in zip(blocks, xs)]

            ys = forward()
            gs = [torch.randn_like(y) for y in ys]

            def per_layer(fn) -> float:
                return gpu_time_s(fn, device, batch=2, repeat=10, lead_cycles=LEAD_CYCLES,
                                  sustained_s=SUSTAINED_S) / LAYER_DEPTH

            fwd = per_layer(forward)
            input_grad = per_layer(lambda: torch.autograd.grad(ys, xs, gs, retain_graph=True))
            full = per_layer(lambda: torch.autograd.grad(ys, [*xs, *params], gs, retain_graph=True))
            samples.append({"kind": layer.kind, "key": layer.cost_key, "hidden": layer.hidden, "side": layer.side,
                            "tokens": n, "flops": layer.flops_per_token * n,
                            "forward_s": fwd, "backward_input_s": input_grad, "backward_s": full})
            progress.update()
    return samples


# layers per stage when timing the host: the slope is per layer, the rest per action; k downsampling blocks
# start on a 2^k map, so they stop at 4 to stay small
HOST_DEPTHS = {"mlp": (1, 2, 4, 8), "conv": (1, 2, 4, 8), "down": (1, 2, 3, 4)}


def host_stage(kind: str, layers: int, tokens: int) -> Model:
    """A stage of `layers` tiny layers of one kind, to time the host: MLP blocks of 64, conv blocks of 8
    channels on 4x4 maps, or downsampling blocks from 4 channels doubling to the last one's 1x1 map
    (from 2 input channels: torch's CPU convolution of a single channel is ~100x slower)."""
    if kind == "mlp":
        return mlp_model(layers, 64, tokens)
    if kind == "conv":
        return Model((Layer("conv", 8, side=4),) * layers, tokens)
    return Model(tuple(Layer("down", 4 << i, side=1 << (layers - 1 - i)) for i in range(layers)), tokens)


def host_samples(device: torch.device, dtype: torch.dtype, kind: str = "mlp", microbatches: int = 16,
                 rounds: int = 5, probes: list[tuple[int, Model]] | None = None, grad_calls: bool = True,
                 split: bool = False) -> list[dict]:
    """Host time of forward and backward actions in hw's own executor, stages of k tiny layers of `kind`.

    Tiny layers leave the GPU idle, so a perf_counter span around each action is the host's cost of
    it, in the very code path of a real step (one autograd call per action, its bookkeeping, the loss).
    The depths take turns, a step each per round: the lent VMs' host speed drifts within minutes
    (data/host-noise/), and a drift between one depth's steps and the next's would bend the slope.
    Also the host time of an input-grad alone per layer, to split the backward's share (unless not
    grad_calls). probes: (layers, stage model) to time instead of `kind`'s stages. With split, each depth also
    runs a one-stage ZB-H1 step in the same rounds: its forward, input-grad and weight-grad spans (hw's split path:
    forward hooks, a wider autograd.grad, one backward call per weighted module).
    """
    from hw.executor import local_runner
    from hw.measure import HostSpans
    from parsim.schedules import Op, gpipe, zb_h1

    stages = probes or [(k, host_stage(kind, k, 8 * microbatches)) for k in HOST_DEPTHS[kind]]
    probes = []
    for k, model in stages:
        for schedule in [gpipe(1, microbatches)] + ([zb_h1(1, microbatches)] if split else []):
            runner, io = local_runner(model, schedule, device, dtype)
            for step in range(3):
                runner.step(io)
            probes.append((k, model, runner, io, HostSpans()))
    with host_pinned(device, 0):  # as hw measure times its steps
        for _ in range(rounds):
            for k, model, runner, io, spans in probes:
                runner.step(io, spans)
    sync(device)
    rows = []
    for k, model, runner, io, spans in probes:
        if spans.of(Op.BACKWARD_WEIGHT):  # the split probe of the depth just above
            rows[-1]["split_s"] = sum(statistics.median(spans.of(op)) for op in
                                      (Op.FORWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT))
            continue
        rows.append({"layers": k, "forward_s": statistics.median(spans.of(Op.FORWARD)),
                     "backward_s": statistics.median(spans.of(Op.BACKWARD))})
        if not grad_calls:
            continue
        x = torch.randn(8, *model.layers[0].in_shape, device=device, dtype=dtype, requires_grad=True)
        y = runner.stages[0](x)
        g = torch.randn_like(y)
        rows[-1] |= {"input_grad_call_s": median_s(lambda: torch.autograd.grad(y, [x], g, retain_graph=True),
                                                   device, repeat=10),
                     "full_grad_call_s": median_s(lambda: torch.autograd.backward(y, g, retain_graph=True),
                                                  device, repeat=10)}
    return rows


def host_costs(rows: list[dict]) -> tuple[dict[str, float], float, dict[str, Fit]]:
    """Per-layer host cost of each op kind, and the per-action rest: slope and intercept over depth.

    The backward's per-layer slope is split into input-grad and weight-grad by their calls' timings.
    """
    depth = [r["layers"] for r in rows]
    fits = {k: fit_affine(depth, [r[k] for r in rows]) for k in ("forward_s", "backward_s")}
    forward, backward = (1 / fits[k].rate for k in ("forward_s", "backward_s"))
    share = statistics.median(min(r["input_grad_call_s"] / r["full_grad_call_s"], 1.0) for r in rows)
    per_layer = {"forward_s": forward, "backward_input_s": backward * share, "backward_s": backward}
    action_s = (fits["forward_s"].fixed_s + fits["backward_s"].fixed_s) / 2
    if all("split_s" in r for r in rows):  # what a split micro-batch costs per layer beyond a fused one
        fits["split_s"] = fit_affine(depth, [r["split_s"] for r in rows])
        per_layer["split_backward_s"] = max(1 / fits["split_s"].rate - forward - backward, 0.0)
    return per_layer, action_s, {f"host {k.removesuffix('_s')}": f for k, f in fits.items()}


GRAD_ADD_ROUNDS = 20


def grad_add_host(device: torch.device, dtype: torch.dtype, rounds: int = GRAD_ADD_ROUNDS) -> tuple[float, dict]:
    """The host's time per layer to add a backward's weight gradients into .grad (host.grad_add_s): autograd hands a
    step's first backward of a stage its gradients as they are (.grad is None), and makes each later one add them
    in, a kernel per parameter tensor (6 per MLP block). Stages of 1-8 tiny blocks (the GPU idle, so a span is the
    host's) take the first backward of a step with .grad cleared and with it kept, in turns, the order swapped each
    round; the per-layer cost is the slope over depth of the medians' difference."""
    from hw.executor import local_runner
    from hw.measure import HostSpans
    from parsim.schedules import Op, gpipe

    probes = []
    for k in HOST_DEPTHS["mlp"]:
        runner, io = local_runner(host_stage("mlp", k, 16), gpipe(1, 2), device, dtype)
        params = [p for module in runner.stages.values() for p in module.parameters()]
        runner.step(io)
        probes.append((k, runner, io, params))
    spans: dict[tuple[int, bool], list[float]] = {(k, fresh): [] for k, *_ in probes for fresh in (True, False)}
    with host_pinned(device, 0):  # as hw measure times its steps
        for r in range(rounds):
            for k, runner, io, params in probes:
                for fresh in (r % 2 == 0, r % 2 == 1):
                    if fresh:
                        for p in params:
                            p.grad = None
                    timer = HostSpans(lambda action: action.op == Op.BACKWARD)
                    runner.step(io, timer)
                    spans[k, fresh].append(timer.spans[0][1])
    sync(device)
    rows = [{"layers": k, "fresh_s": statistics.median(spans[k, True]),
             "adding_s": statistics.median(spans[k, False])} for k, *_ in probes]
    extra = [r["adding_s"] - r["fresh_s"] for r in rows]
    slope = float(np.polyfit([r["layers"] for r in rows], extra, 1)[0])
    return max(slope, 0.0), {"rows": rows, "per_layer_s": slope}


def in_step_gpu_s(model: Model, device: torch.device, dtype: torch.dtype) -> float:
    """GPU time of one micro-batch's forward plus backward of `model` inside hw's real step on one GPU.

    CUDA events around the actions of hw's own executor, over ~1 s of steps: at the clocks of a GPU
    under sustained load, with whatever a real step adds to the layers' kernels.
    """
    from hw.executor import local_runner
    from hw.measure import ActionTimer
    from parsim.schedules import gpipe

    runner, io = local_runner(model, gpipe(1, 1), device, dtype)
    timer = ActionTimer(device)
    for step in range(25):
        for p in runner.stages[0].parameters():
            p.grad = None
        if step >= 15:  # a ~1 ms spin first, so the host has queued the first layer before the GPU gets to it:
            torch.cuda._sleep(IN_STEP_LEAD_CYCLES)  # the spans time the GPU alone; the model adds the host's lead
        runner.step(io, timer if step >= 15 else None)
    sync(device)
    return sum(statistics.median(v) for v in timer.seconds().values())


IN_STEP_MODELS = {"mlp": lambda: mlp_model(16, 2048, 8192), "conv": lambda: conv_model()}  # one per family
FAMILY = {"mlp": "mlp", "conv": "conv", "down": "conv"}  # layer kind -> the model its slowdown is timed on
FAMILY |= {kind: "transformer" for kind in ("llama", "gpt", "attention", "embed", "head")}  # timed on --transformer's


def _family(cost_key: str) -> str:
    """The model family of a profile cost key ("mlp@2048" -> "mlp", "down@128x28" -> "conv")."""
    return FAMILY[cost_key.split("@")[0]]


def in_step_slowdowns(costs: dict[str, LayerCosts], base: Profile, device: torch.device, dtype: torch.dtype,
                      models: dict[str, Model] | None = None) -> dict[str, dict]:
    """Per model family, how much slower its layers run inside hw's real step than the fitted costs say.

    The fits come from short probes fresh from idle; in a step the GPU is under sustained load and the
    layers' kernels meet each other's data (its clock mostly stays at its maximum: not a clock drop). On an H200 MLP blocks ran 12% slower in
    situ than their fits, conv blocks about 3% (data/validation/h200-2026-11-23-gpu-spans.json).
    Every layer cost of the family is stretched by its factor; 1 on the CPU. models: a family's model, where
    not IN_STEP_MODELS' (the transformer's comes from --transformer).
    """
    from parsim.workload import stage_costs

    out = {}
    for family in sorted({_family(k) for k in costs}):
        if device.type != "cuda":
            out[family] = {"factor": 1.0}
            continue
        model = (models or {}).get(family) or IN_STEP_MODELS[family]()
        fitted = stage_costs(model, 1, 1, dataclasses.replace(base, layers=costs))[0]
        in_step = in_step_gpu_s(model, device, dtype)
        out[family] = {"model": model.name, "fitted_s": fitted.forward.gpu_s + fitted.backward.gpu_s,
                       "in_step_s": in_step}
        out[family]["factor"] = max(in_step / out[family]["fitted_s"], 1.0)
    return out


def stretched(costs: dict[str, LayerCosts], slowdowns: dict[str, dict]) -> dict[str, LayerCosts]:
    """Every layer's GPU cost times its family's in-step slowdown, where it is applied (not a check only)."""
    def op(cost: OpCost, f: float) -> OpCost:
        return dataclasses.replace(cost, fixed_s=cost.fixed_s * f, flops_per_s=cost.flops_per_s / f)

    out = {}
    for key, c in costs.items():
        slow = slowdowns[_family(key)]
        f = slow["factor"] if slow.get("applied", True) else 1.0
        out[key] = LayerCosts(op(c.forward, f), op(c.backward_input, f), op(c.backward_weight, f))
    return out


STAGED = {"mlp"}  # families whose costs follow hw's runner's own stages (hw.stage_probe): their slowdown is a check


def layer_costs(samples: list[dict], host: dict, corrected: bool = False) -> tuple[LayerCosts, dict[str, Fit]]:
    """Per-layer op costs: host from `host`, GPU from affine fits (before any in-step slowdown); with `corrected`
    (the samples are of one shape), each sample's time over its fit, so that the cost follows the samples."""
    flops = [s["flops"] for s in samples]
    seconds = {"forward": [s["forward_s"] for s in samples],
               "backward_input": [s["backward_input_s"] for s in samples],
               "backward_weight": [max(s["backward_s"] - s["backward_input_s"], 1e-9) for s in samples]}
    fits = {op: fit_affine(flops, t) for op, t in seconds.items()}
    hosts = {"forward": host["forward_s"], "backward_input": host["backward_input_s"],
             "backward_weight": max(host["backward_s"] - host["backward_input_s"], 0.0)}

    def corrections(op: str) -> tuple[tuple[float, float], ...]:
        fit, by_flops = fits[op], sorted(zip(flops, seconds[op]))
        return tuple((w, t / (fit.fixed_s + w / fit.rate)) for w, t in by_flops) if corrected else ()

    costs = LayerCosts(*(OpCost(hosts[k], fits[k].fixed_s, fits[k].rate, corrections(k))
                         for k in ("forward", "backward_input", "backward_weight")))
    return costs, fits


def fitted_costs(rows: list[dict], host: dict[str, dict]) -> tuple[dict[str, LayerCosts], dict[str, Fit]]:
    """Costs per kind over all its shapes ("conv") and per shape ("conv@64x56"): small kernels run far
    below the large ones' rate. host: per-layer host costs by kind."""
    costs, fits = {}, {}
    for kind in dict.fromkeys(r["kind"] for r in rows):
        of_kind = [r for r in rows if r["kind"] == kind]
        groups = {kind: of_kind, **{key: [r for r in of_kind if r["key"] == key]
                                    for key in dict.fromkeys(r["key"] for r in of_kind)}}
        for key, group in groups.items():
            costs[key], key_fits = layer_costs(group, host[kind], corrected=key != kind)
            fits |= {_fit_name(kind, key, op): f for op, f in key_fits.items()}
    return costs, fits


def _fit_name(kind: str, key: str, op: str) -> str:
    """MLP fits keep their names ("forward", "forward@2048"); the others read "conv forward", "conv@64x56 forward"."""
    if kind == "mlp":
        return op if key == kind else f"{op}@{key.removeprefix('mlp@')}"
    return f"{key} {op}"


# --- 3. host <-> device copies -------------------------------------------------------------------

def copy_links(device: torch.device, sizes: list[int]) -> tuple[dict[str, LinkSpec], dict[str, Fit], dict]:
    """Latency and bandwidth of copies to and from pinned and pageable host memory."""
    links, fits, samples = {}, {}, {}
    for pinned in (True, False):
        for direction in ("h2d", "d2h"):
            name = f"{direction}_{'pinned' if pinned else 'pageable'}"
            rows = []
            for n in sizes:
                host = torch.ones(n, dtype=torch.uint8, pin_memory=pinned and device.type == "cuda")  # touched
                dev = torch.empty(n, dtype=torch.uint8, device=device)
                src, dst = (host, dev) if direction == "h2d" else (dev, host)
                rows.append({"bytes": n, "seconds": median_s(lambda: dst.copy_(src, non_blocking=True), device,
                                                               repeat=10)})
            fit = fit_affine([r["bytes"] for r in rows], [r["seconds"] for r in rows])
            links[name], fits[name], samples[name] = LinkSpec(fit.fixed_s, fit.rate), fit, rows
    return links, fits, samples


# --- 5. GPU to GPU -----------------------------------------------------------------------------

BESIDE_ROUNDS = 5  # turns of the compute-beside-all-reduce probe's three timings
BESIDE_PIECES = 16  # all-reduces of DDP's 25 MiB bucket in the probe (on the CPU: of 64 KiB)
BESIDE_MATMULS = 40  # 4096^3 bf16 matmuls in its compute, ~3-4x the all-reduce on H100s over NVLink


def _allreduce_beside(device: torch.device) -> dict[str, list[float]]:
    """Seconds of a run of matmuls alone, of DDP-sized all-reduces alone and of both with the all-reduces issued first
    on a stream of their own (as much overlap as the GPU allows), in turns; every rank runs each."""
    import torch.distributed as dist

    from hw.data_parallel import beside

    gpu = device.type == "cuda"
    n, dtype = (4096, torch.bfloat16) if gpu else (64, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    pieces = [torch.ones((DDP_BUCKET_BYTES if gpu else 64 << 10) // 4, device=device) for _ in range(BESIDE_PIECES)]
    side = torch.cuda.Stream(device) if gpu else None

    def compute() -> None:
        for _ in range(BESIDE_MATMULS):
            a @ a

    def reduce() -> None:
        for piece in pieces:
            dist.all_reduce(piece)

    def both() -> None:
        beside(reduce, compute, side)

    out: dict[str, list[float]] = {"compute": [], "allreduce": [], "beside": []}
    for k in range(BESIDE_ROUNDS + 1):  # the first round warms up
        for name, run in (("compute", compute), ("allreduce", reduce), ("beside", both)):
            dist.barrier()
            sync(device)
            t0 = time.perf_counter()
            run()
            sync(device)  # a device-wide sync: the side stream too
            if k:
                out[name].append(time.perf_counter() - t0)
    return out


def compute_share(beside: dict[str, list[float]]) -> float:
    """The share of an all-reduce's time that compute beside it loses, from _allreduce_beside's medians: (both -
    compute alone) / all-reduce alone, within [0, 1]."""
    m = {k: statistics.median(v) for k, v in beside.items()}
    return min(1.0, max(0.0, (m["beside"] - m["compute"]) / m["allreduce"]))


def _p2p_worker(rank: int, world: int, device: torch.device, sizes: list[int]) -> dict:
    """Ping-pong between ranks 0 and 1 (one-way time = half the round trip); all-reduce over all, and beside
    compute."""
    import torch.distributed as dist

    out = {"p2p": [], "allreduce": [], "post_s": _p2p_host_s(rank, device), "beside": _allreduce_beside(device)}
    for n in sizes:
        buf = torch.ones(max(n // 4, 1), device=device)
        for k in range(13):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            sync(device)
            if k >= 3 and rank == 0:
                out["p2p"].append({"bytes": n, "seconds": (time.perf_counter() - t0) / 2})
        for k in range(13):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            sync(device)
            if k >= 3 and rank == 0:
                out["allreduce"].append({"bytes": n, "seconds": time.perf_counter() - t0})
    return out


def _p2p_host_s(rank: int, device: torch.device) -> list[float]:
    """Host time of each send and receive action in hw's own executor: ranks 0 and 1 run a tiny 1F1B."""
    import torch.distributed as dist

    from hw.executor import StageRunner, channel_groups, make_batch, split_batch, stage_modules
    from hw.measure import HostSpans
    from parsim.schedules import one_f_one_b
    from parsim.workload import mlp_model

    m = 16
    schedule, model = one_f_one_b(2, m), mlp_model(2, 64, 8 * m)
    channels = channel_groups(schedule)  # every rank joins the group calls
    spans = HostSpans(keep=lambda action: not action.is_compute)
    if rank < 2:
        runner = StageRunner(schedule, rank, stage_modules(model, schedule, rank, device, torch.float32), channels)
        io = split_batch(*make_batch(model, device, torch.float32), m)
        for k in range(3):
            runner.step(io)
            sync(device)
        with host_pinned(device, local_rank(rank)):  # as hw measure times its steps
            for k in range(5):
                runner.step(io, spans)
                sync(device)
    dist.barrier()
    return [seconds for _, seconds in spans.spans]


def gpu_links(world: int, device: str, sizes: list[int]) -> tuple[LinkSpec, CollectiveSpec, dict, dict]:
    from hw.workers import spawn

    raw = spawn(_p2p_worker, world, (sizes,), device, timeout_s=60, deadline_s=300)[0]

    def medians(rows: list[dict]) -> tuple[list[int], list[float]]:
        by = {}
        for r in rows:
            by.setdefault(r["bytes"], []).append(r["seconds"])
        return list(by), [statistics.median(v) for v in by.values()]

    p2p = fit_affine(*medians(raw["p2p"]))
    b, t = medians(raw["allreduce"])
    ring = 2 * (world - 1) / world  # all-reduce time = latency + ring * n / busbw
    ar = fit_affine([ring * x for x in b], t)
    return (LinkSpec(p2p.fixed_s, p2p.rate), CollectiveSpec(ar.fixed_s, ar.rate, compute_share=compute_share(
            raw["beside"])), {"nvlink": p2p, "allreduce": ar}, raw)


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
    p.add_argument("--runtimes", default="", metavar="NAME,...",
                   help="also the costs of these pipeline runtimes besides hw's runner (profile.runtimes): "
                        f"{', '.join(f'{n}: {what}' for n, what in RUNTIME_PROBES.items())}")


def main(args: argparse.Namespace) -> int:
    out = check_output(args.out, "--out")
    check_output(samples_path(out), "the samples beside --out")
    if out.exists() and not args.force:
        raise ParsimError(f"{out} exists; pass --force to overwrite it, or choose another --out")
    if args.interfaces:
        from hw.interface_costs import calibrate_interfaces

        return calibrate_interfaces(load_profile(args.base), out, args.cpu)
    if not args.cpu and not torch.cuda.is_available():
        raise ParsimError("no CUDA GPU is visible; calibrate on a GPU machine, or pass --cpu for a small CPU run")
    if args.cpu:  # tiny probes gain nothing from more threads; on a busy machine their spinning made it 10x slower
        torch.set_num_threads(1)
    hidden = args.hidden
    base = load_profile(args.base)
    transformers = None
    if args.transformer:
        from hw.calibrate_transformer import parse_models

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
            "driver": _driver(), "fits": {k: dataclasses.asdict(f) for k, f in fits.items()},
            "in_step_slowdown": samples["in_step_slowdown"], "runtimes": runtime_meta,
            "carried_from_base": [n for n, link in profile.links.items() if not link.measured]
            + [n for n, c in profile.collectives.items() if not c.measured] + samples["carried"]}
    memory = torch.cuda.get_device_properties(0).total_memory if not args.cpu else None
    profile = dataclasses.replace(profile, meta=meta, provisional=bool(meta["carried_from_base"]),
                                  gpu_memory_bytes=memory)
    save_profile(profile, out, {"meta": meta, "samples": samples})
    _report(fits, out, samples_path(out))
    for family, slow in samples["in_step_slowdown"].items():
        print(f"in-step slowdown of {family} layers x{slow['factor']:.3f} "
              + ("applied to their costs" if slow.get("applied", True)
                 else "(a check: their costs follow hw's runner's stages)"))
    print(f"adding gradients into .grad: {profile.host.grad_add_s * 1e6:.1f} us of host time per layer (a stage's "
          f"first backward of a step adds none)")
    for name, costs in profile.runtimes.items():
        if name in samples["runtimes"]:
            print(f"{name} runtime: {costs.action_s * 1e6:.1f} us per action, {costs.step_s * 1e6:.1f} us per step, "
                  f"per layer x{costs.layer_host:.3f} of hw's runner's, {costs.p2p_s * 1e6:.1f} us per message"
                  + (f" (unmeasured: {', '.join(costs.unmeasured)})" if costs.unmeasured else ""))
    if "graphs" in samples:
        from hw.graphcosts import report_lines

        print("\n".join(report_lines(samples["graphs"])))
    return 0


def _torch_costs(profile: Profile, cpu: bool, gpus: int, host_steps: list[dict]) -> tuple:
    from hw.torch_costs import measure

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


def conv_layers(cpu: bool) -> list[Layer]:
    """The conv net's distinct layer shapes (`parsim --conv`); on the CPU a tiny net of the same kinds."""
    net = conv_model(widths=(4, 8), blocks=(1, 2), side=8) if cpu else conv_model()
    return list(dict.fromkeys(net.layers))


CONV_KINDS = ("conv", "down")


def calibrate(base: Profile, hidden: list[int], cpu: bool, gpus: int | None, conv: bool = False,
              transformers: list[Model] | None = None, runtimes: list[str] | tuple[str, ...] = (),
              ) -> tuple[Profile, dict, dict[str, Fit]]:
    from hw import host_steps
    from hw.stage_probe import stage_corrections, stage_samples

    device = torch.device("cpu") if cpu else torch.device("cuda", 0)
    dtype = torch.float32 if cpu else torch.bfloat16
    tokens = [64, 256, 1024] if cpu else [128, 256, 512, 1024, 2048, 4096, 8192, 16384]
    hidden = [64, 128] if cpu else hidden
    shapes = conv_layers(cpu) if conv else []
    images = [2, 8, 32] if cpu else [4, 16, 64, 256]  # 256 images in 1-64 micro-batches: 4-256 per micro-batch
    steps = len(hidden) * len(tokens) + len(shapes) * len(images) + 4 + (len(CONV_KINDS) if conv else 0)
    if transformers:
        from hw import calibrate_transformer

        steps += calibrate_transformer.steps(transformers, cpu)
    with tqdm(total=steps, desc="calibrating", file=sys.stderr) as progress:
        layer_rows = layer_samples(device, dtype, [Layer("mlp", h) for h in hidden], tokens, progress)
        layer_rows += layer_samples(device, dtype, shapes, images, progress)
        host_rows = {"mlp": host_samples(device, dtype, split=True)}
        spans, _, fits = host_costs(host_rows["mlp"])
        grad_add_s, grad_add_rows = grad_add_host(device, dtype)
        step_rows = host_steps.probe_rows("cpu" if cpu else "cuda", "fp32" if cpu else "bf16", "torch" in runtimes)
        level = host_steps.hw_level(step_rows, spans["forward_s"] + spans["backward_s"], grad_add_s)
        host, fits["host hw whole steps"] = host_steps.leveled(spans, level), level.fit
        progress.update()
        hosts = {"mlp": host}
        for kind in CONV_KINDS if conv else ():  # a conv block issues other kernels than an MLP block
            host_rows[kind] = host_samples(device, dtype, kind, microbatches=4 if cpu else 16)
            hosts[kind], _, kind_fits = host_costs(host_rows[kind])
            fits |= {name.replace("host", f"host {kind}", 1): f for name, f in kind_fits.items()}
            progress.update()
        layers, layer_fits = fitted_costs(layer_rows, hosts)
        stage_rows = stage_samples(device, dtype, hidden, graphed="graphs" in runtimes, steps=3 if cpu else 8)
        layers = stage_corrections(layers, stage_rows)
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
               "autograd_accumulate": add_rows["rows"], "grad_add_host": grad_add_rows}
    if conv:
        samples["host_by_kind"] = host_rows
    if transformers:
        samples["transformer"] = transformer_samples
    count = gpus or (0 if cpu else torch.cuda.device_count())
    p2p_s = base.host.p2p_s
    if count >= 2:
        sizes = [1 << k for k in range(12, 29 if not cpu else 21, 2)]
        nvlink, allreduce, gpu_fits, raw = gpu_links(count, "cpu" if cpu else "cuda", sizes)
        p2p_s = statistics.median(raw["post_s"])
        links["nvlink"], collectives["allreduce"] = nvlink, allreduce
        fits |= {f"link {k}": f for k, f in gpu_fits.items()}
        samples["gpu_links"] = raw
    # one visible GPU says nothing of the node: its size comes from the base, like the links it cannot measure
    node = count if count >= 2 and not cpu else base.gpus_per_node
    samples["carried"] = ([] if count >= 2 else ["host.p2p_s"]) + ([] if node == count else ["gpus_per_node"]) \
        + (["resident_comm"] if resident_rows is None and resident is not None else [])
    if resident_rows is not None:
        samples["resident_comm"] = resident_rows
    profile = Profile(node, links, HostCosts(level.action_s, p2p_s, step_s=level.step_s,
                                             split_backward_s=host.get("split_backward_s", 0.0), grad_add_s=grad_add_s),
                      layers, collectives=collectives, resident_comm=resident)
    if "graphs" in runtimes:
        from hw.graphcosts import calibrate_graphs

        graphs, samples["graphs"], graph_fits = calibrate_graphs(device, dtype, profile, hidden, spans,
                                                                 p2p_carried=count < 2, rows=stage_rows)
        profile, fits = dataclasses.replace(profile, runtimes={**profile.runtimes, **graphs}), fits | graph_fits
    profile = with_op_costs(profile, op_costs)
    return dataclasses.replace(profile, kernels={**profile.kernels, AUTOGRAD_ACCUMULATE: autograd_add}), samples, fits


def resident_comm(device: torch.device, cpu: bool, base: Profile) -> tuple[ResidentComm | None, dict | None]:
    """Compute's speed beside a waiting kernel (hw.resident) and its raw times, on a GPU with Triton; elsewhere the
    base profile's, carried (None for the times)."""
    if cpu:
        return base.resident_comm, None
    try:
        import triton  # noqa: F401
    except ImportError:
        return base.resident_comm, None
    from hw.resident import measure

    return measure(device)


ADD_LAYERS = 8  # MLP blocks per stage in the gradient-add probe


def autograd_accumulate(device: torch.device, dtype: torch.dtype, hidden: list[int], cpu: bool,
                        ) -> tuple[KernelCost, dict]:
    """What autograd's gradient accumulation costs the GPU: `.grad += g` over a stage of MLP blocks of each width,
    a kernel per parameter tensor, fitted to fixed + bytes / rate; the fixed part per layer (profile.kernels'
    AUTOGRAD_ACCUMULATE). Every micro-batch's backward after a stage's first adds so (m - 1 a step): on an H200
    they were 95 of a 497 ms step (16 blocks h=4096, 32 micro-batches; data/diagnose/h200-2026-11-24/)."""
    from hw.graphcosts import accumulate_samples

    layers = 2 if cpu else ADD_LAYERS
    rows = accumulate_samples(device, dtype, hidden, layers, graphed=False)
    fit = fit_affine([r["bytes"] for r in rows], [r["seconds"] for r in rows])
    return KernelCost(fit.fixed_s / layers, fit.rate), {"rows": rows, "fit": fit}


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
