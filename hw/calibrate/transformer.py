"""`hw calibrate --transformer`: transformer layers' costs on this device, fitted per shape and per kind.

  1. attention: SDPA's causal flash kernel alone, forward and backward, over sequence lengths and head
     counts at each head dim ("attention@d128"): fixed_s + flops / flops_per_s over the causal pairs' FLOPs;
  2. each decoder block shape, chained LAYER_DEPTH deep at its model's sequence length over 1-8 sequences:
     forward, input-grad, full backward (gradients accumulating, as from a step's second micro-batch on);
     its matmul part ("llama@HxI") is the block less its attention core as step 1 prices it;
  3. each embedding (gather forward, scatter weight-grad) and head (norm, LM head and the loss);
  4. the host: per block in hw's own executor on stages of 1-8 tiny blocks, and the embedding's and the
     head's extra on a one-block stage (the attention key carries none: it is in the block's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch import nn
from tqdm import tqdm

from hw.calibrate.fit import Fit, fit_affine, weight_grad_s
from hw.calibrate.layers import LAYER_DEPTH, LEAD_CYCLES
from hw.nets.transformer import attention, lm_loss, transformer_module
from hw.timing import gpu_time_s
from parsim.errors import ParsimError
from parsim.profile import LayerCosts, OpCost
from parsim.workload import Decoder, Embedding, Head, Model, TransformerShape, model_from_spec, transformer_model

PROBE_TOKENS = 16384  # tokens per attention probe, and the most per block, embedding or head probe
TransformerLayer = TypeVar("TransformerLayer", Decoder, Embedding, Head)


def parse_models(text: str) -> list[Model]:
    """--transformer's model specs or presets, comma-separated (see parsim.workload.MODEL_SPECS)."""
    models = [model_from_spec(spec) for spec in text.split(",") if spec.strip()]
    if not models or any(m.transformer is None for m in models):
        raise ParsimError(f"--transformer takes transformer specs or presets, comma-separated "
                          f"(e.g. llama-3-8b:8:4096), got {text!r}")
    return models


def distinct(models: list[Model], kind: type[TransformerLayer]) -> list[TransformerLayer]:
    """The distinct layers of one kind across the models, in order (the key fixes the shape that is timed)."""
    return list({layer.cost_key if kind is not Decoder else (layer.cost_key, layer.shape.seq): layer
                 for m in models for layer in m.layers if isinstance(layer, kind)}.values())


