"""What a split backward leaves held where the forward's output stays (hw's graphed runner keeps it for good): the
stash that only ops without weights keep, `unweighted_stash_bytes_per_token`, against autograd on the modules hw runs.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")

from hw.nets.blocks import layer_module  # noqa: E402
from hw.nets.transformer import lm_loss  # noqa: E402
from hw.run.stage_runner import capture_weighted_outputs  # noqa: E402
from parsim.workload import Decoder, Embedding, Head, Layer, TransformerShape  # noqa: E402
from parsim.workload.transformer import INDEX_BYTES  # noqa: E402

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


def _made(layer, samples: int) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor | None]:
    """The module hw runs for `layer` in fp64, a batch of `samples` for it (token ids for an embedding) and, for a
    head, its targets; seeded, so two calls make the same."""
    torch.manual_seed(0)
    module = layer_module(layer).to(F64)
    if isinstance(layer, Embedding):
        x = torch.randint(layer.shape.vocab, (samples, layer.shape.seq))
    else:
        x = torch.randn(samples, *layer.in_shape, dtype=F64, requires_grad=True)
    targets = torch.randint(layer.shape.vocab, (samples, layer.shape.seq)) if isinstance(layer, Head) else None
    return module, x, targets


def _left_after_split_backward(layer, samples: int) -> int:
    """Bytes of the distinct storages autograd still keeps after an input-grad (graph retained) and each weighted
    module's weight-grad, as hw.run.cuda_graphs runs them, with the forward's output still held; the module's own
    tensors, its input and the targets (static tensors of the runner) left out."""
    module, x, targets = _made(layer, samples)
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


def _weight_grad_frees(layer, samples: int) -> tuple[int, int]:
    """Bytes hw.run.cuda_graphs' weight-grad frees by the CPU allocator's count (the whole run profiled: it counts
    only frees of what it saw allocated): while it runs, its list of captured outputs and output gradients still
    held (the gradients it makes less what it adds), and when that list goes. Its input and the targets are held
    here as the graphed runner's static tensors hold them, and the forward's output as its kept output."""
    from torch.profiler import ProfilerActivity, profile, record_function

    module, x, targets = _made(layer, samples)
    made: list[torch.Tensor] = []
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with capture_weighted_outputs(module) as captured:
            y = module(x)
        root = lm_loss(y, targets) if targets is not None else y
        wanted = ([x] if x.requires_grad else []) + [out for _, out in captured]
        grads = torch.autograd.grad(root, wanted, None if root.dim() == 0 else torch.ones_like(root),
                                    retain_graph=True, allow_unused=True)[len(wanted) - len(captured):]
        work = [(m, out, g) for (m, out), g in zip(captured, grads, strict=True) if g is not None]
        del grads, captured, wanted
        with record_function("W"):
            for m, out, g in work:
                made += torch.autograd.grad(out, list(m.parameters(recurse=False)), g)
            del m, out, g
        with record_function("end"):
            del work
    events = list(prof.profiler.kineto_results.events())

    def added(name: str) -> int:
        (span,) = [e for e in events if e.name() == name]
        return sum(e.nbytes() for e in events if e.name() == "[memory]"
                   and span.start_ns() <= e.start_ns() <= span.start_ns() + span.duration_ns())

    assert root.grad_fn is not None  # the forward's graph, still held
    return sum(t.untyped_storage().nbytes() for t in made) - added("W"), -added("end")


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.cost_key)
def test_a_weight_grad_frees_inputs_only_weighted_modules_keep_as_it_goes_and_the_rest_when_it_ends(layer):
    """Per sample (the difference of two batch sizes): what the weight-grad releases before it ends (each module's
    saved inputs that no op without weights and no captured output keeps) is the layer's
    `early_freed_bytes_per_token`, less its input (fp64 values or int64 ids, held here; the MLP block's stash leaves
    out its layernorm's two statistics a token, which go too); what goes with its list is the rest of the stash but
    the unweighted part, the captured outputs and the held output gradients (a head's captured logits and its
    targets are the runner's kept output and static tensor, held here)."""
    (early4, end4), (early2, end2) = _weight_grad_frees(layer, 4), _weight_grad_frees(layer, 2)
    statistics = 2 * 8 if layer.kind == "mlp" else 0
    assert early4 - early2 == 2 * (layer.early_freed_bytes_per_token - math.prod(layer.in_shape) * 8 + statistics)
    rest = layer.stash_bytes_per_token - layer.unweighted_stash_bytes_per_token - layer.early_freed_bytes_per_token
    at_end = rest + layer.captured_bytes_per_token + layer.weight_grad_held_bytes_per_token
    if isinstance(layer, Head):
        at_end -= layer.captured_bytes_per_token + layer.shape.seq * INDEX_BYTES
    assert end4 - end2 == 2 * at_end
