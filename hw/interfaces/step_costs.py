"""A plain training step's host costs beyond its kernels' launches, timed on small probe modules (neither scenario
model): what parsim's data-parallel scenario prices a step's frame and a small Linear with (GilCosts' step fields).

The probes take turns (the lent hosts drift within minutes): plain steps of two small modules timed part by part,
as a step runs them, and calls timed alone after a sync; each cost is a median over the turns, or the difference
of two medians where it is what one part adds to another.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from hw.timing import sync

ELEMENTS = 1024  # each probe parameter's and input's elements: small, so the GPU keeps up with the host
LINEAR = (8, 16, 16)  # the Linear probe: rows, in and out features (not the text's nn.Linear(5, 2))
ZERO_GRAD_TENSORS = 16  # zero_grad's probes: a module with one parameter tensor, one with this many, this many modules
WARMUP = 5  # untimed turns first


class _Scale(nn.Module):
    """One elementwise op on one parameter: a module call's and loss.backward()'s own host costs."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.w = nn.Parameter(torch.ones(ELEMENTS, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


class _Tensors(nn.Module):
    """A module holding `n` parameter tensors (not in a child module): zero_grad's cost per tensor."""

    def __init__(self, n: int, device: torch.device):
        super().__init__()
        for i in range(n):
            self.register_parameter(f"p{i}", nn.Parameter(torch.ones(ELEMENTS, device=device)))


def in_turns(probes: dict[str, Callable[[], dict[str, float]]], repeat: int) -> dict[str, float]:
    """Each probe's median host time per part ("<probe>_<part>", or "<probe>" for a part named "") over `repeat`
    turns after WARMUP; in every turn each probe once, in the dict's order."""
    times: dict[str, list[float]] = {}
    for k in range(WARMUP + repeat):
        for name, probe in probes.items():
            for part, t in probe().items():
                if k >= WARMUP:
                    times.setdefault(f"{name}_{part}" if part else name, []).append(t)
    return {name: statistics.median(t) for name, t in times.items()}


def timed(device: torch.device, call: Callable[[], object], setup: Callable[[], object] | None = None
          ) -> Callable[[], dict[str, float]]:
    """A probe timing `call` alone: its set-up first, then the device synced, then the call."""
    def probe() -> dict[str, float]:
        if setup is not None:
            setup()
        sync(device)
        t0 = time.perf_counter()
        call()
        t = time.perf_counter() - t0
        sync(device)
        return {"": t}
    return probe


def plain_step(device: torch.device, module: nn.Module, x: torch.Tensor) -> Callable[[], dict[str, float]]:
    """A probe timing a plain training step of `module` on x part by part, as a step runs them (no sync inside):
    zero_grad(set_to_none=True), forward, the loss `.float().sum()`, backward, then the final sync."""
    def probe() -> dict[str, float]:
        sync(device)
        t0 = time.perf_counter()
        module.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        y = module(x)
        t2 = time.perf_counter()
        loss = y.float().sum()
        t3 = time.perf_counter()
        loss.backward()
        t4 = time.perf_counter()
        sync(device)
        t5 = time.perf_counter()
        return {"zero_grad": t1 - t0, "forward": t2 - t1, "loss": t3 - t2, "backward": t4 - t3, "sync": t5 - t4}
    return probe


def with_grads(module: nn.Module) -> Callable[[], None]:
    """A set-up giving every parameter of `module` a gradient, for zero_grad(set_to_none=True) to free."""
    def setup() -> None:
        for p in module.parameters():
            p.grad = torch.ones_like(p)
    return setup


def step_host_costs(device: torch.device, launch_s: float, repeat: int = 200) -> dict[str, float]:
    """GilCosts' plain-step fields, from probes timed in turns (the differences at least 0):
    - from a plain step of a one-op module, part by part: module_call_s and backward_call_s, its forward and its
      loss.backward() beyond their launches (the op; the seed gradient's fill and the weight gradient's multiply);
    - from a plain step of a small nn.Linear, part by part: linear_forward_s (its call), loss_s (`.float().sum()`),
      linear_backward_s (its loss.backward() beyond backward_call_s and the seed's launch: its autograd nodes'
      own work) and step_sync_s (the final sync, its last kernels' tail included);
    - zero_grad_s, zero_grad_module_s, zero_grad_param_s: zero_grad(set_to_none=True) alone, of a module with one
      parameter tensor, and what each further module and parameter tensor adds (one module with ZERO_GRAD_TENSORS
      tensors, and a Sequential of ZERO_GRAD_TENSORS one-tensor modules);
    - matmul_launch_s: a small matrix product's launch alone."""
    scale, x = _Scale(device), torch.ones(ELEMENTS, device=device)
    a = torch.ones(16, 16, device=device)
    rows, features, out = LINEAR
    with device:
        linear = nn.Linear(features, out)
    one, many = _Tensors(1, device), _Tensors(ZERO_GRAD_TENSORS, device)
    modules = nn.Sequential(*(_Tensors(1, device) for _ in range(ZERO_GRAD_TENSORS)))
    t = in_turns({"scale": plain_step(device, scale, x),
                  "linear": plain_step(device, linear, torch.ones(rows, features, device=device)),
                  "zero_grad_1": timed(device, lambda: one.zero_grad(set_to_none=True), with_grads(one)),
                  "zero_grad_tensors": timed(device, lambda: many.zero_grad(set_to_none=True), with_grads(many)),
                  "zero_grad_modules": timed(device, lambda: modules.zero_grad(set_to_none=True), with_grads(modules)),
                  "matmul": timed(device, lambda: a.mm(a))}, repeat)
    backward_call = max(t["scale_backward"] - 2 * launch_s, 0.0)
    return {"module_call_s": max(t["scale_forward"] - launch_s, 0.0), "backward_call_s": backward_call,
            "matmul_launch_s": t["matmul"], "zero_grad_s": t["zero_grad_1"],
            "zero_grad_module_s": max(t["zero_grad_modules"] - t["zero_grad_tensors"], 0.0) / ZERO_GRAD_TENSORS,
            "zero_grad_param_s": max(t["zero_grad_tensors"] - t["zero_grad_1"], 0.0) / (ZERO_GRAD_TENSORS - 1),
            "linear_forward_s": t["linear_forward"], "loss_s": t["linear_loss"],
            "linear_backward_s": max(t["linear_backward"] - backward_call - launch_s, 0.0),
            "step_sync_s": t["linear_sync"]}
