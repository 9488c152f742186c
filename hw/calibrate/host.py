"""The host's cost per layer and per action, timed around the actions of hw's own runner on tiny layers."""

from __future__ import annotations

import statistics

import numpy as np
import torch

from hw.calibrate.fit import Fit, fit_affine
from hw.run.observers import HostSpans
from hw.run.ranks import host_pinned
from hw.run.stage_runner import StageRunner, StepIO, local_runner
from hw.timing import median_s, sync
from parsim.workload import Layer, Model, mlp_model

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
    """Host time of forward and backward actions in hw's own runner, on stages of k tiny layers of `kind`.

    Tiny layers leave the GPU idle, so a span around each action is the host's cost of it, in a real step's code
    path; the depths take turns, a step each per round, so the host's drift does not bend the slope. Also an
    input-grad call alone per layer (unless not grad_calls), to split the backward's share; with split, a one-stage
    ZB-H1 step per depth in the same rounds (hw's split path). probes: (layers, stage model) to time instead."""
    from parsim.schedules import Op, gpipe, zb_h1

    stages = probes or [(k, host_stage(kind, k, 8 * microbatches)) for k in HOST_DEPTHS[kind]]
    runs: list[tuple[int, Model, StageRunner, StepIO, HostSpans]] = []
    for k, model in stages:
        for schedule in [gpipe(1, microbatches)] + ([zb_h1(1, microbatches)] if split else []):
            runner, io = local_runner(model, schedule, device, dtype)
            for _ in range(3):
                runner.step(io)
            runs.append((k, model, runner, io, HostSpans()))
    with host_pinned(device, 0):  # as hw measure times its steps
        for _ in range(rounds):
            for *_, runner, io, spans in runs:
                runner.step(io, spans)
    sync(device)
    rows: list[dict] = []
    for k, model, runner, _, spans in runs:
        if spans.of(Op.BACKWARD_WEIGHT):  # the split probe of the depth just above
            rows[-1]["split_s"] = sum(statistics.median(spans.of(op)) for op in
                                      (Op.FORWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT))
            continue
        rows.append({"layers": k, "forward_s": statistics.median(spans.of(Op.FORWARD)),
                     "backward_s": statistics.median(spans.of(Op.BACKWARD))})
        if grad_calls:
            rows[-1] |= _grad_calls(runner, model, device, dtype)
    return rows


def _grad_calls(runner: StageRunner, model: Model, device: torch.device, dtype: torch.dtype) -> dict[str, float]:
    """Host time of an input-grad alone and of a full backward of the runner's first stage, on 8 rows."""
    x = torch.randn(8, *model.layers[0].in_shape, device=device, dtype=dtype, requires_grad=True)
    y = runner.stages[0](x)
    g = torch.randn_like(y)
    return {"input_grad_call_s": median_s(lambda: torch.autograd.grad(y, [x], g, retain_graph=True),
                                          device, repeat=10),
            "full_grad_call_s": median_s(lambda: torch.autograd.backward(y, g, retain_graph=True),
                                         device, repeat=10)}


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
