"""Per-layer GPU costs: layer probes timed on the GPU's clock, fitted per kind and shape, checked in a real step."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from hw.calibrate.fit import WEIGHT_GRAD_FLOOR, Fit, fit_affine, weight_grad_s
from hw.nets.blocks import LAYER_KINDS
from hw.timing import LEAD_MARGIN, duty_lead_s, gpu_time_s, slowest_issue_s, spin, sync
from parsim.profile import LayerCosts, OpCost, Profile
from parsim.workload import Layer, Model, conv_model, mlp_model

LEAD_CYCLES = 20_000_000  # a spin kernel of ~10 ms on an H200: longer than the host takes to queue what follows


IN_STEP_LEAD_S = 1e-3  # the least lead: short beside a step, so the GPU stays as loaded as in hw measure


LAYER_DEPTH = 4  # layers per timing: each reads the one before's output where it can, as in a real stage


SUSTAINED_S = 0.25  # GPU-bound layer probes run this long back to back first: the clock a sustained step holds


def layer_samples(device: torch.device, dtype: torch.dtype, layers: list[Layer], tokens: list[int],
                  progress: tqdm) -> list[dict]:
    """GPU time of one layer's forward, input-grad and full backward, per (layer shape, samples).

    Timed through LAYER_DEPTH layers of the shape and divided: one layer fed the same input again and
    again keeps it in L2 and ran ~10% faster than the layers of a real step. Where the GPU, not the host, would
    set the pace, the probe runs back to back for SUSTAINED_S first and is timed so, at the clock of a GPU at its
    power cap (gpu_time_s): a step that keeps the GPU busy runs there, one fresh from idle ran ~10% faster. Layers
    whose output fits their input are chained, as in a stage; a downsampling block cannot be, so each copy gets its
    own input.
    """
    samples = []
    for layer in layers:
        blocks = [LAYER_KINDS[layer.kind](layer.hidden).to(device, dtype) for _ in range(LAYER_DEPTH)]
        stack = torch.nn.Sequential(*blocks)
        for n in tokens:
            samples.append(_layer_sample(layer, blocks, stack, n, device, dtype))
            progress.update()
    return samples


def _layer_sample(layer: Layer, blocks: list[nn.Module], stack: nn.Sequential, n: int, device: torch.device,
                  dtype: torch.dtype) -> dict:
    """layer_samples' row of one shape at n samples: its LAYER_DEPTH `blocks` (`stack` chains them)."""
    params = [p for b in blocks for p in b.parameters()]
    chained = layer.in_shape == layer.out_shape
    xs = [torch.randn(n, *layer.in_shape, device=device, dtype=dtype, requires_grad=True)
          for _ in range(1 if chained else LAYER_DEPTH)]

    def forward() -> list[torch.Tensor]:
        return [stack(xs[0])] if chained else [b(x) for b, x in zip(blocks, xs, strict=True)]

    ys = forward()
    gs = [torch.randn_like(y) for y in ys]

    def per_layer(fn: Callable[[], object]) -> float:
        return gpu_time_s(fn, device, batch=2, repeat=10, lead_cycles=LEAD_CYCLES,
                          sustained_s=SUSTAINED_S) / LAYER_DEPTH

    fwd = per_layer(forward)
    input_grad = per_layer(lambda: torch.autograd.grad(ys, xs, gs, retain_graph=True))
    full = per_layer(lambda: torch.autograd.grad(ys, [*xs, *params], gs, retain_graph=True))
    return {"kind": layer.kind, "key": layer.cost_key, "hidden": layer.hidden, "side": layer.side,
            "tokens": n, "flops": layer.flops_per_token * n,
            "forward_s": fwd, "backward_input_s": input_grad, "backward_s": full}


def in_step_gpu_s(model: Model, device: torch.device, dtype: torch.dtype, fitted_s: float,
                  ) -> tuple[float, float, float]:
    """GPU time of one micro-batch's forward plus backward of `model` inside hw's real step on one GPU, the host's
    slowest time to issue that step, and the lead the GPU was given before each timed step.

    CUDA events around the actions of hw's own executor, over ~1 s of steps: at the clocks of a GPU
    under sustained load, with whatever a real step adds to the layers' kernels. Each timed step follows a spin that
    covers what the host takes to issue it beyond the GPU's `fitted_s` (timing.duty_lead_s; all of it where the host
    is over twice as slow), so that the spans time the GPU alone even where the host is the slower: a host-bound
    model's spans would otherwise hold the GPU's waits for the host.
    """
    from hw.run.observers import ActionTimer
    from hw.run.stage_runner import clear_grads, local_runner
    from parsim.schedules import gpipe

    runner, io = local_runner(model, gpipe(1, 1), device, dtype)
    timer = ActionTimer(device)
    for _ in range(3):
        clear_grads(runner)
        runner.step(io)
    host_s = slowest_issue_s(lambda: runner.step(io), device, setup=lambda: clear_grads(runner))
    shortfall = duty_lead_s(fitted_s, host_s)
    lead_s = IN_STEP_LEAD_S + (LEAD_MARGIN * host_s if shortfall is None else shortfall)
    for step in range(25):
        clear_grads(runner)
        if step >= 15:  # the host queues the step ahead of the GPU: the spans time the GPU, the model adds the host
            spin(lead_s)
        runner.step(io, timer if step >= 15 else None)
    sync(device)
    return sum(statistics.median(v) for v in timer.seconds().values()), host_s, lead_s


