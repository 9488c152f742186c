"""The textbook experiments as simulated scenarios, by name; `hw.measure.scenarios` measures the same programs.

Each scenario builds host programs on the machine model from a profile's measured costs and returns
named times; the `headline` figure is the one compared with the measurement. base.py: what a scenario
is; textbook.py: one host thread's experiments; pipelines.py: pipeline steps; interfaces.py: PyTorch's
three data-parallel interfaces. textbook.py and interfaces.py (and SimPy with them) load on first use, so that
`predict`, which imports the names, does not pay for them.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from parsim.profile import Profile
from parsim.scenarios.base import ScenarioResult, compare_figures, with_op_costs
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

if TYPE_CHECKING:
    from parsim.scenarios.interfaces import data_parallel, hogwild
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

_LAZY = {"COPY_PLACEMENTS": "textbook", "async_front_end": "textbook", "copy_compute_overlap": "textbook",
         "copy_figures": "textbook", "multi_gpu_matmuls": "textbook", "data_parallel": "interfaces",
         "hogwild": "interfaces"}  # name -> the module that defines it, loaded when the name is first read


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)


def _loaded(name: str) -> Callable[[Profile], ScenarioResult]:
    """The scenario `name` of _LAZY, its module loaded when it runs."""
    def run(profile: Profile) -> ScenarioResult:
        scenario: Callable[[Profile], ScenarioResult] = __getattr__(name)
        return scenario(profile)
    run.__name__ = run.__qualname__ = name
    return run


SCENARIOS: dict[str, Callable[[Profile], ScenarioResult]] = {
    "async": _loaded("async_front_end"),
    "multi-gpu": _loaded("multi_gpu_matmuls"),
    "overlap": _loaded("copy_compute_overlap"),
    **{name: functools.partial(predict_pipeline_scenario, s) for name, s in PIPELINE_SCENARIOS.items()},
    "data-parallel": _loaded("data_parallel"),
    "hogwild": _loaded("hogwild"),
}
