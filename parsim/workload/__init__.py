"""The workload: a model as a list of layers, its partition into stages, and per-stage costs.

The default model is the stack of MLP blocks that `hw measure` runs, so a default prediction can be
checked on hardware; `conv_model` is the ResNet-like conv net it also runs (`--conv`).

layers.py: layer kinds; models.py: models, their specs and files; partition.py: splits into stages;
costs.py: what layers and stages cost, and the split balanced by those costs.
"""

from parsim.workload.costs import (OPS, PARTITIONS, LayerTime, StageCost, Work, layer_times, layer_works,
                                   microbatch_tokens, part_costs, partitioned, stage_costs)
from parsim.workload.layers import KINDS, Kind, Layer, Part
from parsim.workload.models import (CONV_DEFAULTS, MODEL_FILE, MODEL_SPECS, Model, check_balance, conv_model,
                                    load_model, mlp_model, model_from_spec, model_label, model_spec)
from parsim.workload.partition import partition, partition_by_time, stage_layers

__all__ = ["CONV_DEFAULTS", "KINDS", "Kind", "Layer", "LayerTime", "MODEL_FILE", "MODEL_SPECS", "Model", "OPS",
           "PARTITIONS", "Part", "StageCost", "Work", "check_balance", "conv_model", "layer_times", "layer_works",
           "load_model", "microbatch_tokens", "mlp_model", "model_from_spec", "model_label", "model_spec",
           "part_costs", "partition", "partition_by_time", "partitioned", "stage_costs", "stage_layers"]
