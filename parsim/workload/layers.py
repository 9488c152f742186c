"""Layer kinds: what one layer holds and costs per sample (parameters, FLOPs per op, activations kept and sent).

Every layer kind (the MLP and conv blocks here, the transformer's in parsim.workload.transformer) answers the
same questions: `params`, `in_shape`/`out_shape` of one sample, `out_bytes_per_token` (what it hands the next
layer), `stash_bytes_per_token` (what autograd keeps for its backward) and `parts` (its costed parts: the
profile keys that price each, and the work each does per sample in forward, input-grad and weight-grad); for
selective recomputation (parsim.workload.recompute), `core_parts` and `core_freed_bytes_per_token` (a decoder
block's attention core; none here). "Per token" means per sample: a token of an MLP stack, an image of a conv net,
a sequence of a transformer.
"""

from __future__ import annotations

from dataclasses import dataclass

from parsim.errors import ModelError
from parsim.inputs import MAX_SIZE, shown

MAX_DTYPE_BYTES = 16  # complex128, the widest torch dtype


@dataclass(frozen=True)
class Part:
    """One costed part of a layer: the profile keys that price it (first found wins: the shape's, then the
    kind's), its work per sample in forward, input-grad and weight-grad, and how to calibrate it if missing.

    Work is FLOPs (2 per multiply-add) for every kind but the embedding, whose work is elements moved. An op
    with no work runs no kernel and costs nothing.
    """

    keys: tuple[str, ...]
    work: tuple[float, float, float]
    hint: str = ""


@dataclass(frozen=True)
class Kind:
    """A layer kind's formulas, per sample, for a residual block on a C x S x S map (an MLP token is a 1 x 1 map).

    Forward multiply-adds are `macs` C^2 S^2; input-grad and weight-grad each cost the same again.
    """

    macs: int  # forward multiply-adds per C^2 S^2
    weights: int  # weights per C^2
    vectors: int  # biases and norm scales and shifts per C
    stash: int  # elements autograd keeps from forward to backward, per C S^2
    unweighted: int  # of those, the elements only ops without weights keep (activations), per C S^2
    # a split backward's (hw.run.stage_runner): the weighted modules' outputs its forward captures that nothing in
    # the stash already holds, and the gradients of every weighted module's output its input-grad keeps for the
    # weight-grad, per C S^2 (0: not modelled); of the stash, what its weight-grad frees as it goes: the inputs only
    # weighted modules keep, but weighted modules' outputs (its list of captured outputs holds those to its end)
    captured: int = 0
    held: int = 0
    early: int = 0
    largest: int = 0  # weights per C^2 of its largest parameter (a later backward's gradient temporary); 0: all
    # its backward's working memory beyond its stash, per C S^2: the gradient reaching its output, and the most of its
    # inner gradients alive at once beyond the saved tensors already freed (0: not modelled)
    backward: int = 0
    peak_weights: int = 0  # weights per C^2 and vectors per C whose gradients exist at that peak (0, 0: all)
    peak_vectors: int = 0
    shrink: int = 1  # the input has C / shrink channels on a (shrink S)^2 map: 2 for a downsampling block
    saved: int = 0  # tensors autograd saves in its forward, parameters and statistics included (hw's module's count)
    spatial: bool = True  # has a side S (profile key "kind@CxS"); False: vectors of C (key "kind@C")
    sample: str = "image"  # what one sample is, for reports


