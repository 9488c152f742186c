"""Each layer of a user's model timed where it runs: inside the whole model's forward and backward, at each
micro-batch size, on the GPU's clock (CUDA events between layers, recorded from the forward and from autograd's
hooks), with the host's launch time of each, and what each layer holds (saved tensors, working memory).

Timed in place, a layer reads its input from the layer before, as in a pipeline's stage: timed alone, fed the
same input again and again, a layer's input stays in L2 (hw.calibrate.layers found ~10% faster). A spin kernel
before each pass keeps the host ahead of the GPU: the host has queued a layer's work before the GPU reaches it, so
an event's gap is the GPU's time alone. Passes run back to back for SUSTAINED_S first: the clock a step holds.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from hw.timing import LEAD_MARGIN, spin, sync

SUSTAINED_S = 0.3  # untimed passes first, back to back: a GPU-bound step runs at the clock its load holds


@dataclass
class LayerTimes:
    """One layer at one micro-batch size: medians over the timed passes, seconds; bytes held."""

    samples: int
    forward_s: float
    backward_input_s: float  # the input-gradient part alone (0 for a layer nothing flows back through)
    backward_s: float  # the whole backward: input- and weight-gradient
    host_forward_s: float
    host_backward_s: float
    stash_bytes: int = 0  # what autograd keeps of its forward (storages first saved by it, no parameters)
    forward_workspace_bytes: int = 0  # the most it allocates beyond what was held before it, while it runs
    backward_workspace_bytes: int = 0
    flops: float = 0.0  # its forward's, as FlopCounterMode counts them
    saved_tensors: int = 0  # tensors its forward saved for autograd (checkpointing's hooks run per tensor)


@dataclass
class Pass:
    """What one forward and backward recorded: per layer, GPU spans (seconds) and host spans."""

    forward: list[float] = field(default_factory=list)
    backward: list[float] = field(default_factory=list)
    host_forward: list[float] = field(default_factory=list)
    host_backward: list[float] = field(default_factory=list)


Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Clock:
    """Marks on the GPU's timeline (CUDA events) or, on the CPU, wall time after a sync; and the host's wall time."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.events: list[torch.cuda.Event] = []
        self.host: list[float] = []

    def mark(self) -> None:
        self.host.append(time.perf_counter())
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.events.append(event)

    def gpu_spans(self) -> list[float]:
        """The GPU's time between marks (on the CPU, the wall time: each op ran before its call returned)."""
        if not self.cuda:
            return self.host_spans()
        self.events[-1].synchronize()
        return [a.elapsed_time(b) / 1e3 for a, b in zip(self.events, self.events[1:])]

    def host_spans(self) -> list[float]:
        return [b - a for a, b in zip(self.host, self.host[1:])]


def one_pass(layers: list[nn.Module], x: torch.Tensor, y: torch.Tensor, loss_fn: Loss, device: torch.device,
             inputs_only: bool = False, lead_s: float = 0.0) -> Pass:
    """A forward through every layer and the loss, then the backward (with `inputs_only`, only what the first
    layer's output gradient needs: the model's input needs none, as a pipeline's batch), each layer's span marked;
    the loss is the last layer's."""
    if device.type == "cuda":
        spin(lead_s)
    fwd = Clock(device)
    fwd.mark()
    outs, h = [], x
    for i, layer in enumerate(layers):
        h = layer(h)
        if i == len(layers) - 1:
            h = loss_fn(h, y)
        fwd.mark()
        outs.append(h)
    bwd = Clock(device)
    for out in reversed(outs[:-1]):  # grad of layer i's output: layer i + 1's backward is done
        out.register_hook(lambda g: bwd.mark())
    bwd.mark()
    if inputs_only:
        torch.autograd.grad(outs[-1], [outs[0]])
    else:
        outs[-1].backward()
    bwd.mark()  # the first layer's backward is done when the backward returns (then nothing is left queued)
    backward = bwd.gpu_spans()[::-1]
    host_backward = bwd.host_spans()[::-1]
    if inputs_only:  # the first layer has no input gradient: autograd stopped at its output
        backward, host_backward = [0.0, *backward[1:]], [0.0, *host_backward[1:]]
    return Pass(fwd.gpu_spans(), backward, fwd.host_spans(), host_backward)


def _median_pass(passes: list[Pass]) -> Pass:
    def med(rows: list[list[float]]) -> list[float]:
        return [statistics.median(col) for col in zip(*rows)]

    return Pass(med([p.forward for p in passes]), med([p.backward for p in passes]),
                med([p.host_forward for p in passes]), med([p.host_backward for p in passes]))


