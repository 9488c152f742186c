"""hw's own runners timed on a stage of MLP blocks at each calibrated width and micro-batch size (`hw calibrate`).

A stage of 8 blocks (2 on the CPU), one micro-batch, under hw's eager runner and, with `--runtimes graphs`, its
graphed runners: each action's GPU time as a step runs it, at the clock the load of a step at this host's pace
holds. The eager stages correct the layer costs at their shapes (stage_corrections: the layer probes' chains
cost the host more per layer than a stage does); the graphed stages price the graphs runtimes."""

from __future__ import annotations

import dataclasses
import statistics
import time

import numpy as np
import torch

from hw.calibrate.layers import SUSTAINED_S
from hw.run.cuda_graphs import local_graph_runner
from hw.run.observers import ActionTimer, Mark, between
from hw.run.ranks import release_unused
from hw.run.stage_runner import StageRunner, StepIO, clear_grads, local_runner
from hw.timing import duty_lead_s, slowest_issue_s, spin, sync
from parsim.profile import LayerCosts, OpCost
from parsim.schedules import Op, gpipe
from parsim.workload import Layer, mlp_model

GPU_LAYERS, GPU_TOKENS = 8, (128, 256, 512, 1024, 2048, 4096, 8192)
CPU_LAYERS, CPU_TOKENS = 2, (16, 64)
LEAD_CYCLES = 20_000_000  # ~10 ms: longer than hw's eager runner takes to queue 8 layers' backward at any size


def stage_layers(device: torch.device) -> int:
    """Blocks in a probed stage: 8 on a GPU, 2 on the CPU (tests)."""
    return CPU_LAYERS if device.type != "cuda" else GPU_LAYERS


def stage_samples(device: torch.device, dtype: torch.dtype, hidden: list[int], graphed: bool,
                  steps: int = 8) -> list[dict]:
    """Per width and size, the GPU time of a stage's forward and backward under hw's eager runner (and, where
    `graphed`, graphed, and the whole step as one graph): first in turns, the GPU fed ahead by a spin kernel (fresh);
    then the host's time to issue a step; then on a GPU, where the host keeps the GPU busy half the time or more,
    again after SUSTAINED_S of steps at the duty the host's pace gives the GPU (timing.duty_lead_s)."""
    rows, layers = [], stage_layers(device)
    cuda = device.type == "cuda"
    for h in hidden:
        for n in CPU_TOKENS if not cuda else GPU_TOKENS:
            model, schedule = mlp_model(layers, h, n), gpipe(1, 1)
            runners = {"eager": local_runner(model, schedule, device, dtype)}
            if graphed:
                runners |= {"graphs": local_graph_runner(model, schedule, device, dtype),
                            "graphs-step": local_graph_runner(model, schedule, device, dtype, whole_step=True)}
            timers = {name: StageSpans(device) for name in runners}
            for step in range(3 + steps):
                for name, (runner, io) in runners.items():
                    if cuda:
                        torch.cuda._sleep(LEAD_CYCLES)  # the host queues the whole step before the GPU reaches it
                    timers[name].step(runner, io, timed=step >= 3)
            sync(device)
            leads = {name: duty_lead_s(timers[name].step_s(), _host_step_s(runner, io, device))
                     for name, (runner, io) in runners.items()}
            for name, (runner, io) in runners.items():
                lead = leads[name]
                if cuda and lead is not None:  # else the fresh timing above stands
                    timers[name] = _sustained(runner, io, device, lead, timers[name].step_s(), steps)
            sync(device)
            row = {"hidden": h, "tokens": n, "layers": layers, "lead_s": leads}
            if graphed:
                row["graphs-step_s"] = timers["graphs-step"].step_s()
            for name in ("eager", "graphs") if graphed else ("eager",):
                row[f"{name}_forward_s"], row[f"{name}_backward_s"] = timers[name].actions_s()
            rows.append(row)
            del runners, timers
            release_unused(device)  # each size's graphs and pools go before the next is captured
    return rows


