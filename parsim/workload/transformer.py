"""Transformer layers, one sample a sequence: the token embedding, decoder blocks, and the final norm + LM head
+ cross-entropy loss.

Two block variants: "llama" (RMSNorm, causal grouped-query attention with rotary embeddings, RMSNorm, SwiGLU
MLP, no biases) and "gpt" (LayerNorm, causal multi-head attention, LayerNorm, GELU MLP, biases; learned position
embeddings). Attention is costed as flash attention runs it: causal, so only the s(s+1)/2 query-key pairs at or
below the diagonal are computed; the backward recomputes the scores (2.5x the forward's FLOPs, all of it
input-grad: the core has no weights); it keeps its inputs, output and per-row log-sum-exp, linear in s.
A decoder block is priced in two parts: its matmuls (profile key "llama@HxI") and its attention core
("attention@dD", D the head dim). Every formula is checked against the modules hw runs (tests/test_hw_models.py).
Selective recomputation (parsim.workload.recompute) runs the core's forward again in the backward and frees only
what the core alone keeps: its log-sum-exp (Decoder.core_freed_bytes_per_token says why no more).
"""

from __future__ import annotations

from dataclasses import dataclass

from parsim.errors import ModelError
from parsim.inputs import MAX_LAYERS, MAX_SIZE, shown
from parsim.workload.layers import Part

VARIANTS = ("llama", "gpt")
INDEX_BYTES = 8  # token ids and targets are int64
HINT = "; calibrate them with `python -m hw calibrate --transformer`"


@dataclass(frozen=True)
class TransformerShape:
    """The sizes every layer of one transformer shares (a Hugging Face config's, plus the sequence length)."""

    variant: str
    hidden: int
    ffn: int  # the MLP's inner width (intermediate_size)
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    seq: int  # tokens per sequence
    positions: int = 0  # learned position embeddings (GPT); 0 for rotary embeddings (Llama)
    dtype_bytes: int = 2

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ModelError(f"unknown transformer variant {self.variant!r}; parsim knows: {', '.join(VARIANTS)}")
        sizes = {"hidden": self.hidden, "ffn": self.ffn, "heads": self.heads, "kv_heads": self.kv_heads,
                 "head_dim": self.head_dim, "vocab": self.vocab, "seq": self.seq, "dtype_bytes": self.dtype_bytes}
        bad = [f"{k} {shown(v)}" for k, v in sizes.items()
               if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_SIZE]
        positions = self.positions
        if isinstance(positions, bool) or not isinstance(positions, int) or not 0 <= positions <= MAX_SIZE:
            bad.append(f"positions {shown(self.positions)}")
        if bad:
            raise ModelError(f"a transformer needs whole sizes >= 1 and <= {MAX_SIZE:,}, got {', '.join(bad)}")
        if self.heads % self.kv_heads:
            raise ModelError(f"{self.heads} attention heads do not split into {self.kv_heads} key/value groups")
        if self.variant == "gpt" and (self.kv_heads != self.heads or self.seq > self.positions):
            raise ModelError(f"a gpt model has one key/value head per head and at most {self.positions} "
                             f"positions, got {self.kv_heads} of {self.heads} heads and seq {self.seq}")

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def acc_bytes(self) -> int:
        """Norm statistics, attention's log-sum-exp and the loss: fp32, or the activations' dtype where wider."""
        return max(self.dtype_bytes, 4)

    @property
    def pairs(self) -> int:
        """Query-key pairs a causal sequence computes: s(s+1)/2."""
        return self.seq * (self.seq + 1) // 2


@dataclass(frozen=True)
class _SequenceLayer:
    """A transformer layer: one sample a sequence of `shape`; its width and dtype are the shape's."""

    shape: TransformerShape
    sample = "sequence"

    @property
    def hidden(self) -> int:
        return self.shape.hidden

    @property
    def dtype_bytes(self) -> int:
        return self.shape.dtype_bytes

    @property
    def in_shape(self) -> tuple[int, ...]:
        return (self.shape.seq, self.shape.hidden)

    @property
    def core_parts(self) -> tuple[Part, ...]:
        """Selective recomputation's: no attention core but a decoder block's (Decoder's own)."""
        return ()

    @property
    def core_freed_bytes_per_token(self) -> int:
        return 0

    core_saved_tensors = 0  # what its attention cores save, for selective's checkpoints (a decoder block's own)


# Tensors each layer's forward saves for autograd, as hw's modules save them on the CPU (test_hw_transformer.py),
# checkpointing's hooks running per tensor: a decoder block (RMSNorm's or LayerNorm's inputs and statistics, the
# projections' inputs and weights, rotary's tables, SDPA's q, k, v, output and log-sum-exp, the MLP's), the
# embedding's ids (and GPT's positions), the head's norm and matmul; the attention core alone. On a GPU, SDPA's
# flash kernel also saves its random-number state.
SAVED_TENSORS = {"llama": 36, "gpt": 24, "embed": 1, "embed+positions": 2, "head": 5, "head+layernorm": 7, "core": 5}


