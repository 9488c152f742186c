"""Tensor parallelism (Megatron-LM's): each layer's matmuls split over t GPUs of one node.

A layer split t ways (`Split`) answers the same questions as the layer (parsim.workload.layers): its parameters,
FLOPs and kept activations per GPU, and beside them `collectives`, the all-reduces (or, with sequence parallelism,
reduce-scatters and all-gathers) each op issues on the compute stream, which the op's GPU time includes
(parsim.workload.costs.layer_works): they block the compute as torch's DTensor and Megatron's NCCL calls do.

- MLP block x + W2 gelu(W1 ln(x)): W1 column-parallel, W2 row-parallel; one all-reduce of the block's output in the
  forward, one of its input's gradient in the backward (Megatron's g and f).
- Decoder block: q, k, v and the MLP's gate/up (or fc) column-parallel, the out-projection and down (or proj)
  row-parallel, heads and the MLP's width split t ways; two all-reduces forward and two backward.
- Embedding: vocab-parallel (each GPU holds V/t rows, the output all-reduced); head: vocab-parallel with the
  parallel cross-entropy (torch's loss_parallel: three all-reduces of one fp32 per token), its input's gradient
  all-reduced. Both are split, not replicated, because at t = 8 a replicated Llama 3 head would be ~18 blocks' time.
- Norms, residual adds and row-parallel biases are replicated; with sequence parallelism (`sequence`) the norms
  run on a t-th of the sequence, each all-reduce becomes a reduce-scatter and each identity before a
  column-parallel linear an all-gather (forward; the reverse in the backward).

Memory follows Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", table 2),
except that torch's DTensor keeps the all-gathered input of a column-parallel linear whole (Megatron gathers it
again in the backward), so with sequence parallelism the norms' outputs stay H per token.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from parsim.errors import ModelError, ProfileError
from parsim.profile import LAYER_OPS, CollectiveSpec, LinkSpec, Profile
from parsim.workload.layers import Layer, Part
from parsim.workload.models import Model
from parsim.workload.transformer import INDEX_BYTES, Decoder, Embedding, Head

OPS = LAYER_OPS
PASSES = {"allreduce": 2, "reduce_scatter": 1, "all_gather": 1}  # a ring's passes over (t-1)/t of the bytes
DEGREES = (1, 2, 4, 8)  # what plan tries
RUNTIMES = ("hw", "torch")  # the runtimes hw runs split layers under (the graphed ones capture no collectives)


@dataclass(frozen=True)
class TensorParallel:
    """A tensor-parallel degree and whether activations outside the matmuls are split by sequence too."""

    degree: int = 1
    sequence: bool = False


NONE = TensorParallel()


@dataclass(frozen=True)
class Collective:
    """One collective an op issues on its TP group: its kind and the whole tensor's bytes per sample."""

    op: int  # index into OPS
    kind: str  # "allreduce", "reduce_scatter" or "all_gather"
    bytes_per_token: int


def check_tensor_parallel(model: Model, tp: TensorParallel, gpus_per_node: int | None = None,
                          samples: int | None = None) -> None:
    """One clear error where `model` cannot be split `tp.degree` ways within a node of `gpus_per_node` GPUs (with
    sequence parallelism, an MLP stack's micro-batch of `samples` tokens split t ways too)."""
    t = tp.degree
    if t < 1:
        raise ModelError(f"a tensor-parallel degree is a whole number >= 1, got {t}")
    if tp.sequence and t < 2:
        raise ModelError("sequence parallelism splits what tensor parallelism replicates: it needs "
                         "--tensor-parallel 2 or more")
    if t == 1:
        return
    if gpus_per_node is not None and (t > gpus_per_node or gpus_per_node % t):
        raise ModelError(f"a tensor-parallel group stays within a node's NVLink: {t} does not divide the "
                         f"profile's {gpus_per_node} GPUs per node")
    for layer in dict.fromkeys(_unsplit(x) for x in model.layers):
        sizes = _split_sizes(layer, tp)
        bad = [f"{name} {size}" for name, size in sizes.items() if size % t]
        if bad:
            raise ModelError(f"{layer.cost_key} does not split {t} ways: {', '.join(bad)} not divisible by {t}")
    if tp.sequence and samples is not None and model.sample == "token" and samples % t:
        raise ModelError(f"sequence parallelism splits each micro-batch's {samples} tokens {t} ways: they do not "
                         "divide evenly")


def _unsplit(layer: Any) -> Any:
    return layer.layer if isinstance(layer, Split) else layer


