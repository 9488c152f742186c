"""Models: a sequence of layers and the batch it trains on; named by a one-word spec, read from a file, or built
(an MLP stack, a conv net, a transformer)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeGuard

from parsim.budget import check_layers
from parsim.errors import ModelError
from parsim.inputs import MAX_LAYERS, MAX_SIZE, load_json, text_field, whole
from parsim.workload.layers import KINDS, MAX_DTYPE_BYTES, Layer
from parsim.workload.timed import describe as describe_timed
from parsim.workload.timed import is_timed
from parsim.workload.transformer import VARIANTS, Decoder, TransformerShape, describe, transformer_layers

PRESETS = ("llama-3-8b", "llama-3.2-1b", "gpt-2")  # the shipped configs (configs.py reads presets/NAME.json)


@dataclass(frozen=True)
class Model:
    """A sequential model, the batch it is trained on, and optionally how its layers split into stages."""

    layers: tuple[Any, ...]  # each a Layer, or a transformer's Embedding, Decoder or Head (the same properties)
    tokens: int  # samples per training step (tokens, images for a conv net, sequences for a transformer)
    balance: tuple[int, ...] | None = None  # layers per stage (torchgpipe's term); None: equal counts

    def __post_init__(self) -> None:
        if not self.layers:
            raise ModelError("a model needs at least one layer")
        check_layers(len(self.layers), fix="use fewer layers (a model file's counts)")
        whole(self.tokens, f"the model's {self.layers[0].sample}s per step", 1, MAX_SIZE, ModelError)
        for i, (a, b) in enumerate(zip(self.layers, self.layers[1:])):
            if a.out_shape != b.in_shape:
                raise ModelError(f"layer {i + 1} ({b.cost_key}) takes {_shape(b.in_shape)} per sample but "
                                 f"layer {i} ({a.cost_key}) gives {_shape(a.out_shape)}")
        if self.balance is not None:
            check_balance(self.balance, len(self.layers))

    @property
    def sample(self) -> str:
        """What one sample is: "token", "image" or "sequence"."""
        return str(self.layers[0].sample)

    @property
    def transformer(self) -> TransformerShape | None:
        """The shape of a transformer's blocks, or None for another model."""
        return next((layer.shape for layer in self.layers if isinstance(layer, Decoder)), None)

    @property
    def name(self) -> str:
        split = f", balance {'/'.join(map(str, self.balance))}" if self.balance else ""
        if is_timed(self.layers):
            return describe_timed(self.layers, self.tokens) + split
        shape = self.transformer
        if shape is not None:
            blocks = sum(isinstance(layer, Decoder) for layer in self.layers)
            return f"{describe(shape, blocks)}, {self.tokens} sequences{split}"
        kinds = sorted({layer.kind for layer in self.layers})
        h = sorted({layer.hidden for layer in self.layers})
        sides = sorted({layer.side for layer in self.layers}, reverse=True)
        shape_text = f"h={'/'.join(map(str, h))}" if self.sample == "token" else \
            f"C={'/'.join(map(str, h))}, S={'/'.join(map(str, sides))}"
        return f"{len(self.layers)} x {'+'.join(kinds)}({shape_text}), {self.tokens} {self.sample}s{split}"


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))


def check_balance(balance: tuple[int, ...], num_layers: int, num_stages: int | None = None) -> None:
    """A balance names every layer once, in stages of at least one (and, if given, num_stages of them)."""
    text = ",".join(map(str, balance))
    if not balance or min(balance) < 1 or sum(balance) != num_layers:
        raise ModelError(f"balance {text} must be positive layer counts that add up to the model's "
                         f"{num_layers} layers")
    if num_stages is not None and len(balance) != num_stages:
        raise ModelError(f"balance {text} gives {len(balance)} stages but the schedule has {num_stages}")