KINDS = {
    # x + W2 gelu(W1 layernorm(x)), 4x expansion: two C x 4C matmuls; biases 4C + C, layernorm 2C;
    # kept: layernorm input and output (C each), fc1 output and gelu output (4C each); gelu alone keeps fc1's output;
    # a split backward captures fc2's output (C; layernorm's and fc1's are in the stash) and keeps the gradients of
    # the layernorm's, fc1's and fc2's outputs (C + 4C + C); its weight-grad frees the layernorm's input and fc2's
    # (GELU's output) as it goes, the layernorm's output (fc1's input, a captured output) when it ends; its backward
    # holds, beyond the stash, the output's gradient (C) and 4C: fc2's input gradient beside GELU's output, then,
    # that output freed, GELU's input gradient beside it (each node's saved tensors go once it has run), when fc2's
    # gradients (4C^2 + C) alone are made
    "mlp": Kind(macs=8, weights=8, vectors=7, stash=10, unweighted=4, captured=1, held=6, early=5, largest=4,
                backward=5, peak_weights=4, peak_vectors=1, saved=10, spatial=False,
                sample="token"),
    # x + conv3x3(relu(bn(conv3x3(relu(bn(x)))))), no conv bias: two 9 C^2 convs, two batch norms' affine (2C each);
    # kept: bn1 input, relu1 output (conv1's input), conv1 output (bn2's input), relu2 output (conv2's input); the
    # relus keep their outputs too (the same tensors as the convs' inputs); a split backward captures both batch
    # norms' outputs (each relu keeps its own output instead) and conv2's, and keeps the gradients of all four
    # modules' outputs (conv2's is the block's output gradient); its weight-grad frees bn1's input as it goes, conv1's
    # output (bn2's input, a captured output) when it ends; its backward holds, beyond the stash, the output's
    # gradient and the second ReLU's input and output gradients (3 C S^2), when conv2's weight gradient alone is made
    "conv": Kind(macs=18, weights=18, vectors=4, stash=4, unweighted=2, captured=3, held=4, early=1, largest=9,
                 backward=3, peak_weights=9, saved=18),
    # C/2 x 2S x 2S -> C x S x S: a = relu(bn(x)); conv3x3/2(a) (4.5 C^2) -> bn-relu -> conv3x3 (9 C^2), plus the
    # shortcut conv1x1/2(a) (0.5 C^2); batch norms over C/2 and C; kept: bn1 input and a (2 C S^2 each),
    # conv1 output and relu2 output (C S^2 each); the relus keep a and relu2's output; a split backward captures
    # bn1's output (2), bn2's, conv2's and the shortcut's, and keeps their and conv1's output gradients, conv2's and
    # the shortcut's one tensor (the sum's); its weight-grad frees bn1's input as it goes, conv1's output when it ends;
    # its backward holds, beyond the stash, the output's gradient and 2 C S^2: the second ReLU's gradients, then, its
    # output and conv1's freed, the first conv's and the shortcut's gradients of a (added in place), when all but
    # bn1's gradients are made
    "down": Kind(macs=14, weights=14, vectors=3, stash=6, unweighted=3, captured=5, held=5, early=2, largest=9,
                 backward=3, peak_weights=14, peak_vectors=2, saved=20,
                 shrink=2),
}


