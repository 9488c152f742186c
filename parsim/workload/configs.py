"""Hugging Face-style configs: a transformer from a config.json, and the presets parsim ships (by name)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parsim.errors import ModelError
from parsim.inputs import MAX_SIZE, parse_json, shipped_text, shown
from parsim.workload.models import PRESETS, Model, is_config, parsim_model, read_model_file, transformer_model
from parsim.workload.models import model_from_spec as _spec_model
from parsim.workload.timed import is_profiled, profiled_layers
from parsim.workload.transformer import VARIANTS, TransformerShape

LLAMA_ACTS = ("silu",)
GPT_ACTS = ("gelu_new", "gelu", "gelu_pytorch_tanh")  # hw runs GELU's tanh approximation, as GPT-2 does
UNSUPPORTED_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")


def _size(doc: dict[str, Any], key: str, default: int | None = None) -> int:
    """A whole size >= 1 from the config, or `default` where it is absent or null."""
    value = doc.get(key)
    if value is None:
        if default is None:
            raise ModelError(f"it lacks {key}")
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelError(f"{key} must be a whole number >= 1, got {shown(value)}")
    if value > MAX_SIZE:
        raise ModelError(f"{key} must be at most {MAX_SIZE:,}, got {shown(value)}")
    return value


def config_shape(doc: dict[str, Any], seq_len: int) -> tuple[TransformerShape, int]:
    """(shape, decoder blocks) of a Llama-style ("llama") or GPT-2 ("gpt2") config; ModelError for any other."""
    kind = doc.get("model_type")
    moe = [k for k in UNSUPPORTED_KEYS if doc.get(k)]
    if moe:
        raise ModelError(f"mixture-of-experts configs ({', '.join(moe)}) are not supported")
    if kind == "llama":
        if doc.get("hidden_act", "silu") not in LLAMA_ACTS:
            raise ModelError(f"hidden_act {doc.get('hidden_act')!r} is not supported: parsim's llama block is SwiGLU")
        biased = [k for k in ("attention_bias", "mlp_bias") if doc.get(k)]
        if biased:
            raise ModelError(f"{', '.join(biased)} is not supported: parsim's llama block has no biases")
        hidden, heads = _size(doc, "hidden_size"), _size(doc, "num_attention_heads")
        if doc.get("head_dim") is None and hidden % heads:
            raise ModelError(f"hidden_size {hidden} does not split into {heads} heads and there is no head_dim")
        head_dim = _size(doc, "head_dim", hidden // heads)
        if doc.get("max_position_embeddings") is not None and seq_len > _size(doc, "max_position_embeddings"):
            raise ModelError(f"--seq-len {seq_len:,} is past the config's max_position_embeddings "
                             f"{doc['max_position_embeddings']:,}: the model was not built for sequences that long")
        shape = TransformerShape("llama", hidden, _size(doc, "intermediate_size"), heads,
                                 _size(doc, "num_key_value_heads", heads), head_dim, _size(doc, "vocab_size"), seq_len)
        return shape, _size(doc, "num_hidden_layers")
    if kind == "gpt2":
        if doc.get("activation_function", "gelu_new") not in GPT_ACTS:
            raise ModelError(f"activation_function {doc.get('activation_function')!r} is not supported: "
                             f"parsim's gpt block is GELU")
        hidden, heads = _size(doc, "n_embd"), _size(doc, "n_head")
        if hidden % heads:
            raise ModelError(f"n_embd {hidden} does not split into {heads} heads")
        shape = TransformerShape("gpt", hidden, _size(doc, "n_inner", 4 * hidden), heads, heads, hidden // heads,
                                 _size(doc, "vocab_size"), seq_len, _size(doc, "n_positions"))
        return shape, _size(doc, "n_layer")
    raise ModelError(f"model_type {kind!r} is not supported; parsim builds \"llama\" (Llama-style: RMSNorm, "
                     f"grouped-query attention, SwiGLU) and \"gpt2\" configs")


def config_model(doc: dict[str, Any], origin: str, seq_len: int | None, sequences: int | None) -> Model:
    """The transformer a parsed config describes, on `sequences` sequences of `seq_len` tokens a step."""
    if seq_len is None or sequences is None:
        raise ModelError(f"{origin} is a transformer: give --seq-len (tokens per sequence) and --global-batch "
                         f"(sequences per step)")
    try:
        if seq_len < 1:
            raise ModelError(f"--seq-len must be at least 1, got {seq_len}")
        shape, blocks = config_shape(doc, seq_len)
        return transformer_model(shape, blocks, sequences)
    except ModelError as e:
        raise ModelError(f"{origin}: {e}") from None


def preset_config(name: str) -> dict[str, Any]:
    """A shipped config by name (see PRESETS)."""
    if name not in PRESETS:
        raise ModelError(f"no preset named {name!r}; parsim ships: {', '.join(PRESETS)}")
    text = shipped_text("parsim.workload", f"presets/{name}.json")
    config: dict[str, Any] = parse_json(text, f"preset {name}", ModelError)
    return config


def preset_model(name: str, seq_len: int | None, sequences: int | None) -> Model:
    return config_model(preset_config(name.lower()), f"preset {name}", seq_len, sequences)


def named_model(text: str, seq_len: int | None = None, sequences: int | None = None) -> Model:
    """`--model TEXT`: a model file (parsim's or a Hugging Face config.json) if one is there, else a preset."""
    if not text or "\0" in text:
        raise ModelError(f"--model takes a model file or a preset, got {text!r}")
    if Path(text).exists() or text.lower() not in PRESETS:
        if not Path(text).exists() and not text.endswith(".json"):
            raise ModelError(f"no model file {text!r} and no preset of that name; presets: {', '.join(PRESETS)}")
        return load_model(text, seq_len, sequences)
    return preset_model(text, seq_len, sequences)


def profiled_model(doc: dict[str, Any], path: str | Path, seq_len: int | None, samples: int | None) -> Model:
    """A profiled model file's model (parsim.workload.timed), at its own batch or `samples` per step; its sequence
    length is the one it was timed at."""
    where = f"model file {path}"
    layers, own = profiled_layers(doc, where, str(path))
    length = layers[0].source.seq_len
    if seq_len is not None and seq_len != length:
        raise ModelError(f"{where} was timed at {length or 'no'} tokens per sequence, not {seq_len}; profile the "
                         "model again at that length (`python -m hw profile ... --seq-len N`)")
    return Model(layers, own if samples is None else samples)


def load_model(path: str | Path, seq_len: int | None = None, sequences: int | None = None) -> Model:
    """A model file: parsim's (see MODEL_FILE), or a Hugging Face config, which is a transformer and so
    needs seq_len and sequences per step."""
    doc = read_model_file(path)
    if is_profiled(doc):
        return profiled_model(doc, path, seq_len, sequences)
    if is_config(doc):
        return config_model(doc, f"config {path}", seq_len, sequences)
    return parsim_model(doc, path, seq_len, sequences)


def model_from_spec(text: str) -> Model:
    """A model from its one-word spec (parsim.workload.models.model_from_spec), or a preset at a batch and length:
    PRESET:BATCH:SEQ."""
    file, _, samples = text.strip().rpartition(":")
    if file.endswith(".json"):  # a profiled model file at a batch (model_spec's)
        try:
            return load_model(file, sequences=int(samples))
        except ValueError:
            raise ModelError(f"bad model spec {text!r}; a model file takes FILE.json:SAMPLES") from None
    head, _, rest = text.strip().lower().partition(":")
    if head in VARIANTS or head == "conv" or not rest:
        return _spec_model(text)
    try:
        batch, seq = (int(v) for v in rest.split(":"))
    except ValueError:
        raise ModelError(f"bad model spec {text!r}; a preset takes PRESET:BATCH:SEQ, e.g. {head}:8:4096") from None
    return preset_model(head, seq, batch)