MODEL_SPECS = ("LAYERSxHIDDENxTOKENS (an MLP stack, e.g. 16x2048x8192), conv:IMAGES (the conv net, e.g. conv:256) "
               "or conv:IMAGES:WIDTHS:BLOCKS:SIDE (a custom conv net, e.g. conv:8:4-8:1-2:8); for a transformer, "
               "llama:BATCH:SEQ:BLOCKS:HIDDEN:HEADS:KV_HEADS:FFN:VOCAB (e.g. llama:16:2048:8:2048:16:8:8192:32000), "
               "gpt:BATCH:SEQ:BLOCKS:HIDDEN:HEADS:FFN:VOCAB:POSITIONS or PRESET:BATCH:SEQ (e.g. llama-3-8b:64:4096)")
CONV_DEFAULTS = ((64, 128, 256, 512), (3, 4, 6, 3), 56)  # the conv net's widths, blocks and side (ResNet-34's)


def model_from_spec(text: str) -> Model:
    """A model from its one-word spec, as `hw validate --models` and results CSVs name it.

    `LxHxT`: L MLP blocks of hidden size H, T tokens per step (mlp_model). `conv:N`: the conv net
    (conv_model) on N images per step. `conv:N:W1-W2:B1-B2:S`: a conv net of groups of B1, B2, ...
    blocks of W1, W2, ... channels on an S x S input map (conv_model(N, widths, blocks, S)), e.g.
    conv:8:4-8:1-2:8 for a tiny one. `llama:...`, `gpt:...` and `PRESET:BATCH:SEQ`: a transformer
    (see MODEL_SPECS). ModelError naming these forms if the text is none of them.
    """
    try:
        return _from_spec(text.strip().lower())
    except ModelError as e:
        raise ModelError(f"model spec {text!r}: {e}") from None
    except ValueError:
        raise ModelError(f"bad model spec {text!r}; expected {MODEL_SPECS}") from None


def _from_spec(text: str) -> Model:
    """model_from_spec without its error wording: ValueError for a malformed spec."""
    head, _, rest = text.partition(":")
    if head in VARIANTS:
        return _transformer_from_spec(head, _whole_numbers(rest, ":"))
    if head != "conv":
        layers, hidden, tokens = _whole_numbers(text, "x", 3)
        return mlp_model(layers, hidden, tokens)
    parts = text.split(":")[1:]
    if len(parts) == 1:
        return conv_model(int(parts[0]))
    if len(parts) != 4:
        raise ValueError(text)
    widths, blocks = _whole_numbers(parts[1], "-"), _whole_numbers(parts[2], "-")
    return conv_model(int(parts[0]), widths, blocks, int(parts[3]))


