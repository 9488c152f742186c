"""What the graphs runtimes cost (hw.run.cuda_graphs), measured for `hw calibrate --runtimes graphs`.

1. The host: spans around each action of a graphed runner on stages of 1-8 tiny layers, the GPU idle as
   calibrate times hw's runner: one launch per action (the intercept over depth, action_s) and what a
   layer adds (the slope, against hw's runner's per-layer cost: layer_host); the runner's own per-step
   work outside its actions, split into what precedes its first action (begin_s: the GPU waits for it) and the
   rest (step_s); and for one graph per step, the whole step's host time.
2. The GPU: the graphed stages of hw.calibrate.stage_probe (8 MLP blocks at each calibrated width, 128-8192 tokens),
   each action's time over the profile's eager cost of the same work: the ratios that price those shapes
   (gpu_ratios). For other shapes, the graphed times fitted to the profile's per-layer costs as a x their
   fixed part + b x their matmul part: gpu_fixed_scale = a / b, gpu_scale = b. What the graphs save against
   eager is reported point by point.
3. The gradient add: a stage's later gradient actions add their gradients into the step's (`.grad += g`,
   one foreach kernel in the graph); replayed alone for each width, fitted to fixed + bytes / rate
   (accumulate_s, accumulate_Bps). Autograd's add in the eager runners is calibrate's own
   (autograd_accumulate).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from scipy.optimize import least_squares

from hw.calibrate.fit import Fit, fit_affine, r_squared
from hw.calibrate.host import host_stage
from hw.calibrate.stage_probe import LEAD_CYCLES, stage_layers
from hw.nets.blocks import MlpBlock
from hw.run.cuda_graphs import GraphRunner, graph_maker, local_graph_runner
from hw.run.observers import HostSpans
from hw.run.ranks import host_pinned
from hw.run.stage_runner import StepIO, clear_grads
from hw.timing import gpu_time_s, sync
from parsim.profile import OpCost, Profile, RuntimeCosts
from parsim.schedules import Action, Op, gpipe
from parsim.workload import Layer, part_costs

HOST_DEPTHS = (1, 2, 4, 8)


@dataclasses.dataclass(frozen=True)
class ScaleFit:
    """measured ~ fixed_scale x the profile's fixed GPU time + flops_scale x its matmul time, over the points."""

    fixed_scale: float
    flops_scale: float
    r2: float
    max_rel_residual: float


def host_samples(device: torch.device, dtype: torch.dtype, microbatches: int = 16, rounds: int = 5) -> list[dict]:
    """Per depth: the median host span of a forward and a backward action, of the step outside its actions and of
    its part before the first action, and of a whole step under one graph per step. Depths take turns, a step each
    per round (the hosts drift)."""
    # per depth: its runners (a graph per action, one per step), spans, and the step's outside, before, whole times
    probes: list[tuple[int, tuple[tuple[GraphRunner, StepIO], tuple[GraphRunner, StepIO]], HostSpans, list[float],
                       list[float], list[float]]] = []
    for k in HOST_DEPTHS:
        model, schedule = host_stage("mlp", k, 8 * microbatches), gpipe(1, microbatches)
        runners = (local_graph_runner(model, schedule, device, dtype),
                   local_graph_runner(model, schedule, device, dtype, whole_step=True))
        for runner, io in runners:
            for _ in range(3):
                clear_grads(runner)
                runner.step(io)
        probes.append((k, runners, HostSpans(), [], [], []))
    sync(device)
    with host_pinned(device, 0):  # as hw measure times its steps
        for _ in range(rounds):
            for _, ((runner, io), (whole, whole_io)), spans, outside, before, wholes in probes:
                clear_grads(runner)
                first, done = FirstStart(spans), len(spans.spans)
                t0 = time.perf_counter()
                runner.step(io, first)
                outside.append(time.perf_counter() - t0 - sum(s for _, s in spans.spans[done:]))
                before.append(first.at - t0)
                sync(device)  # the graphs queue faster than tiny kernels run: keep the launch queue short
                clear_grads(whole)
                t0 = time.perf_counter()
                whole.step(whole_io)
                wholes.append(time.perf_counter() - t0)
                sync(device)
    return [{"layers": k, "forward_s": statistics.median(spans.of(Op.FORWARD)),
             "backward_s": statistics.median(spans.of(Op.BACKWARD)), "step_outside_s": statistics.median(outside),
             "step_before_s": statistics.median(before), "whole_step_s": statistics.median(wholes)}
            for k, _, spans, outside, before, wholes in probes]