@dataclass(frozen=True)
class Decoder(_SequenceLayer):
    """One decoder block (see the module's docstring)."""

    @property
    def kind(self) -> str:
        return self.shape.variant

    out_shape = _SequenceLayer.in_shape

    @property
    def saved_tensors(self) -> int:
        return SAVED_TENSORS[self.shape.variant]

    core_saved_tensors = SAVED_TENSORS["core"]

    @property
    def _llama(self) -> bool:
        return self.shape.variant == "llama"

    @property
    def matmul_macs_per_token(self) -> int:
        """q, k, v and output projections, then the MLP: SwiGLU's gate, up and down (3 H I) or GELU's two (2 H I)."""
        t = self.shape
        mlp = (3 if self._llama else 2) * t.hidden * t.ffn
        return t.hidden * (t.q_width + 2 * t.kv_width) + t.q_width * t.hidden + mlp

    @property
    def largest_param(self) -> int:
        """Elements of its largest weight: an MLP matrix (H x I), the q or out projection, or GPT's fused qkv."""
        t = self.shape
        qkv = t.q_width + 2 * t.kv_width if not self._llama else t.q_width
        return t.hidden * max(t.ffn, qkv, t.q_width)

    @property
    def params(self) -> int:
        t = self.shape
        weights = self.matmul_macs_per_token
        if self._llama:  # two RMSNorm scales, no biases
            return weights + 2 * t.hidden
        # two LayerNorms (scale and shift), biases of the qkv, output, fc and projection layers
        return weights + 4 * t.hidden + (t.q_width + 2 * t.kv_width) + t.hidden + t.ffn + t.hidden

    @property
    def cost_key(self) -> str:
        """The matmul part's key at this shape: "llama@4096x14336" (hidden x MLP width)."""
        return f"{self.kind}@{self.shape.hidden}x{self.shape.ffn}"

    @property
    def attention_key(self) -> str:
        return f"attention@d{self.shape.head_dim}"

    @property
    def attention_flops(self) -> tuple[float, float, float]:
        """Per sequence: QK^T and PV over the causal pairs (4 h d per pair); the backward recomputes QK^T, then
        dV, dP, dQ and dK (10 h d per pair), all input-grad."""
        per_pair = self.shape.heads * self.shape.head_dim * self.shape.pairs
        return 4.0 * per_pair, 10.0 * per_pair, 0.0

    @property
    def parts(self) -> tuple[Part, ...]:
        mm = 2.0 * self.matmul_macs_per_token * self.shape.seq
        return (Part((self.cost_key, self.kind), (mm, mm, mm), HINT), self._attention_part)

    @property
    def _attention_part(self) -> Part:
        return Part((self.attention_key, "attention"), self.attention_flops, HINT)

    @property
    def core_parts(self) -> tuple[Part, ...]:
        """What selective recomputation runs again in the backward: the attention core, its forward priced as the
        block's attention part."""
        return (self._attention_part,)

    @property
    def core_freed_bytes_per_token(self) -> int:
        """What selective recomputation frees: the core's log-sum-exp (fp32, a head's per token). Checkpointed, the
        core still keeps q, k, v to run again, and its output is the output projection's kept input."""
        return self._per_seq(0, self.shape.heads)

    @property
    def out_bytes_per_token(self) -> int:
        return self.shape.seq * self.shape.hidden * self.shape.dtype_bytes

    def _per_seq(self, act: int, acc: int = 0) -> int:
        """Bytes per sequence of `act` activation-dtype and `acc` fp32 values per token."""
        return self.shape.seq * (act * self.shape.dtype_bytes + acc * self.shape.acc_bytes)

    @property
    def stash_bytes_per_token(self) -> int:
        """Kept for the backward, per token: each norm's input (H) and output (H, the next matmuls' input);
        attention's q, k, v (after rotary) and output; the MLP's gate and up outputs, the activation's
        output and the product (4 I, SwiGLU) or fc output and GELU output (2 I); fp32: each RMSNorm's rstd
        (LayerNorm: mean and rstd), and the log-sum-exp per head."""
        t = self.shape
        act = 4 * t.hidden + 2 * t.q_width + 2 * t.kv_width + (4 if self._llama else 2) * t.ffn
        return self._per_seq(act, t.heads + (2 if self._llama else 4))

    @property
    def unweighted_stash_bytes_per_token(self) -> int:
        """The part of the stash only ops without weights keep: attention's q, k, v and output and its
        log-sum-exp; the MLP's gate and up outputs and SiLU's output (SwiGLU's product is the down projection's
        input), or the fc output (GELU's input)."""
        t = self.shape
        return self._per_seq(2 * t.q_width + 2 * t.kv_width + (3 if self._llama else 1) * t.ffn, t.heads)

    @property
    def forward_workspace_bytes_per_token(self) -> int:
        """Live beyond the stash during the forward: the q and k projections before rotary embedding and
        three q-sized rotary temporaries (Llama), or the norm's fp32 copy of its input and square (GPT: none)."""
        t = self.shape
        if not self._llama:
            return self._per_seq(0, 2 * t.hidden)
        return max(self._per_seq(t.q_width + t.kv_width + 3 * t.q_width), self._per_seq(0, 2 * t.hidden))

    @property
    def backward_workspace_bytes_per_token(self) -> int:
        """Live beyond the stash during the backward, at its peak in the MLP: the output's gradient (H) and
        the gradients of the MLP's inner tensors not yet matched by freed stash (2 I SwiGLU, I GELU)."""
        return self._per_seq(self.shape.hidden + (2 if self._llama else 1) * self.shape.ffn)

    @property
    def captured_bytes_per_token(self) -> int:
        """Outputs of weighted modules that a split backward keeps from the forward for its weight-grad
        and that the stash does not hold: the q and k projections before rotary embedding (Llama) and the
        output and down projections' outputs (H each)."""
        t = self.shape
        return self._per_seq((t.q_width + t.kv_width if self._llama else 0) + 2 * t.hidden)

    @property
    def weight_grad_held_bytes_per_token(self) -> int:
        """Gradients of every weighted module's output, kept by a split backward's input-grad for its
        weight-grad: two norms (H each), q, k, v, the output projection (H), the MLP's gate and up (2 I, or
        fc's I) and down projection (H)."""
        t = self.shape
        return self._per_seq(4 * t.hidden + t.q_width + 2 * t.kv_width + (2 if self._llama else 1) * t.ffn)

    @property
    def early_freed_bytes_per_token(self) -> int:
        """What of the stash a split backward's weight-grad frees as it goes: the norms' inputs (H each) and
        statistics, and the down projection's input (SwiGLU's product) or the MLP's second linear's (GELU's output);
        the norms' outputs, captured outputs the projections keep, go when it ends."""
        return self._per_seq(2 * self.shape.hidden + self.shape.ffn, 2 if self._llama else 4)