def _probe_batches(seq: int, cpu: bool) -> list[int]:
    """Sequences per probe: 1, 2, 4, 8, at most PROBE_TOKENS tokens (at least 2 sizes)."""
    most = max(2, PROBE_TOKENS // seq) if not cpu else 4
    return [b for b in (1, 2, 4, 8) if b <= most]


def _time(fn: Callable[[], object], device: torch.device, depth: int = 1) -> float:
    """GPU time of one call of fn (hw.timing.gpu_time_s), per layer of a `depth`-deep chain."""
    return gpu_time_s(fn, device, batch=2, repeat=6, lead_cycles=LEAD_CYCLES) / depth


# --- 1. attention ---------------------------------------------------------------------------------

def attention_samples(device: torch.device, dtype: torch.dtype, blocks: list[Decoder], cpu: bool,
                      progress: tqdm) -> list[dict]:
    """Forward and backward GPU time of the causal flash kernel alone, per (head dim, sequence length, heads)."""
    rows = []
    for d in sorted({b.shape.head_dim for b in blocks}):
        group = max(b.shape.heads // b.shape.kv_heads for b in blocks if b.shape.head_dim == d)
        seqs = [16, 32] if cpu else sorted({512, 1024, 2048, 4096} | {b.shape.seq for b in blocks})
        heads = [2, 4] if cpu else sorted({8, 16, 32} | {b.shape.heads for b in blocks})
        for s in seqs:
            for h in heads:
                rows.append(_attention_sample(device, dtype, d, s, h, group, cpu))
                progress.update()
    return rows


def _attention_sample(device: torch.device, dtype: torch.dtype, d: int, s: int, h: int, group: int,
                      cpu: bool) -> dict:
    """attention_samples' row of head dim d, sequence length s and h heads (query heads per KV head: group)."""
    shape = TransformerShape("llama", h * d, 1, h, max(h // group, 1), d, 1, s)
    b = max(1, (64 if cpu else PROBE_TOKENS) // s)
    q = torch.randn(b, h, s, d, device=device, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(b, shape.kv_heads, s, d, device=device, dtype=dtype, requires_grad=True)
            for _ in range(2))
    out = attention(q, k, v)
    g = torch.randn_like(out)
    flops = Decoder(shape).attention_flops
    return {"key": f"attention@d{d}", "head_dim": d, "seq": s, "heads": h, "sequences": b,
            "forward_flops": flops[0] * b, "backward_flops": flops[1] * b,
            "forward_s": _time(lambda: attention(q, k, v), device),
            "backward_s": _time(lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True), device)}


def attention_costs(rows: list[dict]) -> tuple[dict[str, LayerCosts], dict[str, Fit]]:
    """Per head dim and overall ("attention"): forward and input-grad fits; no weight-grad (no weights) and no
    host cost (the block's covers it)."""
    costs: dict[str, LayerCosts] = {}
    fits: dict[str, Fit] = {}
    for key in ["attention", *dict.fromkeys(r["key"] for r in rows)]:
        group = [r for r in rows if key == "attention" or r["key"] == key]
        fwd = fit_affine([r["forward_flops"] for r in group], [r["forward_s"] for r in group])
        bwd = fit_affine([r["backward_flops"] for r in group], [r["backward_s"] for r in group])
        unused = OpCost(0.0, 0.0, bwd.rate)  # attention's weight-grad has no work: never priced
        costs[key] = LayerCosts(OpCost(0.0, fwd.fixed_s, fwd.rate), OpCost(0.0, bwd.fixed_s, bwd.rate), unused)
        fits |= {f"{key} forward": fwd, f"{key} backward_input": bwd}
    return costs, fits


# --- 2, 3. blocks, embeddings and heads ---------------------------------------------------------------

def _with_grads(params: Sequence[torch.Tensor]) -> None:
    """Give every parameter a gradient, so the timed backward accumulates into it as a step's later
    micro-batches do (the first one's gradient is stolen instead: a little cheaper)."""
    for p in params:
        p.grad = torch.zeros_like(p)


def layer_samples(device: torch.device, dtype: torch.dtype, layer: Decoder | Embedding | Head, cpu: bool,
                  progress: tqdm) -> list[dict]:
    """GPU time of forward, input-grad and full backward of a block (LAYER_DEPTH chained), an embedding or a
    head with its loss, over 1-8 sequences."""
    depth = LAYER_DEPTH if isinstance(layer, Decoder) else 1
    with torch.device(device):  # built where it runs: a Llama 3 8B head is 0.5 G parameters
        modules = [transformer_module(layer).to(dtype) for _ in range(depth)]
    stack = torch.nn.Sequential(*modules)
    params = [p for m in modules for p in m.parameters()]
    rows = []
    for b in _probe_batches(layer.shape.seq, cpu):
        rows.append(_layer_sample(device, dtype, layer, stack, params, depth, b))
        progress.update()
    return rows


def _layer_sample(device: torch.device, dtype: torch.dtype, layer: Decoder | Embedding | Head, stack: nn.Sequential,
                  params: list[nn.Parameter], depth: int, b: int) -> dict:
    """layer_samples' row at b sequences: `stack` holds the layer's `depth` modules, `params` their parameters."""
    t = layer.shape
    if isinstance(layer, Embedding):
        x = torch.randint(t.vocab, (b, t.seq), device=device)
    else:
        x = torch.randn(b, t.seq, t.hidden, device=device, dtype=dtype, requires_grad=True)
    targets = torch.randint(t.vocab, (b, t.seq), device=device)

    def forward() -> torch.Tensor:
        y = stack(x)
        return lm_loss(y, targets) if isinstance(layer, Head) else y

    y = forward()
    g = torch.ones_like(y) if isinstance(layer, Head) else torch.randn_like(y)
    _with_grads(params)
    leaf: list[torch.Tensor] = [x] if x.is_floating_point() else []  # token ids take no gradient
    row: dict[str, Any] = {
        "kind": layer.kind, "key": layer.cost_key, "seq": t.seq, "sequences": b,
        "work": [w * b for w in layer.parts[0].work], "forward_s": _time(forward, device, depth),
        "backward_s": _time(lambda: torch.autograd.backward(y, g, inputs=[*params, *leaf], retain_graph=True),
                            device, depth)}
    if isinstance(layer, Decoder):
        row["attention_key"], row["attention_work"] = layer.attention_key, [w * b for w in layer.parts[1].work]
    row["backward_input_s"] = (_time(lambda: torch.autograd.grad(y, x, g, retain_graph=True), device, depth)
                               if x.is_floating_point() else 0.0)
    return row


def layer_costs(rows: list[dict], attention: dict[str, LayerCosts], host: dict[str, dict[str, float]],
                ) -> tuple[dict[str, LayerCosts], dict[str, Fit]]:
    """Per shape and per kind: forward, input-grad and weight-grad (full - input-grad) fits of the part's work;
    a block's time less its attention core as `attention` prices it."""
    costs, fits = {}, {}
    for kind in dict.fromkeys(r["kind"] for r in rows):
        of_kind = [r for r in rows if r["kind"] == kind]
        for key in [kind, *dict.fromkeys(r["key"] for r in of_kind)]:
            group = [r for r in of_kind if key == kind or r["key"] == key]
            ops: dict[str, list[float]] = {"forward": [], "backward_input": [], "backward_weight": []}
            for r in group:
                core = _attention_s(r, attention) if "attention_work" in r else (0.0, 0.0)
                ops["forward"].append(max(r["forward_s"] - core[0], 1e-9))
                ops["backward_input"].append(max(r["backward_input_s"] - core[1], 1e-9))
                ops["backward_weight"].append(weight_grad_s(r["backward_s"], r["backward_input_s"]))
            op_costs = []
            for i, (op, seconds) in enumerate(ops.items()):
                work = [r["work"][i] for r in group]
                if not any(work):  # the embedding's input-grad: nothing runs
                    op_costs.append(OpCost(0.0, 0.0, 1.0))
                    continue
                fit = fits[f"{key} {op}"] = fit_affine(work, seconds)
                op_costs.append(OpCost(host[kind][op], fit.fixed_s, fit.rate))
            costs[key] = LayerCosts(*op_costs)
    return costs, fits


def _attention_s(row: dict, attention: dict[str, LayerCosts]) -> tuple[float, float]:
    """The attention core's forward and input-grad seconds in a block sample, as the attention fits price them."""
    costs = attention.get(row["attention_key"]) or attention["attention"]
    return costs.forward.gpu_s(row["attention_work"][0]), costs.backward_input.gpu_s(row["attention_work"][1])


# --- 4. the host ----------------------------------------------------------------------------------

HOST_DEPTHS = (1, 2, 4, 8)


def tiny_shape(variant: str) -> TransformerShape:
    """A block small enough that the GPU idles while the host launches it: what the host probes run."""
    gpt = variant == "gpt"
    return TransformerShape(variant, 64, 128, 4, 4 if gpt else 2, 16, 64, 16, positions=16 if gpt else 0)


def host_costs(device: torch.device, dtype: torch.dtype, variant: str, microbatches: int,
               ) -> tuple[dict[str, dict[str, float]], dict[str, Fit], dict]:
    """Host seconds per op of a block (slope over stages of 1-8 tiny blocks in hw's executor, split into
    input- and weight-grad by their autograd calls' share), of the embedding and of the head with its loss
    (each the extra over a one-block stage): {kind: {op: seconds}}, the fits, the raw rows."""
    from hw.calibrate.host import host_costs as fit_host
    from hw.calibrate.host import host_samples

    t = tiny_shape(variant)
    block = Decoder(t)
    stages = [(k, Model((block,) * k, microbatches)) for k in HOST_DEPTHS]
    rows = host_samples(device, dtype, probes=stages, microbatches=microbatches)
    per_layer, _, fits = fit_host(rows)
    edges = host_samples(device, dtype, probes=[(1, Model((block,), microbatches)),
                                                (1, Model((Embedding(t), block), microbatches)),
                                                (1, Model((block, Head(t)), microbatches))],
                         microbatches=microbatches, grad_calls=False)
    one, embed, head = edges
    share = per_layer["backward_input_s"] / per_layer["backward_s"]

    def extra(row: dict, key: str) -> float:
        return max(row[key] - one[key], 0.0)

    hosts = {variant: {"forward": per_layer["forward_s"], "backward_input": per_layer["backward_input_s"],
                       "backward_weight": per_layer["backward_s"] - per_layer["backward_input_s"]},
             "embed": {"forward": extra(embed, "forward_s"), "backward_input": 0.0,
                       "backward_weight": extra(embed, "backward_s")},
             "head": {"forward": extra(head, "forward_s"), "backward_input": share * extra(head, "backward_s"),
                      "backward_weight": (1 - share) * extra(head, "backward_s")}}
    fits = {name.replace("host", f"host {variant}", 1): f for name, f in fits.items()}
    return hosts, fits, {"blocks": rows, "edges": edges}


# --- the whole transformer calibration ---------------------------------------------------------------

def calibrate_transformer(models: list[Model], device: torch.device, dtype: torch.dtype, cpu: bool,
                          progress: tqdm) -> tuple[dict[str, LayerCosts], dict[str, Fit], dict]:
    """Every transformer cost key the models need, per shape and per kind, with the fits and raw samples."""
    blocks, embeds, heads = distinct(models, Decoder), distinct(models, Embedding), distinct(models, Head)
    samples: dict[str, Any] = {"attention": attention_samples(device, dtype, blocks, cpu, progress)}
    attention, fits = attention_costs(samples["attention"])
    rows = []
    layers: list[Decoder | Embedding | Head] = [*blocks, *embeds, *heads]
    for layer in layers:
        rows += layer_samples(device, dtype, layer, cpu, progress)
    hosts: dict[str, dict[str, float]] = {}
    host_samples: dict[str, dict] = {}
    for variant in dict.fromkeys(b.kind for b in blocks):
        kind_hosts, host_fits, host_samples[variant] = host_costs(device, dtype, variant, 4 if cpu else 16)
        hosts |= kind_hosts  # embed and head: the last variant's probe
        fits |= host_fits
        progress.update()
    costs, layer_fits = layer_costs(rows, attention, hosts)
    samples |= {"layers": rows, "host": host_samples}
    return {**attention, **costs}, fits | layer_fits, samples


def steps(models: list[Model], cpu: bool) -> int:
    """Progress steps calibrate_transformer takes (for the bar)."""
    blocks = distinct(models, Decoder)
    dims = len({b.shape.head_dim for b in blocks})
    seqs = 2 if cpu else len({512, 1024, 2048, 4096} | {b.shape.seq for b in blocks})
    heads = 2 if cpu else len({8, 16, 32} | {b.shape.heads for b in blocks})
    probes = sum(len(_probe_batches(layer.shape.seq, cpu))
                 for layer in [*blocks, *distinct(models, Embedding), *distinct(models, Head)])
    return dims * seqs * heads + probes + len({b.kind for b in blocks})


def in_step_model(models: list[Model]) -> Model:
    """What the transformer family's in-step slowdown is timed on: of the models given, the one with the most GPU
    work per block and sequence (the likeliest to be GPU-bound, whatever order they were listed in), on at most 2
    sequences."""
    def block_work(m: Model) -> float:
        return max((sum(p.work[0] for p in x.parts) for x in m.layers if isinstance(x, Decoder)), default=0.0)

    m = max(models, key=block_work)  # the first of equals
    if m.transformer is None:
        raise ParsimError(f"{m.name} is not a transformer")  # parse_models takes transformers only
    return transformer_model(m.transformer, sum(isinstance(x, Decoder) for x in m.layers), min(m.tokens, 2))