def _sustained(runner: StageRunner, io: StepIO, device: torch.device, lead_s: float, gpu_s: float,
               steps: int) -> StageSpans:
    """`steps` steps timed after SUSTAINED_S of them, each behind a spin of `lead_s`."""
    spans, warm = StageSpans(device), int(np.ceil(SUSTAINED_S / (gpu_s + lead_s)))
    for step in range(warm + steps):
        spin(lead_s)
        spans.step(runner, io, timed=step >= warm)
    return spans


class StageSpans:
    """A runner's steps timed on the GPU: per action (hw's runners) and whole (one graph per step)."""

    def __init__(self, device: torch.device):
        self.device, self.actions = device, ActionTimer(device)
        self.whole: list[tuple[Mark, Mark]] = []

    def step(self, runner: StageRunner, io: StepIO, timed: bool) -> None:
        """One step of `runner`, its .grad cleared first; timed (per action, or whole) unless not `timed`."""
        clear_grads(runner)
        if not timed:
            runner.step(io)
        elif getattr(runner, "whole_step", False):
            start = _mark(self.device)
            runner.step(io)
            self.whole.append((start, _mark(self.device)))
        else:
            runner.step(io, self.actions)

    def actions_s(self) -> tuple[float, float]:
        """Median forward and backward GPU time."""
        per_op = self.actions.seconds()
        return statistics.median(per_op[0, Op.FORWARD]), statistics.median(per_op[0, Op.BACKWARD])

    def step_s(self) -> float:
        """Median GPU time of a step: its actions', or the whole graph's."""
        if self.actions.spans:
            return sum(self.actions_s())
        return statistics.median(between(a, b) for a, b in self.whole)


def _host_step_s(runner: StageRunner, io: StepIO, device: torch.device) -> float:
    """The host's slowest time to issue one step of `runner` (opcosts.slowest_issue_s), its grads cleared first."""
    return slowest_issue_s(lambda: runner.step(io), device, setup=lambda: clear_grads(runner))


def _mark(device: torch.device) -> Mark:
    """Now: a CUDA event recorded on the current stream, or the host's clock."""
    if device.type != "cuda":
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def stage_corrections(costs: dict[str, LayerCosts], rows: list[dict]) -> dict[str, LayerCosts]:
    """`costs` with each probed MLP shape's corrections taken from its eager stages: the forward's from the stage's
    forward, input-grad's and weight-grad's scaled alike so that they sum to the stage's backward; the layer
    probes' corrections stay beyond the stages' sizes."""
    out = dict(costs)
    for h in sorted({r["hidden"] for r in rows}):
        layer = Layer("mlp", h)
        c = costs.get(layer.cost_key)
        if c is None:
            continue
        points: dict[str, list] = {"forward": [], "backward_input": [], "backward_weight": []}
        for r in sorted((r for r in rows if r["hidden"] == h), key=lambda r: r["tokens"]):
            flops, n = layer.flops_per_token * r["tokens"], r["layers"]
            points["forward"].append((flops, r["eager_forward_s"] / n / _fit(c.forward, flops)))
            scale = r["eager_backward_s"] / n / (c.backward_input.gpu_s(flops) + c.backward_weight.gpu_s(flops))
            for op in ("backward_input", "backward_weight"):
                cost = getattr(c, op)
                points[op].append((flops, cost.gpu_s(flops) * scale / _fit(cost, flops)))
        out[layer.cost_key] = LayerCosts(*(_with(getattr(c, op), pts) for op, pts in points.items()))
    return out


def _fit(cost: OpCost, flops: float) -> float:
    return cost.fixed_s + flops / cost.flops_per_s


def _with(cost: OpCost, points: list[tuple[float, float]]) -> OpCost:
    """cost with `points` as its corrections, its own kept beyond them."""
    lo, hi = points[0][0], points[-1][0]
    kept = [(w, r) for w, r in cost.corrections if w < lo or w > hi]
    return dataclasses.replace(cost, corrections=tuple(sorted(points + kept)))
