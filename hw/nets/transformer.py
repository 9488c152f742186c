"""The transformer layers hw runs, built from parsim's TransformerShape; each matches a parsim.workload.transformer
kind: a Llama or GPT decoder block, the token embedding, and the LM head (whose loss is lm_loss)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.autograd.function import FunctionCtx
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from parsim.workload import Decoder, Embedding, Head, TransformerShape

ROPE_THETA = 10_000.0  # the rotary base changes no cost


def _acc(dtype: torch.dtype) -> torch.dtype:
    """Where norms and the loss compute: fp32, or the activations' dtype where wider (fp64 in tests)."""
    return torch.promote_types(dtype, torch.float32)


class RMSNormFunction(torch.autograd.Function):
    """y = x / rms(x) * w, computed in fp32, keeping only x and each row's rstd for the backward, as fused
    RMSNorm kernels do (torch's composite rms_norm keeps fp32 copies on the CPU, not on a GPU)."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.to(_acc(x.dtype))
        rstd = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (xf * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        # ctx: torch's stubs give FunctionCtx neither saved_tensors nor needs_input_grad, which a backward's has
        x, weight, rstd = ctx.saved_tensors
        normed = x.to(rstd.dtype) * rstd
        grad_x = grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = (grad.to(rstd.dtype) * normed).reshape(-1, normed.shape[-1]).sum(0).to(weight.dtype)
        if ctx.needs_input_grad[0]:
            g = grad.to(rstd.dtype) * weight.to(rstd.dtype)
            grad_x = (rstd * (g - normed * (g * normed).mean(-1, keepdim=True))).to(x.dtype)
        return grad_x, grad_w, None


class RMSNorm(nn.Module):
    """RMSNorm by RMSNormFunction, its weight starting at ones."""

    def __init__(self, hidden: int, eps: float = 1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(hidden)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return RMSNormFunction.apply(x, self.weight, self.eps)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal grouped-query attention by SDPA's flash kernel, on any device: (b, heads, s, d) in and out."""
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


class AttentionCore(nn.Module):
    """`attention` as a module: with `recompute` set (checkpoint_cores), checkpointed alone
    (torch.utils.checkpoint, non-reentrant), so its backward runs it again: Megatron's selective recomputation."""

    def __init__(self) -> None:
        super().__init__()
        self.recompute = False

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(attention, q, k, v, use_reentrant=False)
        return attention(q, k, v)


def checkpoint_cores(module: nn.Module) -> int:
    """Checkpoint every attention core within `module` (parsim.workload.recompute's selective); how many there are."""
    cores = [m for m in module.modules() if isinstance(m, AttentionCore)]
    for core in cores:
        core.recompute = True
    return len(cores)


def _rotary_tables(seq: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of each position's angles, (seq, 1, head_dim / 2): one table per block, not per micro-batch."""
    inv = ROPE_THETA ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float64), inv)[:, None, :]
    return angles.cos().float(), angles.sin().float()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of (b, s, heads, d) in halves: it keeps no per-sample tensor for the backward."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class LlamaBlock(nn.Module):
    """x + Wo attn(rope(Wq h), rope(Wk h), Wv h), h = rmsnorm(x); then x + Wd (silu(Wg h) * Wu h), h = rmsnorm(x):
    parsim's "llama" kind."""

    cos: torch.Tensor  # the rotary tables, buffers (not saved with the weights)
    sin: torch.Tensor

    def __init__(self, t: TransformerShape):
        super().__init__()
        self.t = t
        self.norm1, self.norm2 = RMSNorm(t.hidden), RMSNorm(t.hidden)
        self.wq = nn.Linear(t.hidden, t.q_width, bias=False)
        self.wk = nn.Linear(t.hidden, t.kv_width, bias=False)
        self.wv = nn.Linear(t.hidden, t.kv_width, bias=False)
        self.wo = nn.Linear(t.q_width, t.hidden, bias=False)
        self.gate = nn.Linear(t.hidden, t.ffn, bias=False)
        self.up = nn.Linear(t.hidden, t.ffn, bias=False)
        self.down = nn.Linear(t.ffn, t.hidden, bias=False)
        self.core = AttentionCore()
        cos, sin = _rotary_tables(t.seq, t.head_dim)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # heads by the projections' widths: under tensor parallelism this process's heads / t of them
        t, (b, s, _) = self.t, x.shape
        h = self.norm1(x)
        q = _rotate(self.wq(h).view(b, s, -1, t.head_dim), self.cos, self.sin).transpose(1, 2)
        k = _rotate(self.wk(h).view(b, s, -1, t.head_dim), self.cos, self.sin).transpose(1, 2)
        v = self.wv(h).view(b, s, -1, t.head_dim).transpose(1, 2)
        x = x + self.wo(self.core(q, k, v).transpose(1, 2).reshape(b, s, -1))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class GptBlock(nn.Module):
    """x + proj attn(split(W_qkv layernorm(x))); then x + W2 gelu(W1 layernorm(x)), GELU's tanh form, with
    biases: parsim's "gpt" kind."""

    def __init__(self, t: TransformerShape):
        super().__init__()
        self.t = t
        self.ln1, self.ln2 = nn.LayerNorm(t.hidden), nn.LayerNorm(t.hidden)
        self.qkv = nn.Linear(t.hidden, t.q_width + 2 * t.kv_width)
        self.proj = nn.Linear(t.q_width, t.hidden)
        self.fc1, self.fc2 = nn.Linear(t.hidden, t.ffn), nn.Linear(t.ffn, t.hidden)
        self.core = AttentionCore()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, (b, s, _) = self.t, x.shape
        q, k, v = self.qkv(self.ln1(x)).split([t.q_width, t.kv_width, t.kv_width], dim=-1)
        q, k, v = (y.view(b, s, -1, t.head_dim).transpose(1, 2) for y in (q, k, v))
        x = x + self.proj(self.core(q, k, v).transpose(1, 2).reshape(b, s, t.q_width))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class TokenEmbedding(nn.Module):
    """Token ids (b, s) -> (b, s, H): a row per token, plus a learned row per position (GPT): parsim's "embed"."""

    def __init__(self, t: TransformerShape):
        super().__init__()
        self.tokens = nn.Embedding(t.vocab, t.hidden)
        self.positions = nn.Embedding(t.positions, t.hidden) if t.positions else None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids)
        if self.positions is None:
            return x
        return x + self.positions(torch.arange(ids.shape[1], device=ids.device))


class LMHead(nn.Module):
    """The final norm and the H x V projection to logits: parsim's "head", whose loss lm_loss adds."""

    def __init__(self, t: TransformerShape):
        super().__init__()
        self.norm = nn.LayerNorm(t.hidden) if t.positions else RMSNorm(t.hidden)
        self.out = nn.Linear(t.hidden, t.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits (..., V) against target ids (...): next tokens (b, s), or image classes (b,); on
    fp32 logits."""
    return F.cross_entropy(logits.to(_acc(logits.dtype)).flatten(0, -2), targets.flatten())


def transformer_module(layer: Decoder | Embedding | Head) -> nn.Module:
    """The module of one of parsim's transformer layers."""
    if isinstance(layer, Embedding):
        return TokenEmbedding(layer.shape)
    if isinstance(layer, Head):
        return LMHead(layer.shape)
    return LlamaBlock(layer.shape) if layer.kind == "llama" else GptBlock(layer.shape)