def in_step_factor(fitted_s: float, in_step_s: float, host_s: float, lead_s: float) -> tuple[float, str]:
    """The in-step slowdown its probe gives (in-step over fitted GPU time, at least 1) with its evidence, or 1 with
    the reason it is refused: where the host took longer to issue the step than the GPU's work (the fitted or the
    timed, whichever is less), the model is host-bound as people run it, and its GPU kept busy only behind the
    probe's lead, a queue no GPU-paced step builds: its spans are no measure of a GPU-bound step (issue 50: such a
    probe read x1.000 on one H200 and x1.139 on another, and x1.139 put GPU-bound steps 13% slow)."""
    evidence = (f"the spans {in_step_s * 1e3:.2f} ms against {fitted_s * 1e3:.2f} ms fitted, the host "
                f"{host_s * 1e3:.2f} ms to issue the step behind a {lead_s * 1e3:.2f} ms lead")
    if host_s > min(fitted_s, in_step_s):
        return 1.0, f"refused, host-bound: {evidence}"
    return max(in_step_s / fitted_s, 1.0), evidence


IN_STEP_MODELS = {"mlp": lambda: mlp_model(16, 2048, 8192), "conv": lambda: conv_model()}  # one per family


FAMILY = {"mlp": "mlp", "conv": "conv", "down": "conv"}  # layer kind -> the model its slowdown is timed on


FAMILY |= {kind: "transformer" for kind in ("llama", "gpt", "attention", "embed", "head")}  # timed on --transformer's


def _family(cost_key: str) -> str:
    """The model family of a profile cost key ("mlp@2048" -> "mlp", "down@128x28" -> "conv")."""
    return FAMILY[cost_key.split("@")[0]]


def in_step_slowdowns(costs: dict[str, LayerCosts], base: Profile, device: torch.device, dtype: torch.dtype,
                      models: dict[str, Model] | None = None) -> dict[str, dict]:
    """Per model family, how much slower its layers run inside hw's real step than the fitted costs say.

    The fits come from short probes fresh from idle; in a step the GPU is under sustained load and the layers'
    kernels meet each other's data. Every layer cost of the family is stretched by its factor (1 on the CPU).
    models: a family's model, where not IN_STEP_MODELS' (the transformer's comes from --transformer)."""
    from parsim.workload import stage_costs

    out: dict[str, dict[str, Any]] = {}  # written out with the samples: factor, and where timed the model's times
    for family in sorted({_family(k) for k in costs}):
        if device.type != "cuda":
            out[family] = {"factor": 1.0}
            continue
        model = (models or {}).get(family) or IN_STEP_MODELS[family]()
        fitted = stage_costs(model, 1, 1, dataclasses.replace(base, layers=costs))[0]
        fitted_s = fitted.forward.gpu_s + fitted.backward.gpu_s
        in_step, host_s, lead_s = in_step_gpu_s(model, device, dtype, fitted_s)
        factor, evidence = in_step_factor(fitted_s, in_step, host_s, lead_s)
        out[family] = {"model": model.name, "fitted_s": fitted_s, "in_step_s": in_step, "host_s": host_s,
                       "lead_s": lead_s, "factor": factor, "evidence": evidence}
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


# families whose costs follow hw's runner's own stages (hw.calibrate.stage_probe): their slowdown is a check
STAGED = {"mlp"}


def layer_costs(samples: list[dict], host: dict, corrected: bool = False) -> tuple[LayerCosts, dict[str, Fit]]:
    """Per-layer op costs: host from `host`, GPU from affine fits (before any in-step slowdown); with `corrected`
    (the samples are of one shape), each sample's time over its fit, so that the cost follows the samples. A sample
    whose weight-grad part is lost in noise (fit.weight_grad_s) is left out of that op's fit where two others remain."""
    points = {"forward": [(s["flops"], s["forward_s"]) for s in samples],
              "backward_input": [(s["flops"], s["backward_input_s"]) for s in samples],
              "backward_weight": weight_grad_points(samples)}
    fits = {op: fit_affine([w for w, _ in p], [t for _, t in p]) for op, p in points.items()}
    hosts = {"forward": host["forward_s"], "backward_input": host["backward_input_s"],
             "backward_weight": max(host["backward_s"] - host["backward_input_s"], 0.0)}

    def corrections(op: str) -> tuple[tuple[float, float], ...]:
        fit = fits[op]
        return tuple((w, t / (fit.fixed_s + w / fit.rate)) for w, t in sorted(points[op])) if corrected else ()

    costs = LayerCosts(*(OpCost(hosts[k], fits[k].fixed_s, fits[k].rate, corrections(k))
                         for k in ("forward", "backward_input", "backward_weight")))
    return costs, fits


def weight_grad_points(samples: list[dict]) -> list[tuple[float, float]]:
    """(flops, weight-grad seconds) of each sample, less those whose weight-grad part is noise where two remain."""
    points = [(s["flops"], weight_grad_s(s["backward_s"], s["backward_input_s"])) for s in samples]
    kept = [p for p, s in zip(points, samples, strict=True)
            if s["backward_s"] - s["backward_input_s"] > WEIGHT_GRAD_FLOOR * s["backward_s"]]
    return kept if len(kept) >= 2 else points


def fitted_costs(rows: list[dict], host: dict[str, dict]) -> tuple[dict[str, LayerCosts], dict[str, Fit]]:
    """Costs per kind over all its shapes ("conv") and per shape ("conv@64x56"): small kernels run far
    below the large ones' rate. host: per-layer host costs by kind."""
    costs: dict[str, LayerCosts] = {}
    fits: dict[str, Fit] = {}
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


def conv_layers(cpu: bool) -> list[Layer]:
    """The conv net's distinct layer shapes (`parsim --conv`); on the CPU a tiny net of the same kinds."""
    net = conv_model(widths=(4, 8), blocks=(1, 2), side=8) if cpu else conv_model()
    return list(dict.fromkeys(net.layers))


CONV_KINDS = ("conv", "down")
