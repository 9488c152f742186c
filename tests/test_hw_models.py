"""parsim's per-layer formulas against the torch modules hw runs: parameters, shapes, FLOPs, saved activations."""

from __future__ import annotations

import pytest
from conftest import saved_tensor_count

torch = pytest.importorskip("torch")

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from hw.nets.blocks import LAYER_KINDS  # noqa: E402
from parsim.workload import Layer  # noqa: E402

LAYERS = [Layer("mlp", 16), Layer("mlp", 24), Layer("conv", 8, side=6), Layer("conv", 16, side=3),
          Layer("down", 8, side=4), Layer("down", 32, side=3)]
SAMPLES = 3  # a batch size unlike any width, so activations are told apart from weights by their first dimension


def _module_and_input(layer: Layer):
    torch.manual_seed(0)
    module = LAYER_KINDS[layer.kind](layer.hidden).double()
    return module, torch.randn(SAMPLES, *layer.in_shape, dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.cost_key)
def test_params_and_output_match_the_module(layer):
    module, x = _module_and_input(layer)
    assert sum(p.numel() for p in module.parameters()) == layer.params
    y = module(x)
    assert tuple(y.shape) == (SAMPLES, *layer.out_shape)
    assert y[0].numel() * layer.dtype_bytes == layer.out_bytes_per_token


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.cost_key)
def test_flops_of_forward_and_backward_match_torchs_count(layer):
    """Forward: 2 FLOPs per multiply-add of the convs and matmuls; backward: input-grad and weight-grad as much each."""
    module, x = _module_and_input(layer)
    with FlopCounterMode(display=False) as forward:
        y = module(x)
    with FlopCounterMode(display=False) as backward:
        y.backward(torch.ones_like(y))
    assert forward.get_total_flops() == layer.flops_per_token * SAMPLES
    assert backward.get_total_flops() == 2 * layer.flops_per_token * SAMPLES


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.cost_key)
def test_stash_is_what_autograd_saves(layer):
    """Activations autograd keeps for the backward, each tensor once (relu's output is also the conv's input)."""
    module, x = _module_and_input(layer)
    saved: dict[tuple, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        per_sample = t.dim() >= 2 and t.shape[0] == SAMPLES and t[0].numel() > 1  # not weights, nor per-row stats
        if per_sample:
            saved[(t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))] = t[0].numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    assert sum(saved.values()) * layer.dtype_bytes == layer.stash_bytes_per_token


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.cost_key)
def test_saved_tensors_are_the_hooks_a_checkpoint_runs(layer):
    """Every tensor autograd saves, weights and statistics included: torch.utils.checkpoint's pack hook runs once
    for each (parsim prices a recompute's hooks per tensor, parsim.sim.lower)."""
    module, x = _module_and_input(layer)
    assert saved_tensor_count(lambda: module(x)) == layer.saved_tensors
