"""The workload: a model as a list of layers, its partition into stages, and per-stage costs.

The default model is the stack of MLP blocks that `hw measure` runs, so a default prediction can be
checked on hardware; `conv_model` is the ResNet-like conv net it also runs (`--conv`), and
`transformer_model` a Llama- or GPT-style transformer, from a Hugging Face config or a preset.

layers.py: the MLP and conv layer kinds; transformer.py: the transformer's; models.py: models, their specs
and files; configs.py: Hugging Face configs and presets; partition.py: splits into stages; costs.py: what
layers and stages cost, and the split balanced by those costs; memory.py: what a GPU holds; graph_memory.py: what
it holds under CUDA graphs. configs.py, memory.py and graph_memory.py load when one of their names is first read,
so that `predict`, which needs none of them for an eager runtime, starts sooner.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from parsim.workload.costs import (
    OPS,
    PARTITIONS,
    LayerTime,
    StageCost,
    Work,
    gradient_adds,
    kind_priced,
    layer_times,
    layer_works,
    microbatch_tokens,
    part_costs,
    partitioned,
    poor_fits,
    stage_costs,
    stand_ins,
)
from parsim.workload.layers import KINDS, Kind, Layer, Part
from parsim.workload.models import (
    CONV_DEFAULTS,
    MODEL_FILE,
    MODEL_SPECS,
    PRESETS,
    Model,
    check_balance,
    conv_model,
    mlp_model,
    model_label,
    model_spec,
    transformer_model,
)
from parsim.workload.partition import check_stages, partition, partition_by_time, stage_layers
from parsim.workload.transformer import Decoder, Embedding, Head, TransformerShape, transformer_layers

if TYPE_CHECKING:
    from parsim.workload.configs import config_model, load_model, model_from_spec, named_model, preset_model
    from parsim.workload.graph_memory import GraphedRank, graphed_activation_bytes, graphed_peak_bytes, graphed_ranks
    from parsim.workload.memory import OPTIMIZERS, peak_bytes, rank_peak_bytes

__all__ = ["CONV_DEFAULTS", "Decoder", "Embedding", "GraphedRank", "Head", "KINDS", "Kind", "Layer", "LayerTime",
           "MODEL_FILE", "MODEL_SPECS", "Model", "OPS", "OPTIMIZERS", "PARTITIONS", "PRESETS", "Part", "StageCost",
           "TransformerShape", "Work", "check_balance", "check_stages", "config_model", "conv_model",
           "gradient_adds", "graphed_activation_bytes", "graphed_peak_bytes", "graphed_ranks", "layer_times",
           "layer_works", "load_model", "microbatch_tokens", "mlp_model", "model_from_spec", "model_label",
           "model_spec", "named_model", "part_costs", "partition", "stand_ins", "partition_by_time", "partitioned",
           "kind_priced", "peak_bytes", "poor_fits", "preset_model", "rank_peak_bytes", "stage_costs", "stage_layers",
           "transformer_layers", "transformer_model"]

_LAZY = {"config_model": "configs", "load_model": "configs", "model_from_spec": "configs", "named_model": "configs",
         "preset_model": "configs", "OPTIMIZERS": "memory", "peak_bytes": "memory",
         "rank_peak_bytes": "memory", "GraphedRank": "graph_memory", "graphed_activation_bytes": "graph_memory",
         "graphed_peak_bytes": "graph_memory",
         "graphed_ranks": "graph_memory"}  # name -> the module that defines it, loaded when the name is first read


def __getattr__(name: str) -> Any:
    """configs.py's, memory.py's and graph_memory.py's names, from their modules when first read (PEP 562)."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