def _split_sizes(layer: Any, tp: TensorParallel) -> dict[str, int]:
    """The sizes that tensor parallelism divides by t, by name."""
    if isinstance(layer, Decoder):
        s = layer.shape
        return {"heads": s.heads, "key/value heads": s.kv_heads, "ffn": s.ffn} | ({"seq": s.seq} if tp.sequence else {})
    if isinstance(layer, (Embedding, Head)):
        return {"vocab": layer.shape.vocab} | ({"seq": layer.shape.seq} if tp.sequence else {})
    if isinstance(layer, Layer) and layer.kind == "mlp":
        return {"hidden": layer.hidden}
    raise ModelError(f"tensor parallelism splits MLP blocks and transformers; {layer.cost_key} has no matmuls "
                     "parsim splits")


def split_model(model: Model, tp: TensorParallel) -> Model:
    """`model` with each layer split as tensor parallelism splits it (the model itself where t is 1)."""
    if tp.degree == 1:
        return model
    return replace(model, layers=tuple(Split(layer, tp) for layer in model.layers))


@dataclass(frozen=True)
class Split:
    """One GPU's share of a layer split `tp.degree` ways (see the module's docstring); per sample, as layers are."""

    layer: Any
    tp: TensorParallel

    # what the layer is, unchanged
    @property
    def kind(self) -> str:
        return str(self.layer.kind)

    @property
    def hidden(self) -> int:
        return int(self.layer.hidden)

    @property
    def side(self) -> int:
        return int(getattr(self.layer, "side", 1))

    @property
    def dtype_bytes(self) -> int:
        return int(self.layer.dtype_bytes)

    @property
    def sample(self) -> str:
        return str(self.layer.sample)

    @property
    def in_shape(self) -> tuple[int, ...]:
        return tuple(self.layer.in_shape)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return tuple(self.layer.out_shape)

    @property
    def cost_key(self) -> str:
        return f"{self.layer.cost_key}/tp{self.tp.degree}"

    # what one GPU holds and does
    @property
    def _t(self) -> int:
        return self.tp.degree

    @property
    def parts(self) -> tuple[Part, ...]:
        """Each part's work divided by t, priced by the split shape's costs where calibrated ("mlp@2048/tp2"),
        else the whole shape's at the split work (the same FLOPs per token as the whole shape's at a t-th of the
        tokens), else the kind's."""
        return tuple(self._split_part(p) for p in self.layer.parts)

    @property
    def core_parts(self) -> tuple[Part, ...]:
        """The attention core's part (selective recomputation), split as `parts` splits it: its heads over t."""
        return tuple(self._split_part(p) for p in self.layer.core_parts)

    def _split_part(self, p: Part) -> Part:
        forward, backward_input, backward_weight = (w / self._t for w in p.work)
        return Part((f"{p.keys[0]}/tp{self._t}", *p.keys), (forward, backward_input, backward_weight), p.hint)

    @property
    def params(self) -> int:
        replicated = self._replicated_params
        return int((self.layer.params - replicated) // self._t + replicated)

    @property
    def largest_param(self) -> int:
        """Elements of its largest parameter on one GPU: every matrix is split t ways."""
        return int(getattr(self.layer, "largest_param", self.layer.params)) // self._t

    @property
    def _replicated_params(self) -> int:
        """Parameters every GPU of the group holds whole: norms, row-parallel biases, learned positions."""
        x = self.layer
        if isinstance(x, Decoder):
            h = x.shape.hidden
            return 2 * h if x.shape.variant == "llama" else 4 * h + 2 * h
        if isinstance(x, Embedding):
            return x.shape.positions * x.shape.hidden
        if isinstance(x, Head):
            return (2 if x.shape.positions else 1) * x.shape.hidden
        return int(3 * x.hidden)  # the MLP block's layernorm (2h) and fc2's bias

    @property
    def _act(self) -> int:
        """Bytes per sample of the activation between blocks (what a row-parallel linear reduces)."""
        x = self.layer
        if isinstance(x, (Decoder, Embedding, Head)):
            return x.shape.seq * x.shape.hidden * x.shape.dtype_bytes
        return int(x.hidden * x.dtype_bytes)

    @property
    def _sp(self) -> int:
        """What sequence parallelism divides the replicated activations by: t, or 1 without it."""
        return self._t if self.tp.sequence else 1

    @property
    def out_bytes_per_token(self) -> int:
        """The output handed on: whole on every GPU, or a t-th of the sequence with sequence parallelism."""
        if isinstance(self.layer, Head):
            return int(self.layer.out_bytes_per_token) // self._t  # the vocab-parallel logits
        return int(self.layer.out_bytes_per_token) // self._sp

    @property
    def collectives(self) -> tuple[Collective, ...]:
        """The collectives each op issues (see the module's docstring), bytes of the whole tensor per sample."""
        x, act, sp = self.layer, self._act, self.tp.sequence
        g_fwd = Collective(0, "reduce_scatter" if sp else "allreduce", act)  # after a row-parallel linear
        f_fwd = (Collective(0, "all_gather", act),) if sp else ()  # before a column-parallel linear
        f_bwd = Collective(1, "reduce_scatter" if sp else "allreduce", act)  # the input's gradient
        g_bwd = (Collective(1, "all_gather", act),) if sp else ()  # the output's gradient
        if isinstance(x, Embedding):  # no input gradient: the output's is gathered before the weight-grad
            return (g_fwd,) + tuple(replace(c, op=2) for c in g_bwd)
        if isinstance(x, Head):  # the loss's max, sum of exponentials and target logit: fp32 per token
            loss = Collective(0, "allreduce", x.shape.seq * x.shape.acc_bytes)
            return f_fwd + (loss,) * 3 + (f_bwd,)
        sub_blocks = 2 if isinstance(x, Decoder) else 1
        return (f_fwd + (g_fwd,) + g_bwd + (f_bwd,)) * sub_blocks

    @property
    def matrices(self) -> int:
        """Weight matrices split t ways, each a DTensor whose dispatch costs the host (HostCosts.tp_forward_s):
        q, k, v, out, gate, up, down in a Llama block (q, k, v, out, fc, proj in GPT's), fc1 and fc2 in an MLP
        block, the table of an embedding or a head."""
        x = self.layer
        if isinstance(x, Decoder):
            return 7 if x.shape.variant == "llama" else 6
        return 1 if isinstance(x, (Embedding, Head)) else 2

    # memory, per sample: the split parts divided by t, the replicated ones as they were (or by sequence)
    def _values(self, replicated: int, split: int, acc_replicated: int = 0, acc_split: int = 0) -> int:
        """Bytes per sample of activation-dtype values (replicated per token, and split t ways) and fp32 ones."""
        x, t, sp = self.layer, self._t, self._sp
        if isinstance(x, Layer):
            return (replicated * t // sp + split) * x.dtype_bytes // t
        s = x.shape
        acc = (acc_replicated * t // sp + acc_split) * s.acc_bytes
        return int(s.seq * ((replicated * t // sp + split) * s.dtype_bytes + acc) // t)

    @property
    def stash_bytes_per_token(self) -> int:
        """Kept for the backward: the norms' inputs (split by sequence with sequence parallelism), their outputs
        (whole: a column-parallel linear keeps its gathered input), the split matmuls' outputs over t."""
        x = self.layer
        if isinstance(x, Layer):
            return self._values(x.hidden, 0) + x.hidden * x.dtype_bytes + 8 * x.hidden * x.dtype_bytes // self._t
        s = x.shape
        if isinstance(x, Decoder):
            llama = s.variant == "llama"
            inner = 2 * s.q_width + 2 * s.kv_width + (4 if llama else 2) * s.ffn
            whole = s.seq * 2 * s.hidden * s.dtype_bytes
            return int(whole + self._values(2 * s.hidden, inner, 2 if llama else 4, s.heads))
        if isinstance(x, Embedding):
            return int(x.stash_bytes_per_token)
        norm = 2 if s.positions else 1
        return int((s.seq * (s.hidden * s.dtype_bytes + INDEX_BYTES) + self._values(s.hidden, 0, norm, 0))
                + s.seq * s.vocab * s.acc_bytes // self._t)

    @property
    def loss_stash_bytes_per_token(self) -> int:
        """What a head's loss keeps outside a checkpoint of the stage (parsim.workload.recompute): the vocab-parallel
        loss's fp32 log-softmax of the local logits, V/t per token (the stash's last term); nothing for other layers."""
        x = self.layer
        return x.shape.seq * x.shape.vocab * x.shape.acc_bytes // self._t if isinstance(x, Head) else 0

    @property
    def core_freed_bytes_per_token(self) -> int:
        """What selective recomputation frees: the core's log-sum-exp, its heads split t ways."""
        return int(self.layer.core_freed_bytes_per_token) // self._t

    @property
    def saved_tensors(self) -> int:
        """The whole layer's count: each rank's modules save the same tensors, split."""
        return int(self.layer.saved_tensors)

    @property
    def core_saved_tensors(self) -> int:
        return int(self.layer.core_saved_tensors)

    @property
    def forward_workspace_bytes_per_token(self) -> int:
        x = self.layer
        if isinstance(x, Decoder):
            s = x.shape
            norm = self._values(0, 0, 2 * s.hidden, 0)
            if s.variant != "llama":
                return norm
            return max(s.seq * (4 * s.q_width + s.kv_width) * s.dtype_bytes // self._t, norm)
        if isinstance(x, Head):  # loss_parallel's log-softmax holds the shifted logits beside their exponentials
            s = x.shape
            return int(x.forward_workspace_bytes_per_token + s.seq * s.vocab * s.acc_bytes) // self._t
        return int(x.forward_workspace_bytes_per_token)

    @property
    def backward_workspace_bytes_per_token(self) -> int:
        x = self.layer
        if isinstance(x, Decoder):
            s = x.shape
            ffn = (2 if s.variant == "llama" else 1) * s.ffn
            return s.seq * (s.hidden + ffn // self._t) * s.dtype_bytes
        if isinstance(x, Head):  # loss_parallel's backward holds the zeros it scatters into, the log-softmax's
            s = x.shape  # exponentials and their sum: one fp32 copy more than the fused kernel
            return int(x.backward_workspace_bytes_per_token + s.seq * s.vocab * s.acc_bytes) // self._t
        if isinstance(x, Layer) and x.kind == "mlp":  # the output's gradient (whole), fc2's input gradient (4C/t)
            return self._values(x.hidden, 4 * x.hidden)
        return int(x.backward_workspace_bytes_per_token)

    @property
    def backward_peak_params(self) -> int:
        """Parameters whose gradients exist when its backward's working memory peaks: an MLP block's fc2, its
        matrix split t ways and its bias whole; all of them for other layers."""
        x = self.layer
        if isinstance(x, Layer) and x.kind == "mlp":
            return int(x.backward_peak_params - x.hidden) // self._t + x.hidden
        return self.params

    @property
    def captured_bytes_per_token(self) -> int:
        x = self.layer
        if isinstance(x, Decoder):
            s = x.shape
            qk = (s.q_width + s.kv_width) // self._t if s.variant == "llama" else 0
            return s.seq * (qk + 2 * s.hidden) * s.dtype_bytes
        if isinstance(x, Head):
            return int(x.captured_bytes_per_token) // self._t
        return int(x.captured_bytes_per_token)

    @property
    def weight_grad_held_bytes_per_token(self) -> int:
        x = self.layer
        if isinstance(x, Decoder):
            s = x.shape
            inner = s.q_width + 2 * s.kv_width + (2 if s.variant == "llama" else 1) * s.ffn
            return s.seq * (4 * s.hidden + inner // self._t) * s.dtype_bytes
        if isinstance(x, Head):
            return x.shape.seq * (x.shape.hidden + x.shape.vocab // self._t) * x.shape.dtype_bytes
        return int(x.weight_grad_held_bytes_per_token)

    early_freed_bytes_per_token = 0  # not modelled split: a split backward's weight-grad frees the stash as it ends


def collective_spec(profile: Profile, kind: str) -> CollectiveSpec:
    """The profile's cost of a TP-sized collective: `tp_KIND` where `hw calibrate --gpus N` timed it at the sizes
    TP issues, else the data-parallel all-reduce's fit (its latency and bus bandwidth for every kind)."""
    spec = profile.collectives.get(f"tp_{kind}") or profile.collectives.get("allreduce")
    if spec is None:
        raise ProfileError("this profile has no collectives.allreduce cost, which tensor parallelism needs: "
                           "re-run `python -m hw calibrate --gpus N` on several GPUs")
    return spec


def collective_s(profile: Profile, kind: str, nbytes: float, ranks: int) -> float:
    """A ring collective of a tensor of `nbytes` over `ranks` GPUs: latency + passes x (ranks-1)/ranks x bytes /
    bus bandwidth (2 passes for an all-reduce, 1 for a reduce-scatter or an all-gather; NCCL's bus bandwidth)."""
    if ranks < 2:
        return 0.0
    spec = collective_spec(profile, kind)
    return spec.latency_s + PASSES[kind] * (ranks - 1) / ranks * nbytes / spec.busbw_Bps


def tp_view(profile: Profile, degree: int) -> Profile:
    """The profile as the simulator sees a machine whose "GPUs" are TP groups of `degree`: a node holds a
    `degree`-th as many, and the `degree` GPUs of a group share a node's network link (each sends its copy or,
    with sequence parallelism, its share). NVLink pairs are each GPU's own, so unchanged."""
    if degree == 1:
        return profile
    net = profile.links["network"]
    links = profile.links | {"network": LinkSpec(net.latency_s, net.bandwidth_Bps / degree, net.measured)}
    return replace(profile, gpus_per_node=max(1, profile.gpus_per_node // degree), links=links)


def whole_nodes(view: Profile, tp: TensorParallel) -> Profile:
    """A tp_view's node size back in GPUs, for describing the profile (its links stay the view's)."""
    return view if tp.degree == 1 else replace(view, gpus_per_node=view.gpus_per_node * tp.degree)