@dataclass(frozen=True)
class Embedding(_SequenceLayer):
    """Token ids -> hidden states: a lookup of one row per token (GPT adds a learned position row)."""

    kind = "embed"

    @property
    def in_shape(self) -> tuple[int, ...]:
        return (self.shape.seq,)

    @property
    def saved_tensors(self) -> int:
        return SAVED_TENSORS["embed+positions" if self.shape.positions else "embed"]

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.shape.seq, self.shape.hidden)

    @property
    def params(self) -> int:
        return (self.shape.vocab + self.shape.positions) * self.shape.hidden

    @property
    def largest_param(self) -> int:
        """Elements of its token table (V x H; learned positions are a table apart)."""
        return max(self.shape.vocab, self.shape.positions) * self.shape.hidden

    @property
    def cost_key(self) -> str:
        return f"embed@{self.shape.vocab}x{self.shape.hidden}"

    @property
    def parts(self) -> tuple[Part, ...]:
        """Work is elements moved: a row gathered per token (and per position), scattered back in the
        weight-grad; the ids take no gradient. Zeroing and accumulating the V x H gradient is per micro-batch,
        in the fitted fixed cost of the shape's key."""
        rows = 2 if self.shape.positions else 1
        moved = float(rows * self.shape.seq * self.shape.hidden)
        return (Part((self.cost_key, self.kind), (moved, 0.0, moved), HINT),)

    @property
    def out_bytes_per_token(self) -> int:
        return self.shape.seq * self.shape.hidden * self.shape.dtype_bytes

    @property
    def stash_bytes_per_token(self) -> int:
        """The ids, which the lookup's backward keeps."""
        return self.shape.seq * INDEX_BYTES

    unweighted_stash_bytes_per_token = 0  # the ids, which the lookup (a weighted module) keeps

    @property
    def forward_workspace_bytes_per_token(self) -> int:
        """GPT: the token rows before the position rows are added."""
        return self.out_bytes_per_token if self.shape.positions else 0

    @property
    def backward_workspace_bytes_per_token(self) -> int:
        """The output's gradient, and the sorted ids the scatter uses."""
        return self.out_bytes_per_token + 2 * self.shape.seq * INDEX_BYTES

    @property
    def captured_bytes_per_token(self) -> int:
        return self.forward_workspace_bytes_per_token

    @property
    def weight_grad_held_bytes_per_token(self) -> int:
        return self.out_bytes_per_token

    @property
    def early_freed_bytes_per_token(self) -> int:
        """The ids, which the lookup's weight-grad releases."""
        return self.stash_bytes_per_token


