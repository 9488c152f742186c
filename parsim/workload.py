"""The workload: a model as a list of layers, its partition into stages, and per-stage costs.

The default model is the stack of MLP blocks that `hw.models.MlpStack` runs, so a default
prediction can be checked on hardware.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from parsim.errors import ModelError
from parsim.profile import LayerCosts, OpCost, Profile


@dataclass(frozen=True)
class Layer:
    """One layer's work per token; the profile's costs for `kind` turn FLOPs into seconds.

    An MLP block is x + W2 gelu(W1 layernorm(x)) with a 4x expansion: each of forward,
    input-grad and weight-grad is two matmuls of 8 h^2 multiply-adds per token.
    """

    kind: str
    hidden: int
    dtype_bytes: int = 2

    @property
    def flops_per_token(self) -> float:
        """FLOPs of the forward (and of each of input-grad, weight-grad) per token."""
        return 16.0 * self.hidden**2

    @property
    def params(self) -> int:
        """Weights: two h x 4h matrices, their biases (5h) and the layernorm's scale and shift (2h)."""
        return 8 * self.hidden**2 + 7 * self.hidden

    @property
    def out_bytes_per_token(self) -> int:
        return self.hidden * self.dtype_bytes

    @property
    def stash_bytes_per_token(self) -> int:
        """Activations kept for the backward: layernorm in and out (h each), fc1 out and gelu out (4h each)."""
        return 10 * self.hidden * self.dtype_bytes


@dataclass(frozen=True)
class Model:
    """A sequential model and the batch it is trained on."""

    layers: tuple[Layer, ...]
    tokens: int  # per training step (global batch, all micro-batches)

    @property
    def name(self) -> str:
        h = {layer.hidden for layer in self.layers}
        return f"{len(self.layers)} x {self.layers[0].kind}(h={'/'.join(map(str, sorted(h)))}), {self.tokens} tokens"


def parse_mlp_spec(text: str) -> tuple[int, int, int]:
    """'16x2048x8192' -> (layers, hidden, tokens); ValueError if it is not three whole numbers."""
    parts = text.strip().lower().split("x")
    if len(parts) != 3:
        raise ValueError(f"expected LAYERSxHIDDENxTOKENS, got {text!r}")
    layers, hidden, tokens = (int(v) for v in parts)
    return layers, hidden, tokens


def mlp_model(layers: int = 16, hidden: int = 2048, tokens: int = 8192, dtype_bytes: int = 2) -> Model:
    """The default model: `layers` identical MLP blocks."""
    for name, value in (("layers", layers), ("hidden", hidden), ("tokens", tokens)):
        if value < 1:
            raise ModelError(f"--{name} must be at least 1, got {value}")
    return Model(tuple(Layer("mlp", hidden, dtype_bytes) for _ in range(layers)), tokens)


def load_model(path: str | Path) -> Model:
    """A model file: {"tokens": N, "layers": [{"kind": "mlp", "hidden": H, "count": C}, ...]}."""
    try:
        doc = json.loads(Path(path).read_text())
        layers = []
        for spec in doc["layers"]:
            layer = Layer(str(spec.get("kind", "mlp")), int(spec["hidden"]), int(spec.get("dtype_bytes", 2)))
            if layer.hidden < 1 or layer.dtype_bytes < 1:
                raise ValueError("hidden and dtype_bytes must be positive")
            layers += [layer] * int(spec.get("count", 1))
        tokens = int(doc["tokens"])
    except OSError as e:
        raise ModelError(f"cannot read model file {path}: {e.strerror or e}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ModelError(f"model file {path} is malformed ({type(e).__name__}: {e}); expected "
                         '{"tokens": N, "layers": [{"kind": "mlp", "hidden": H, "count": C}]}') from None
    if not layers or tokens < 1:
        raise ModelError(f"model file {path} needs at least one layer and tokens >= 1")
    return Model(tuple(layers), tokens)


def partition(num_layers: int, num_stages: int) -> list[range]:
    """Split layers into contiguous stages of equal count (the first stages take the remainder)."""
    if num_stages < 1:
        raise ModelError(f"need at least one stage, got {num_stages}")
    if num_stages > num_layers:
        raise ModelError(f"cannot split {num_layers} layers into {num_stages} stages: "
                         "use more layers or fewer GPUs")
    size, extra = divmod(num_layers, num_stages)
    bounds = [0]
    for s in range(num_stages):
        bounds.append(bounds[-1] + size + (1 if s < extra else 0))
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


@dataclass(frozen=True)
class Work:
    """GPU and host time of one compute action, and how finely the host feeds it to the GPU."""

    gpu_s: float
    host_s: float
    chunks: int  # kernels are issued layer by layer: the GPU may start after the first

    def __add__(self, other: Work) -> Work:
        return Work(self.gpu_s + other.gpu_s, self.host_s + other.host_s, self.chunks + other.chunks)


@dataclass(frozen=True)
class StageCost:
    """What one micro-batch costs on one stage."""

    forward: Work
    backward_input: Work
    backward_weight: Work
    send_bytes: int  # activation (or its gradient) crossing to the neighbouring stage
    stash_bytes: int  # activations kept from forward to backward
    grad_bytes: int = 0  # the stage's weight gradients, all-reduced across data-parallel replicas

    @cached_property
    def backward(self) -> Work:
        return self.backward_input + self.backward_weight


def _work(cost: OpCost, flops: float) -> Work:
    return Work(cost.gpu_s(flops), cost.host_s, 1)


def layer_costs(profile: Profile, layer: Layer) -> LayerCosts:
    """The profile's costs fitted at this layer's hidden size ("mlp@2048") if it has them, else its kind's."""
    costs = profile.layers.get(f"{layer.kind}@{layer.hidden}") or profile.layers.get(layer.kind)
    if costs is None:
        raise ModelError(f"the profile has no costs for layer kind {layer.kind!r}; it knows: "
                         f"{', '.join(sorted(profile.layers))}")
    return costs


def stage_costs(model: Model, num_stages: int, num_microbatches: int, profile: Profile,
                data_parallel: int = 1) -> list[StageCost]:
    """Per-stage costs of one micro-batch, for an equal split of layers, and of the batch over
    data-parallel replicas and then micro-batches."""
    if num_microbatches < 1 or data_parallel < 1:
        raise ModelError(f"need at least one micro-batch and replica, got {num_microbatches} and {data_parallel}")
    if model.tokens % (num_microbatches * data_parallel):
        raise ModelError(f"{model.tokens} tokens do not split into {data_parallel} replica(s) x "
                         f"{num_microbatches} equal micro-batches" if data_parallel > 1 else
                         f"{model.tokens} tokens do not split into {num_microbatches} equal micro-batches")
    tokens = model.tokens // (num_microbatches * data_parallel)
    costs = []
    for layer_ids in partition(len(model.layers), num_stages):
        layers = [model.layers[i] for i in layer_ids]
        works = {op: Work(0.0, 0.0, 0) for op in ("forward", "backward_input", "backward_weight")}
        for layer in layers:
            lc = layer_costs(profile, layer)
            flops = layer.flops_per_token * tokens
            for op in works:
                works[op] = works[op] + _work(getattr(lc, op), flops)
        costs.append(StageCost(
            works["forward"], works["backward_input"], works["backward_weight"],
            send_bytes=layers[-1].out_bytes_per_token * tokens,
            stash_bytes=sum(layer.stash_bytes_per_token for layer in layers) * tokens,
            grad_bytes=sum(layer.params * layer.dtype_bytes for layer in layers),
        ))
    return costs
