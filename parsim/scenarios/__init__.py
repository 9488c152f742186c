"""The textbook experiments as simulated scenarios, by name; `hw.measure.scenarios` measures the same programs.

Each scenario builds host programs on the machine model from a profile's measured costs and returns
named times; the `headline` figure is the one compared with the measurement. base.py: what a scenario
is; textbook.py: one host thread's experiments; pipelines.py: pipeline steps; interfaces.py: PyTorch's
three data-parallel interfaces.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from parsim.profile import Profile
from parsim.scenarios.base import ScenarioResult, compare_figures, with_op_costs
from parsim.scenarios.interfaces import data_parallel, hogwild
from parsim.scenarios.pipelines import (
    COPY_STREAMS,
    PIPELINE_SCENARIOS,
    PIPELINED_RESNET,
    RECOMPUTE,
    RESNET_SPLITS,
    PipelinePoint,
    PipelineScenario,
    peak_figure,
    predict_pipeline_scenario,
)
from parsim.scenarios.textbook import (
    COPY_PLACEMENTS,
    async_front_end,
    copy_compute_overlap,
    copy_figures,
    multi_gpu_matmuls,
)

__all__ = ["COPY_PLACEMENTS", "COPY_STREAMS", "PIPELINED_RESNET", "PIPELINE_SCENARIOS", "RECOMPUTE", "RESNET_SPLITS",
           "SCENARIOS", "peak_figure",
           "PipelinePoint", "PipelineScenario", "ScenarioResult", "async_front_end", "compare_figures",
           "copy_compute_overlap", "copy_figures", "data_parallel", "hogwild", "multi_gpu_matmuls",
           "predict_pipeline_scenario", "with_op_costs"]

SCENARIOS: dict[str, Callable[[Profile], ScenarioResult]] = {
    "async": async_front_end,
    "multi-gpu": multi_gpu_matmuls,
    "overlap": copy_compute_overlap,
    **{name: functools.partial(predict_pipeline_scenario, s) for name, s in PIPELINE_SCENARIOS.items()},
    "data-parallel": data_parallel,
    "hogwild": hogwild,
}