@dataclass(frozen=True)
class Head(_SequenceLayer):
    """Hidden states -> loss: the final norm, the LM head (H x V, no bias) and cross-entropy on fp32 logits."""

    kind = "head"

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.shape.seq, self.shape.vocab)

    @property
    def _norm_vectors(self) -> int:
        return 2 if self.shape.positions else 1  # LayerNorm's scale and shift, or RMSNorm's scale

    @property
    def saved_tensors(self) -> int:
        return SAVED_TENSORS["head+layernorm" if self.shape.positions else "head"]

    @property
    def params(self) -> int:
        return self._norm_vectors * self.shape.hidden + self.shape.hidden * self.shape.vocab

    @property
    def largest_param(self) -> int:
        """Elements of its output matrix (H x V)."""
        return self.shape.hidden * self.shape.vocab

    @property
    def cost_key(self) -> str:
        return f"head@{self.shape.hidden}x{self.shape.vocab}"

    @property
    def parts(self) -> tuple[Part, ...]:
        """The H x V matmul in each op; the norm and the loss (softmax over V) ride on its rate."""
        f = 2.0 * self.shape.seq * self.shape.hidden * self.shape.vocab
        return (Part((self.cost_key, self.kind), (f, f, f), HINT),)

    @property
    def out_bytes_per_token(self) -> int:
        return self.shape.seq * self.shape.vocab * self.shape.dtype_bytes

    def _vocab_bytes(self, act: int, acc: int) -> int:
        return self.shape.seq * self.shape.vocab * (act * self.shape.dtype_bytes + acc * self.shape.acc_bytes)

    @property
    def stash_bytes_per_token(self) -> int:
        """The norm's input and output (H each), its statistics (fp32), the log-softmax of the fp32 logits
        (V) and the targets."""
        t = self.shape
        return t.seq * (2 * t.hidden * t.dtype_bytes + self._norm_vectors * t.acc_bytes + INDEX_BYTES) + \
            self._vocab_bytes(0, 1)

    @property
    def loss_stash_bytes_per_token(self) -> int:
        """What the loss keeps: its fp32 log-softmax (the targets are the batch's); outside a checkpoint of the
        stage (parsim.workload.recompute)."""
        return self._vocab_bytes(0, 1)

    @property
    def unweighted_stash_bytes_per_token(self) -> int:
        """The part of the stash without weights: the loss's."""
        return self.loss_stash_bytes_per_token

    @property
    def _upcast(self) -> int:
        return 1 if self.shape.acc_bytes > self.shape.dtype_bytes else 0

    @property
    def forward_workspace_bytes_per_token(self) -> int:
        """The logits, and their fp32 copy for the loss (none where the activations are fp32 already)."""
        return self._vocab_bytes(1, self._upcast)

    @property
    def backward_workspace_bytes_per_token(self) -> int:
        """The loss's gradient and the log-softmax's (fp32, V each), while the log-softmax is still kept."""
        return self._vocab_bytes(0, 2)

    @property
    def captured_bytes_per_token(self) -> int:
        """The logits, which a split backward keeps for the LM head's weight-grad."""
        return self._vocab_bytes(1, 0)

    @property
    def weight_grad_held_bytes_per_token(self) -> int:
        """The gradients of the norm's output (H) and of the logits (V)."""
        return self.shape.seq * (self.shape.hidden + self.shape.vocab) * self.shape.dtype_bytes

    @property
    def early_freed_bytes_per_token(self) -> int:
        """What of the stash a split backward's weight-grad frees as it goes: the norm's input and statistics; the
        norm's output (the LM head's input, a captured output) goes when it ends."""
        t = self.shape
        return t.seq * (t.hidden * t.dtype_bytes + self._norm_vectors * t.acc_bytes)


def transformer_layers(shape: TransformerShape, blocks: int) -> tuple[_SequenceLayer, ...]:
    """The embedding, `blocks` decoder blocks and the head: a transformer's pipelined layers, in order."""
    if not 1 <= blocks <= MAX_LAYERS:
        raise ModelError(f"a transformer needs at least one decoder block and at most {MAX_LAYERS:,}, "
                         f"got {shown(blocks)}")
    return (Embedding(shape),) + (Decoder(shape),) * blocks + (Head(shape),)


def describe(shape: TransformerShape, blocks: int) -> str:
    """'8 x llama(h=2048, 16/8 heads, ffn 8192), vocab 32000, seq 2048'."""
    heads = f"{shape.heads}/{shape.kv_heads}" if shape.kv_heads != shape.heads else f"{shape.heads}"
    return (f"{blocks} x {shape.variant}(h={shape.hidden}, {heads} heads, ffn {shape.ffn}), vocab {shape.vocab}, "
            f"seq {shape.seq}")