class FirstStart:
    """An observer that passes every call on to `spans` and keeps the time the step's first action started."""

    def __init__(self, spans: HostSpans):
        self.spans, self.at = spans, math.nan

    def __call__(self, action: Action, phase: str) -> None:
        if phase == "start" and math.isnan(self.at):
            self.at = time.perf_counter()
        self.spans(action, phase)


def accumulate_samples(device: torch.device, dtype: torch.dtype, hidden: list[int], layers: int,
                       graphed: bool = True) -> list[dict]:
    """GPU time of one gradient add over a stage of `layers` MLP blocks of each width: as the graphed runner
    adds (one foreach kernel, replayed as a graph), or, not graphed, as autograd does (`.grad += g`, a kernel per
    parameter tensor)."""
    return [_accumulate_sample(device, dtype, h, layers, graphed) for h in hidden]


def _accumulate_sample(device: torch.device, dtype: torch.dtype, hidden: int, layers: int, graphed: bool) -> dict:
    """accumulate_samples' row of one width."""
    with torch.device("meta"):  # shapes only: no weights drawn
        shapes = [p.shape for p in MlpBlock(hidden).parameters()] * layers
    accs = [torch.zeros(s, device=device, dtype=dtype) for s in shapes]
    grads = [torch.full(s, 1e-3, device=device, dtype=dtype) for s in shapes]
    add: Callable[[], None]
    if graphed:
        maker = graph_maker(device)
        maker.warm_up(lambda: torch._foreach_add_(accs, grads))
        graph = maker.graph("add")
        graph.capture(lambda: torch._foreach_add_(accs, grads))
        add = graph.replay
    else:
        def add() -> None:
            for a, g in zip(accs, grads, strict=True):
                a.add_(g)
    moved = 3 * sum(g.numel() * g.element_size() for g in grads)  # read .grad and g, write .grad
    return {"hidden": hidden, "layers": layers, "tensors": len(shapes), "bytes": moved,
            "seconds": gpu_time_s(add, device, batch=4, repeat=5, lead_cycles=LEAD_CYCLES)}


def profile_parts(row: dict, profile: Profile) -> dict[str, tuple[float, float]]:
    """The profile's (fixed, matmul) GPU seconds of the row's stage: its forward, its backward, and both."""
    layer = Layer("mlp", row["hidden"])
    (part,) = layer.parts
    costs, flops = part_costs(profile, part), layer.flops_per_token * row["tokens"]
    ops = {"forward": (costs.forward,), "backward": (costs.backward_input, costs.backward_weight)}

    def split(c: OpCost) -> tuple[float, float]:  # the cost's GPU time at these FLOPs, in its fit's proportions
        fit = c.fixed_s + flops / c.flops_per_s
        return c.fixed_s * c.gpu_s(flops) / fit, flops / c.flops_per_s * c.gpu_s(flops) / fit

    parts = {op: tuple(row["layers"] * sum(x) for x in zip(*(split(c) for c in cs), strict=True))
             for op, cs in ops.items()}
    parts["step"] = tuple(a + b for a, b in zip(parts["forward"], parts["backward"], strict=True))
    return parts


def fit_scales(points: list[tuple[float, float, float]]) -> ScaleFit:
    """(fixed_s, matmul_s, measured_s) points -> the two scales, least squares on relative residuals."""
    x = np.asarray(points, float)
    fixed, flops, t = x[:, 0], x[:, 1], x[:, 2]

    def residuals(p: np.ndarray) -> np.ndarray:
        return (p[0] * fixed + p[1] * flops) / t - 1

    sol = least_squares(residuals, x0=[1.0, 1.0], bounds=([0.0, 1e-6], [np.inf, np.inf]))
    pred = sol.x[0] * fixed + sol.x[1] * flops
    return ScaleFit(float(sol.x[0]), float(sol.x[1]), r_squared(t, pred), float(np.max(np.abs(pred / t - 1))))


