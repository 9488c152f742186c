"""What a split backward leaves held where the forward's output stays (hw's graphed runner keeps it for good): the
stash that only ops without weights keep, `unweighted_stash_bytes_per_token`, against autograd on the modules hw runs.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")

from hw.nets.blocks import layer_module  # noqa: E402
from hw.nets.transformer import lm_loss  # noqa: E402
from hw.run.stage_runner import capture_weighted_outputs  # noqa: E402
from parsim.workload import Decoder, Embedding, Head, Layer, TransformerShape  # noqa: E402

F64 = torch.float64
LLAMA = TransformerShape("llama", hidden=32, ffn=48, heads=4, kv_heads=2, head_dim=8, vocab=40, seq=12, dtype_bytes=8)
GPT = TransformerShape("gpt", hidden=24, ffn=40, heads=3, kv_heads=3, head_dim=8, vocab=30, seq=10, positions=16,
                       dtype_bytes=8)
LAYERS = [Layer("mlp", 16, 8), Layer("conv", 8, 8, side=6), Layer("down", 8, 8, side=4), Decoder(LLAMA), Decoder(GPT),
          Embedding(LLAMA), Embedding(GPT), Head(LLAMA), Head(GPT)]


class _Packed:
    """What autograd keeps for a saved tensor while the saved_tensors_hooks below are on: alive while it is kept."""

    def __init__(self, t: torch.Tensor):
        self.t = t


def _left_after_split_backward(layer, samples: int) -> int:
    """Bytes of the distinct storages autograd still keeps after an input-grad (graph retained) and each weighted
    module's weight-grad, as hw.run.cuda_graphs runs them, with the forward's output still held; the module's own
    tensors, its input and the targets (static tensors of the runner) left out."""
    torch.manual_seed(0)
    module = layer_module(layer).to(F64)
    if isinstance(layer, Embedding):
        x = torch.randint(layer.shape.vocab, (samples, layer.shape.seq))
    else:
        x = torch.randn(samples, *layer.in_shape, dtype=F64, requires_grad=True)
    targets = torch.randint(layer.shape.vocab, (samples, layer.shape.seq)) if isinstance(layer, Head) else None
    kept: list[weakref.ref] = []

    def pack(t: torch.Tensor) -> _Packed:
        packed = _Packed(t)
        kept.append(weakref.ref(packed))
        return packed

    forward: Callable[[], torch.Tensor] = lambda: module(x)  # noqa: E731
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda p: p.t), capture_weighted_outputs(module) as captured:
        y = forward()
        root = lm_loss(y, targets) if targets is not None else y
    wants_x = x.requires_grad
    grads = torch.autograd.grad(root, ([x] if wants_x else []) + [out for _, out in captured],
                                None if root.dim() == 0 else torch.ones_like(root), retain_graph=True, allow_unused=True)
    for (m, out), g in zip(captured, grads[1:] if wants_x else grads, strict=True):
        if g is not None:
            torch.autograd.grad(out, list(m.parameters(recurse=False)), g)
    del grads, captured
    own = {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers(), x]
           + ([targets] if targets is not None else [])}
    left = {p.t.untyped_storage().data_ptr(): p.t.untyped_storage().nbytes()
            for p in (ref() for ref in kept) if p is not None and p.t.untyped_storage().data_ptr() not in own}
    assert root.grad_fn is not None  # the forward's graph, still held
    return sum(left.values())


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.cost_key)
def test_a_weight_grad_leaves_what_only_ops_without_weights_keep(layer):
    """Per sample (the difference of two batch sizes): the activations' inputs or outputs, attention's tensors,
    the loss's log-softmax, which no weight-grad releases."""
    per_sample = _left_after_split_backward(layer, 4) - _left_after_split_backward(layer, 2)
    assert per_sample == 2 * layer.unweighted_stash_bytes_per_token