@dataclass(frozen=True)
class Layer:
    """One layer's work per sample (a token for "mlp", an image for "conv" and "down"); the profile's
    costs for its kind turn FLOPs into seconds. `hidden` is the width: hidden size, or channels C."""

    kind: str
    hidden: int
    dtype_bytes: int = 2
    side: int = 1  # the feature map's side S for conv kinds; 1 for an MLP

    def __post_init__(self) -> None:
        k = KINDS.get(self.kind)
        if k is None:
            raise ModelError(f"unknown layer kind {self.kind!r}; parsim knows: {', '.join(sorted(KINDS))}")
        sizes = (self.hidden, self.side, self.dtype_bytes)
        if (any(isinstance(v, bool) or not isinstance(v, int) for v in sizes) or min(sizes) < 1
                or max(self.hidden, self.side) > MAX_SIZE or self.dtype_bytes > MAX_DTYPE_BYTES):
            raise ModelError(f"a {self.kind} layer needs whole hidden and side >= 1 and <= {MAX_SIZE:,}, and "
                             f"dtype_bytes from 1 to {MAX_DTYPE_BYTES}, got {shown(self.hidden)}, {shown(self.side)}, "
                             f"{shown(self.dtype_bytes)}")
        if self.hidden % k.shrink or (not k.spatial and self.side != 1):
            raise ModelError(f"a {self.kind} layer needs " + (f"channels divisible by {k.shrink}, got {self.hidden}"
                                                               if k.spatial else f"no side, got {self.side}"))

    @property
    def formulas(self) -> Kind:
        return KINDS[self.kind]

    @property
    def sample(self) -> str:
        """What one sample is: "token" or "image"."""
        return self.formulas.sample

    @property
    def flops_per_token(self) -> float:
        """FLOPs of the forward (and of each of input-grad, weight-grad) per sample: 2 per multiply-add."""
        return 2.0 * self.formulas.macs * self.hidden**2 * self.side**2

    @property
    def params(self) -> int:
        return self.formulas.weights * self.hidden**2 + self.formulas.vectors * self.hidden

    @property
    def largest_param(self) -> int:
        """Elements of its largest parameter (fc1's or fc2's C x 4C, a 3x3 conv's C x C x 9)."""
        return self.formulas.largest * self.hidden**2 or self.params

    @property
    def in_shape(self) -> tuple[int, ...]:
        """One sample's input: (C,) for an MLP, (channels, side, side) for a conv kind."""
        k = self.formulas
        return (self.hidden // k.shrink, self.side * k.shrink, self.side * k.shrink) if k.spatial else (self.hidden,)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.hidden, self.side, self.side) if self.formulas.spatial else (self.hidden,)

    @property
    def out_bytes_per_token(self) -> int:
        return self.hidden * self.side**2 * self.dtype_bytes

    @property
    def stash_bytes_per_token(self) -> int:
        """Activations kept for the backward (see KINDS)."""
        return self.formulas.stash * self.hidden * self.side**2 * self.dtype_bytes

    @property
    def saved_tensors(self) -> int:
        """Tensors its forward saves for autograd: torch.utils.checkpoint's hooks run once for each in a checkpoint
        and again in its recompute (parsim.sim.lower prices them)."""
        return self.formulas.saved

    @property
    def unweighted_stash_bytes_per_token(self) -> int:
        """The part of the stash that only ops without weights keep: a split backward's weight-grad never frees it
        (see parsim.workload.graph_memory)."""
        return self.formulas.unweighted * self.hidden * self.side**2 * self.dtype_bytes

    @property
    def captured_bytes_per_token(self) -> int:
        """What a split backward's forward captures beyond the stash (see KINDS)."""
        return self.formulas.captured * self.hidden * self.side**2 * self.dtype_bytes

    @property
    def weight_grad_held_bytes_per_token(self) -> int:
        """The output gradients a split backward's input-grad keeps for its weight-grad (see KINDS)."""
        return self.formulas.held * self.hidden * self.side**2 * self.dtype_bytes

    @property
    def early_freed_bytes_per_token(self) -> int:
        """What of the stash a split backward's weight-grad frees as it goes, module by module (see KINDS)."""
        return self.formulas.early * self.hidden * self.side**2 * self.dtype_bytes

    # the forward's working memory (see parsim.workload.memory): not modelled for these kinds
    forward_workspace_bytes_per_token = 0

    @property
    def backward_workspace_bytes_per_token(self) -> int:
        """Live beyond the stash while its backward runs (see KINDS; 0 where not modelled: the conv kinds)."""
        return self.formulas.backward * self.hidden * self.side**2 * self.dtype_bytes

    @property
    def backward_peak_params(self) -> int:
        """Parameters whose gradients its backward has made when its working memory peaks (see KINDS)."""
        k = self.formulas
        return k.peak_weights * self.hidden**2 + k.peak_vectors * self.hidden if k.peak_weights else self.params

    @property
    def core_parts(self) -> tuple[Part, ...]:
        """Selective recomputation's: no attention core, so everything kept and nothing run again."""
        return ()

    @property
    def core_freed_bytes_per_token(self) -> int:
        return 0

    core_saved_tensors = 0

    @property
    def cost_key(self) -> str:
        """The profile key of costs fitted at this layer's shape: "mlp@2048", "conv@64x56"."""
        return f"{self.kind}@{self.hidden}" + (f"x{self.side}" if self.formulas.spatial else "")

    @property
    def parts(self) -> tuple[Part, ...]:
        """One part, priced by the shape's costs or the kind's: the same FLOPs in each op."""
        hint = "; calibrate them with `python -m hw calibrate --conv`" if self.formulas.spatial else ""
        f = self.flops_per_token
        return (Part((self.cost_key, self.kind), (f, f, f), hint),)
