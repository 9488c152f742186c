"""Shared builders: profiles whose costs the tests set exactly, and the CPU allocator's peak over a call."""

from __future__ import annotations

import math
import signal
from collections.abc import Callable

import pytest

from parsim.profile import HostCosts, LayerCosts, LinkSpec, OpCost, Profile
from parsim.workload import StageCost, Work

INF = math.inf


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C reaches the commands the tests start, as it reaches a terminal's foreground job.

    A shell starts a background job (`cmd &`, `nohup cmd &`) with SIGINT ignored, and an ignored signal stays
    ignored in every child, where Python then installs no KeyboardInterrupt handler: run so, the Ctrl-C tests
    would time a command that cannot be interrupted. A handler, unlike an ignore, is reset to the default by exec:
    with Python's own handler back here, the commands take Ctrl-C as at a terminal.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def make_profile(latency_s: float = 0.0, bandwidth_Bps: float = INF, action_s: float = 0.0,
                 p2p_s: float = 0.0, layer_host_s: float = 0.0, gpus_per_node: int = 8,
                 network: LinkSpec | None = None) -> Profile:
    """A profile with the given link and host costs (all free by default) and a unit-rate mlp layer."""
    link = LinkSpec(latency_s, bandwidth_Bps)
    cost = OpCost(layer_host_s, 0.0, 1e12)
    return Profile(
        gpus_per_node=gpus_per_node,
        links={"nvlink": link, "network": network or link, "h2d_pinned": link, "h2d_pageable": link,
               "d2h_pinned": link, "d2h_pageable": link},
        host=HostCosts(action_s, p2p_s),
        layers={"mlp": LayerCosts(cost, cost, cost)},
        meta={"gpu": "test", "source": "tests"},
    )


def equal_stages(p: int, t_f: float, t_b: float, send_bytes: int = 1 << 20, stash_bytes: int = 1000,
                 host_s: float = 0.0, chunks: int = 1) -> list[StageCost]:
    """p identical stages: forward t_f, backward t_b split evenly into input- and weight-grad."""
    return [StageCost(Work(t_f, host_s, chunks), Work(t_b / 2, host_s / 2, chunks),
                      Work(t_b / 2, host_s / 2, chunks), send_bytes, stash_bytes) for _ in range(p)]


@pytest.fixture
def free_profile() -> Profile:
    return make_profile()


TRANSFORMER_KEYS = ("llama", "gpt", "attention", "embed", "head")


def transformer_profile(rates: dict[str, float] | None = None, fixed_s: float = 0.0, host_s: float = 0.0) -> Profile:
    """make_profile with every transformer cost key at 1e12 work/s (or `rates`' per key), fixed_s and host_s each op."""
    rates = rates or {}
    costs = {k: LayerCosts(*[OpCost(host_s, fixed_s, rates.get(k, 1e12))] * 3) for k in TRANSFORMER_KEYS}
    profile = make_profile()
    return Profile(profile.gpus_per_node, profile.links, profile.host, {**profile.layers, **costs}, meta=profile.meta)


def one_device_step(model: object, microbatches: int = 1) -> tuple:
    """Loss and gradients (by "layer.name") of the whole model on one CPU in fp64, micro-batch after micro-batch
    (one: the whole batch), each micro-batch's loss weighted by its share of the rows: what a pipelined step of it
    must reproduce (assert_same_gradients). A conv net's batch norm takes its statistics per micro-batch, in a
    pipeline as here; an MLP's layer norm is per token, so for it any split equals the whole batch."""
    import torch

    from hw.nets.blocks import build_layers, loss_for
    from hw.run.stage_runner import make_batch

    layers = [layer.double() for layer in build_layers(model)]
    x, y = make_batch(model, torch.device("cpu"), torch.float64)
    loss = torch.zeros((), dtype=torch.float64)
    for xm, ym in zip(x.chunk(microbatches), y.chunk(microbatches)):
        out = xm
        for layer in layers:
            out = layer(out)
        part = loss_for(model)(out, ym) * (xm.shape[0] / x.shape[0])
        part.backward()
        loss += part.detach()
    return loss, {f"{i}.{n}": p.grad for i, layer in enumerate(layers) for n, p in layer.named_parameters()}


def assert_same_gradients(results: list, last: int, loss: object, grads: dict) -> None:
    """A pipelined step's ranks (hw.run.runtimes.gradient_step_worker's RankGradients) against one device's loss and
    gradients: the last stage's rank `last` has the loss, the ranks together every gradient, each to rounding."""
    import torch

    assert torch.allclose(results[last].loss, loss, rtol=1e-12, atol=0)
    got = {k: v for r in results for k, v in r.grads.items()}
    assert got.keys() == grads.keys()
    for key, g in grads.items():
        assert torch.allclose(got[key], g, rtol=1e-10, atol=1e-14), key


def allocator_peak_bytes(run: Callable[[], object]) -> int:
    """The most bytes the CPU allocator holds while `run` runs beyond what it held before, from torch.profiler's
    memory events. Garbage of earlier tests is collected first: freed inside the profile, blocks allocated before it
    would count as negative bytes."""
    import gc

    from torch.profiler import ProfilerActivity, profile

    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    held = peak = 0
    for _, nbytes in sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                            if e.name() == "[memory]"):
        held += nbytes
        peak = max(peak, held)
    return peak


def saved_tensor_count(run: Callable[[], object]) -> int:
    """How many tensors autograd saves while `run` runs: torch.utils.checkpoint's pack hook runs once for each."""
    import torch

    count = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        count[0] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return count[0]