def _transformer_from_spec(variant: str, n: tuple[int, ...]) -> Model:
    if variant == "llama" and len(n) == 8:
        batch, seq, blocks, hidden, heads, kv, ffn, vocab = n
        positions = 0
    elif variant == "gpt" and len(n) == 8:
        batch, seq, blocks, hidden, heads, ffn, vocab, positions = n
        kv = heads
    else:
        raise ValueError(variant)
    if heads < 1 or hidden % heads:
        raise ModelError(f"hidden size {hidden} does not split into {heads} heads")
    shape = TransformerShape(variant, hidden, ffn, heads, kv, hidden // heads, vocab, seq, positions)
    return transformer_model(shape, blocks, batch)


def _whole_numbers(text: str, sep: str, count: int | None = None) -> tuple[int, ...]:
    """'4-8' -> (4, 8); ValueError unless every item is a whole number (and there are `count` of them)."""
    values = tuple(int(v) for v in text.split(sep))
    if count is not None and len(values) != count:
        raise ValueError(text)
    return values


def model_spec(model: Model) -> str:
    """The spec model_from_spec turns back into `model`: what a results CSV's `model` column holds."""
    first, t = model.layers[0], model.transformer
    if is_timed(model.layers):
        if not first.source.file:
            raise ModelError(f"{model.name} has no model spec: it was not read from a profiled model file")
        return f"{first.source.file}:{model.tokens}"
    if t is not None:
        blocks = sum(isinstance(layer, Decoder) for layer in model.layers)
        sizes = ((t.hidden, t.heads, t.kv_heads, t.ffn, t.vocab) if t.variant == "llama"
                 else (t.hidden, t.heads, t.ffn, t.vocab, t.positions))
        spec = ":".join(map(str, (t.variant, model.tokens, t.seq, blocks, *sizes)))
    elif first.kind == "mlp":
        spec = f"{len(model.layers)}x{first.hidden}x{model.tokens}"
    else:
        starts = [i for i, layer in enumerate(model.layers) if i == 0 or layer.kind == "down"]
        widths = tuple(model.layers[i].hidden for i in starts)
        groups = tuple(b - a for a, b in zip(starts, starts[1:] + [len(model.layers)]))
        custom = (widths, groups, first.side) != CONV_DEFAULTS
        spec = f"conv:{model.tokens}" + (f":{_dashed(widths)}:{_dashed(groups)}:{first.side}" if custom else "")
    try:
        same = _from_spec(spec) == replace(model, balance=None)
    except (ModelError, ValueError):
        same = False
    if not same:
        raise ModelError(f"{model.name} has no model spec; specs name {MODEL_SPECS}")
    return spec


def _dashed(values: tuple[int, ...]) -> str:
    return "-".join(map(str, values))


def model_label(model: Model) -> str:
    """A short readable name for tables and plots: '16x h=2048, 8192 tokens' for an MLP stack, else Model.name."""
    first = model.layers[0]
    if first.kind == "mlp" and all(layer == first for layer in model.layers) and model.balance is None:
        return f"{len(model.layers)}x h={first.hidden}, {model.tokens} tokens"
    return model.name


def mlp_model(layers: int = 16, hidden: int = 2048, tokens: int = 8192, dtype_bytes: int = 2) -> Model:
    """The default model: `layers` identical MLP blocks."""
    for name, value, most in (("layers", layers, MAX_LAYERS), ("hidden", hidden, MAX_SIZE),
                              ("tokens", tokens, MAX_SIZE)):
        whole(value, f"--{name}", 1, most, ModelError)
    check_layers(layers, "the MLP stack", "use fewer --layers")
    return Model(tuple(Layer("mlp", hidden, dtype_bytes) for _ in range(layers)), tokens)


def conv_model(images: int = 256, widths: tuple[int, ...] = CONV_DEFAULTS[0],
               blocks: tuple[int, ...] = CONV_DEFAULTS[1], side: int = CONV_DEFAULTS[2], dtype_bytes: int = 2) -> Model:
    """A ResNet-34-like net of pre-activation basic blocks: group g has blocks[g] blocks of widths[g] channels,
    its first a `down` block (half the side) in every group after the first.

    The stem (7x7 conv, pooling) and the classifier stay out of the pipelined layers: the model's input is
    the stem's output, widths[0] x side x side per image.
    """
    whole(images, "--images", 1, MAX_SIZE, ModelError)
    if len(widths) != len(blocks) or not blocks or min(blocks) < 1:
        raise ModelError(f"a conv net needs a width and at least one block per group, got {widths} and {blocks}")
    whole(sum(blocks), "a conv net's blocks in all", 1, MAX_LAYERS, ModelError)
    check_layers(sum(blocks), "the conv net", "use fewer blocks")
    layers = []
    for g, (width, count) in enumerate(zip(widths, blocks)):
        if g:
            if side % 2:
                raise ModelError(f"side {side} cannot halve at group {g}: use a side divisible by "
                                 f"{2 ** (len(widths) - 1)}")
            side //= 2
        first = Layer("down" if g else "conv", width, dtype_bytes, side)
        layers += [first] + [Layer("conv", width, dtype_bytes, side)] * (count - 1)
    return Model(tuple(layers), images)


def transformer_model(shape: TransformerShape, blocks: int, sequences: int) -> Model:
    """A transformer of `blocks` decoder blocks, trained on `sequences` sequences of shape.seq tokens a step."""
    if sequences < 1:
        raise ModelError(f"--global-batch must be at least 1 sequence, got {sequences}")
    check_layers(blocks, "the transformer", "use fewer blocks")
    return Model(transformer_layers(shape, blocks), sequences)


MODEL_FILE = ('{"tokens": N, "layers": [{"kind": "mlp", "hidden": H, "count": C}]}, for a conv net '
              '{"images": N, "layers": [{"kind": "conv" or "down", "hidden": CHANNELS, "side": S, "count": C}]}, '
              'or a Hugging Face config.json (with --seq-len and --global-batch)')


def read_model_file(path: str | Path) -> object:
    """A model file's parsed JSON (a regular file, bounded in size and depth), or one clear error."""
    return load_json(path, "model file", ModelError)


def is_config(doc: object) -> TypeGuard[dict[str, Any]]:
    """Whether a model file is a Hugging Face config (it has "model_type" or "architectures") rather than parsim's."""
    return isinstance(doc, dict) and "layers" not in doc and ("model_type" in doc or "architectures" in doc)


def parsim_model(doc: object, path: str | Path, seq_len: int | None = None, sequences: int | None = None) -> Model:
    """A parsim model file's model (see MODEL_FILE); "images" is another name for "tokens"."""
    if seq_len is not None or sequences is not None:
        raise ModelError(f"--seq-len and --global-batch go with a transformer config; {path} is a parsim model file")
    where = f"model file {path}"
    if not isinstance(doc, dict):
        raise ModelError(f"{where} needs a non-empty \"layers\" list; expected {MODEL_FILE}")
    specs = doc.get("layers")
    if not isinstance(specs, list) or not specs:
        raise ModelError(f"{where} needs a non-empty \"layers\" list; expected {MODEL_FILE}")
    batch = "tokens" if "tokens" in doc else "images"
    tokens = whole(doc.get(batch), f"{where}: {batch}", 1, MAX_SIZE, ModelError)
    counts = [_layer_count(spec, f"{where}: layers[{i}]") for i, spec in enumerate(specs)]
    whole(sum(counts), f"{where}: the layers' counts in all", 1, MAX_LAYERS, ModelError)
    try:
        layers = []
        for i, (spec, count) in enumerate(zip(specs, counts)):
            layers += [_layer(spec, f"{where}: layers[{i}]")] * count
        return Model(tuple(layers), tokens)
    except ModelError as e:
        raise ModelError(f"{where}: {e}") from None


def _layer_count(spec: object, where: str) -> int:
    """A layer entry's `count` (default 1), checked before any layer is built."""
    if not isinstance(spec, dict):
        raise ModelError(f"{where} must be an object such as {{\"kind\": \"mlp\", \"hidden\": 512, \"count\": 4}}")
    return whole(spec.get("count", 1), f"{where}.count", 1, MAX_LAYERS, ModelError)


def _layer(spec: dict[str, Any], where: str) -> Layer:
    """A layer entry's Layer, each field checked for type and range."""
    kind = text_field(spec.get("kind", "mlp"), f"{where}.kind", ModelError)
    if kind not in KINDS:
        raise ModelError(f"{where}.kind {kind!r} is unknown; parsim knows: {', '.join(sorted(KINDS))}")
    if "hidden" not in spec:
        raise ModelError(f"{where} lacks \"hidden\"; expected {MODEL_FILE}")
    return Layer(kind, whole(spec["hidden"], f"{where}.hidden", 1, MAX_SIZE, ModelError),
                 whole(spec.get("dtype_bytes", 2), f"{where}.dtype_bytes", 1, MAX_DTYPE_BYTES, ModelError),
                 whole(spec.get("side", 1), f"{where}.side", 1, MAX_SIZE, ModelError))
