"""A layer's backward working memory by the CPU allocator's count: what parsim.workload.memory holds beyond a layer's
stash while its backward runs (its `backward_workspace`, beside the gradients made by then)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hw.nets.blocks import layer_module  # noqa: E402
from parsim.workload import Layer  # noqa: E402
from parsim.workload.memory import layer_memory  # noqa: E402

MLP = Layer("mlp", 256, dtype_bytes=4)  # fp32: the CPU allocator's bytes are the layer's own


def _profiled_backward(layer: Layer, samples: int, accumulate: bool) -> tuple[list, Any, int]:
    """The CPU profiler's events of one forward and backward of the layer (fp32), the backward's span and the
    output's bytes. The input and the forward run inside the profile, so every saved tensor is counted, and freed
    when autograd releases it; `accumulate`: .grad holds gradients already (a later backward)."""
    import gc

    from torch.profiler import ProfilerActivity, profile, record_function

    torch.manual_seed(0)
    module = layer_module(layer)
    for p in module.parameters():
        p.grad = torch.zeros_like(p) if accumulate else None
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        x = torch.randn(samples, *layer.in_shape, requires_grad=True)
        y = module(x)
        dy = torch.randn_like(y)
        with record_function("backward"):
            y.backward(dy)
    events = list(prof.profiler.kineto_results.events())
    (span,) = [e for e in events if e.name() == "backward"]
    return events, span, y.untyped_storage().nbytes()


def _held(events: list, at: int) -> int:
    """Bytes the allocator holds at time `at` (of those allocated inside the profile)."""
    return sum(e.nbytes() for e in events if e.name() == "[memory]" and e.start_ns() <= at)


def _backward_peak_bytes(layer: Layer, samples: int, accumulate: bool = False, kernels_only: bool = False) -> int:
    """The most bytes the CPU allocator holds while the layer's backward runs, less its output (which the runner's
    backward holds too, and parsim counts apart): its stash, the output's gradient, its working memory and the
    gradients it makes. `kernels_only`: only as each outermost kernel ends, without the scratch a kernel frees before
    it returns (the CPU's convolutions' buffers, which cuDNN's are not)."""
    events, span, output = _profiled_backward(layer, samples, accumulate)
    if kernels_only:
        ops = [e for e in events if e.name().startswith("aten::") and e.start_ns() >= span.start_ns()]
        inner = {id(o) for o in ops for p in ops if p is not o and p.start_ns() <= o.start_ns()
                 and o.start_ns() + o.duration_ns() <= p.start_ns() + p.duration_ns()}
        times = [o.start_ns() + o.duration_ns() for o in ops if id(o) not in inner]
    else:
        times = [e.start_ns() for e in events if e.name() == "[memory]" and e.start_ns() >= span.start_ns()]
    return max(_held(events, t) for t in [span.start_ns(), *times]) - output


def test_an_mlp_blocks_backward_holds_its_output_gradient_and_four_c_beyond_its_stash():
    """Per token (two batch sizes' difference: the weight gradients cancel): the stash (10C) and 5C more, the
    output's gradient and fc2's input gradient beside GELU's output (then GELU's input gradient beside it). The
    layernorm's fp32 statistics (8 bytes a token) are not modelled."""
    per_token = _backward_peak_bytes(MLP, 512) - _backward_peak_bytes(MLP, 256)
    assert MLP.backward_workspace_bytes_per_token == 5 * MLP.hidden * 4
    assert per_token / 256 == pytest.approx(MLP.stash_bytes_per_token + MLP.backward_workspace_bytes_per_token,
                                            rel=0.01)


@pytest.mark.parametrize("accumulate", [False, True])
def test_an_mlp_blocks_backward_peaks_beside_fc2s_gradients_alone(accumulate: bool):
    """As many tokens as channels (the weight gradients as large as the activations): the peak is the stash, the
    working memory and fc2's gradients (made first; fc1's come once GELU's tensors are freed), within 1%; counting
    all the block's gradients at that peak would be 21% over, no working memory 5% under. A later backward makes
    fc2's weight gradient apart before adding it into .grad: the same peak."""
    memory = layer_memory(MLP, MLP.hidden)
    made = memory.grad_step if accumulate else memory.grads
    measured = _backward_peak_bytes(MLP, MLP.hidden, accumulate)
    assert measured == pytest.approx(memory.stash + memory.backward_peak(made), rel=0.01)
    if not accumulate:
        assert memory.stash + memory.backward_workspace + made > 1.15 * measured
        assert memory.stash + made < 0.97 * measured


@pytest.mark.parametrize("layer", [Layer("conv", 16, 4, 8), Layer("down", 16, 4, 8)], ids=lambda layer: layer.kind)
def test_a_conv_blocks_backward_holds_its_output_gradient_and_two_maps_beyond_its_stash(layer: Layer):
    """Per image, between kernels (a kernel's own scratch excluded: cuDNN's workspace is not the CPU's): the stash
    and 3 C S^2 more, the output's gradient and two gradients at once (the second ReLU's input and output gradients;
    in a downsampling block also the shortcut's and the first conv's gradients of `a`, added in place)."""
    per_image = (_backward_peak_bytes(layer, 16, kernels_only=True) - _backward_peak_bytes(layer, 8, kernels_only=True)) / 8
    assert layer.backward_workspace_bytes_per_token == 3 * layer.hidden * layer.side**2 * 4
    assert per_image == pytest.approx(layer.stash_bytes_per_token + layer.backward_workspace_bytes_per_token,
                                      rel=0.01)