def timed_passes(layers: list[nn.Module], x: torch.Tensor, y: torch.Tensor, loss_fn: Loss, device: torch.device,
                 repeat: int) -> tuple[Pass, Pass, Pass]:
    """Median full and input-gradient passes, each led by a spin longer than the host takes to queue a pass (so the
    GPU's spans hold no host gap), and passes with no lead from an idle GPU, whose host spans are the host's: in
    turns, after SUSTAINED_S of untimed passes. Behind a lead the host runs far ahead and blocks once CUDA's launch
    queue is full (Llama-3.2-1B's backward, ~10-100 ms a layer: data/user-models/nvidia-h200-x2-2026-11-28-b)."""
    for layer in layers:
        layer.zero_grad(set_to_none=True)
    start = time.perf_counter()
    while True:  # the first pass warms up (kernels chosen, memory cached); the last one's host time sets the lead
        warm = one_pass(layers, x, y, loss_fn, device)
        sync(device)
        if time.perf_counter() - start > (SUSTAINED_S if device.type == "cuda" else 0):
            break
    lead_s = LEAD_MARGIN * (sum(warm.host_forward) + sum(warm.host_backward))
    full, inputs, host = [], [], []
    for _ in range(repeat):
        full.append(one_pass(layers, x, y, loss_fn, device, lead_s=lead_s))
        inputs.append(one_pass(layers, x, y, loss_fn, device, inputs_only=True, lead_s=lead_s))
        sync(device)
        host.append(one_pass(layers, x, y, loss_fn, device))
    for layer in layers:
        layer.zero_grad(set_to_none=True)
    return _median_pass(full), _median_pass(inputs), _median_pass(host)


def forward_flops(layers: list[nn.Module], x: torch.Tensor) -> list[float]:
    """Each layer's forward FLOPs as FlopCounterMode counts them; 0 where it cannot (its count of grouped-query
    attention asserts on torch 2.11): they only name a layer's work in reports."""
    out, h = [], x
    with torch.no_grad():
        for layer in layers:
            try:
                with FlopCounterMode(display=False) as counter:
                    h2 = layer(h)
                out.append(float(counter.get_total_flops()))
            except Exception:  # a formula of torch's that does not take this op's shapes
                h2 = layer(h)
                out.append(0.0)
            h = h2
    return out


def held_bytes(layers: list[nn.Module], x: torch.Tensor, y: torch.Tensor, loss_fn: Loss,
               device: torch.device) -> tuple[list[int], list[int], list[int], list[int]]:
    """Per layer: bytes of the storages autograd first saved in its forward (parameters aside), its forward's
    and backward's working memory (GPU only: 0 on the CPU), and how many tensors its forward saved (the loss's
    not counted: hw computes it outside a checkpoint)."""
    params = {p.untyped_storage().data_ptr() for layer in layers for p in layer.parameters()}
    seen: set[int] = set()
    n = len(layers)
    stash, fwd_ws, bwd_ws, saved = [0] * n, [0] * n, [0] * n, [0] * n
    cuda = device.type == "cuda"
    current, in_loss = [0], [False]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if not in_loss[0]:
            saved[current[0]] += 1
        storage = t.untyped_storage()
        if storage.data_ptr() not in params and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            stash[current[0]] += storage.nbytes()
        return t

    outs, h = [], x
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for i, layer in enumerate(layers):
            current[0] = i
            before = _reset_peak(device)
            h = layer(h)
            if i == n - 1:
                in_loss[0] = True  # its storages count as the last layer's, its tensors not
                h = loss_fn(h, y)
            fwd_ws[i] = torch.cuda.max_memory_allocated(device) - before if cuda else 0
            outs.append(h)
    starts = [0]

    def backward_mark(i: int) -> Callable[[torch.Tensor], None]:
        def hook(_: torch.Tensor) -> None:  # layer i + 1's backward is done, layer i's starts
            if cuda:
                bwd_ws[i + 1] = torch.cuda.max_memory_allocated(device) - starts[0]
                starts[0] = _reset_peak(device)
        return hook

    for i, out in enumerate(outs[:-1]):
        out.register_hook(backward_mark(i))
    starts[0] = _reset_peak(device)
    outs[-1].backward()
    if cuda:
        bwd_ws[0] = torch.cuda.max_memory_allocated(device) - starts[0]
    for layer in layers:
        layer.zero_grad(set_to_none=True)
    return stash, fwd_ws, bwd_ws, saved


def _reset_peak(device: torch.device) -> int:
    """Start a new peak at what is allocated now, and return that (0 on the CPU)."""
    if device.type != "cuda":
        return 0
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def time_layers(layers: list[nn.Module], x: torch.Tensor, y: torch.Tensor, loss_fn: Loss, device: torch.device,
                repeat: int) -> list[LayerTimes]:
    """Every layer's times and bytes for the micro-batch `x` (with targets `y`)."""
    full, inputs, host = timed_passes(layers, x, y, loss_fn, device, repeat)
    stash, fwd_ws, bwd_ws, saved = held_bytes(layers, x, y, loss_fn, device)
    flops = forward_flops(layers, x)
    n = x.shape[0]
    return [LayerTimes(n, full.forward[i], inputs.backward[i], full.backward[i], host.host_forward[i],
                       host.host_backward[i], stash[i], fwd_ws[i], bwd_ws[i], flops[i], saved[i])
            for i in range(len(layers))]