def gpu_fits(rows: list[dict], profile: Profile) -> dict[str, ScaleFit]:
    """Per runtime, its measured GPU times against the profile's costs of the same work: graphs per action
    (forwards and backwards), graphs-step per step.

    Each graphed time is taken relative to eager's, timed in the same turns, and applied to the profile's
    cost: the scales say what graphing saves, not how this probe's conditions differ from the sustained
    step the profile's costs are stretched to (graphed and eager ran alike at large sizes, 0.99x, while
    the profile's in-step slowdown makes eager 16% slower than this probe's)."""
    graphs, step = [], []
    for r in rows:
        parts = profile_parts(r, profile)
        for op in ("forward", "backward"):
            graphs.append((*parts[op], r[f"graphs_{op}_s"] * sum(parts[op]) / r[f"eager_{op}_s"]))
        eager_step_s = r["eager_forward_s"] + r["eager_backward_s"]
        step.append((*parts["step"], r["graphs-step_s"] * sum(parts["step"]) / eager_step_s))
    return {"graphs": fit_scales(graphs), "graphs-step": fit_scales(step)}


def gpu_ratios(rows: list[dict], profile: Profile) -> dict[str, dict]:
    """Per runtime, per measured MLP shape and op, its measured GPU time over the profile's eager cost of the same
    work at each measured size (the graphed forward's and backward's per action, graphs-step's per step): the
    runtime is priced at those shapes by what its graphs were measured to take."""
    out: dict[str, dict] = {"graphs": {}, "graphs-step": {}}
    for r in rows:
        layer, parts = Layer("mlp", r["hidden"]), profile_parts(r, profile)
        flops = layer.flops_per_token * r["tokens"]
        step = r["graphs-step_s"] / sum(parts["step"])
        graphed = {op: r[f"graphs_{op}_s"] / sum(parts[op]) for op in ("forward", "backward")}
        for runtime, ratio in (("graphs", graphed), ("graphs-step", {"forward": step, "backward": step})):
            for op, value in ratio.items():
                out[runtime].setdefault(layer.cost_key, {}).setdefault(op, []).append((flops, value))
    return {runtime: {key: {op: tuple(sorted(points)) for op, points in ops.items()} for key, ops in shapes.items()}
            for runtime, shapes in out.items()}


def runtime_costs(host_rows: list[dict], scales: dict[str, ScaleFit], add_rows: list[dict], eager_per_layer_s: float,
                  p2p_s: float, p2p_carried: bool, ratios: dict[str, dict] | None = None,
                  ) -> tuple[dict[str, RuntimeCosts], dict[str, Fit], Fit]:
    """profile.runtimes["graphs"] and ["graphs-step"] from the samples, the host fits and the add's fit behind them;
    `ratios` (gpu_ratios) price the shapes measured, the scales the others.

    eager_per_layer_s is hw's runner's host cost of one layer's forward plus backward (layer_host's unit).
    """
    ratios = ratios or {}
    depth = [r["layers"] for r in host_rows]
    fits = {k: fit_affine(depth, [r[k] for r in host_rows])
            for k in ("forward_s", "backward_s", "step_outside_s", "step_before_s", "whole_step_s")}
    outside_s = fits["step_outside_s"].fixed_s
    begin_s = min(max(fits["step_before_s"].fixed_s, 0.0), outside_s)  # a part of the step outside its actions
    action_s = (fits["forward_s"].fixed_s + fits["backward_s"].fixed_s) / 2
    layer_host = (1 / fits["forward_s"].rate + 1 / fits["backward_s"].rate) / eager_per_layer_s
    add = fit_affine([r["bytes"] for r in add_rows], [r["seconds"] for r in add_rows])
    unmeasured = ("p2p_s",) if p2p_carried else ()  # messages: hw's runner's own code, as calibrated for it

    def costs(name: str, **host: Any) -> RuntimeCosts:
        s = scales[name]
        return RuntimeCosts(**host, gpu_scale=s.flops_scale, gpu_fixed_scale=s.fixed_scale / s.flops_scale,
                            accumulate_s=add.fixed_s, accumulate_Bps=add.rate, gpu_ratios=ratios.get(name, {}))

    runtimes = {"graphs": costs("graphs", action_s=action_s, p2p_s=p2p_s, layer_host=layer_host,
                                step_s=outside_s - begin_s, begin_s=begin_s, unmeasured=unmeasured),
                # one rank: no messages; the same batch copy before its one replay
                "graphs-step": costs("graphs-step", action_s=0.0, p2p_s=0.0, layer_host=0.0,
                                     step_s=max(fits["whole_step_s"].fixed_s - begin_s, 0.0),
                                     begin_s=min(begin_s, fits["whole_step_s"].fixed_s))}
    return runtimes, {f"host graphs {k.removesuffix('_s')}": f for k, f in fits.items()}, add


def calibrate_graphs(device: torch.device, dtype: torch.dtype, profile: Profile, hidden: list[int],
                     eager_host: dict[str, float], p2p_carried: bool, rows: list[dict],
                     ) -> tuple[dict[str, RuntimeCosts], dict, dict]:
    """Measure both graphs runtimes on this GPU against `profile` (this calibration's layers and hosts), their
    stages timed in `rows` (hw.calibrate.stage_probe, graphed): their RuntimeCosts, the raw samples with every fit,
    and the host fits (calibrate's Fit) to report."""
    host_rows = host_samples(device, dtype)
    scales = gpu_fits(rows, profile)
    add_rows = accumulate_samples(device, dtype, hidden, stage_layers(device))
    runtimes, host_fits, add_fit = runtime_costs(host_rows, scales, add_rows,
                                                 eager_host["forward_s"] + eager_host["backward_s"], profile.host.p2p_s,
                                                 p2p_carried, gpu_ratios(rows, profile))
    for r in rows:  # what the graphs save against eager, and how far the fit is from each point
        parts = profile_parts(r, profile)
        s = scales["graphs"]
        for op in ("forward", "backward"):
            r[f"saved_{op}"] = 1 - r[f"graphs_{op}_s"] / r[f"eager_{op}_s"]
            fixed, flops = parts[op]
            r[f"fit_error_{op}"] = (s.fixed_scale * fixed + s.flops_scale * flops) / r[f"graphs_{op}_s"] - 1
    samples = {"host": host_rows, "gpu": rows, "accumulate": add_rows, "accumulate_fit": dataclasses.asdict(add_fit),
               "gpu_fits": {k: dataclasses.asdict(f) for k, f in scales.items()},
               "costs": {k: dataclasses.asdict(c) for k, c in runtimes.items()}}
    return runtimes, samples, host_fits


def report_lines(samples: dict) -> list[str]:
    """What calibrate prints for the graphs runtimes: their costs, the GPU fits, and the savings point by point."""
    add = samples["accumulate_fit"]
    lines = [f"gradient add fit: R^2 {add['r2']:.4f}, worst {add['max_rel_residual']:.1%}"]
    for name, c in samples["costs"].items():
        fit = samples["gpu_fits"][name]
        lines.append(f"{name}: action {c['action_s'] * 1e6:.1f} us, layer_host {c['layer_host']:.3f}, step "
                     f"{c['begin_s'] * 1e6:.1f} us before its first action + {c['step_s'] * 1e6:.1f} us after its "
                     f"last, gpu_fixed_scale {c['gpu_fixed_scale']:.3f}, gpu_scale "
                     f"{c['gpu_scale']:.3f} (fit R^2 {fit['r2']:.4f}, worst {fit['max_rel_residual']:.1%}"
                     f"{', POOR FIT' if fit['max_rel_residual'] > 0.05 else ''}), gradient add "
                     f"{c['accumulate_s'] * 1e6:.1f} us + bytes / {c['accumulate_Bps'] / 1e9:.0f} GB/s")
    lines.append(f"{'hidden':>6} {'tokens':>6} {'saved fwd':>9} {'saved bwd':>9} {'fit err fwd':>11} "
                 f"{'fit err bwd':>11}")
    for r in samples["gpu"]:
        lines.append(f"{r['hidden']:>6} {r['tokens']:>6} {r['saved_forward']:>9.1%} {r['saved_backward']:>9.1%} "
                     f"{r['fit_error_forward']:>11.1%} {r['fit_error_backward']:>11.1%}")
    return lines
