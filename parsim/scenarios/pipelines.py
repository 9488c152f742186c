"""Scenarios made of pipeline steps, which `parsim predict` simulates and `hw measure` runs unchanged."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from parsim.configuration import Configuration, prepare
from parsim.errors import ParsimError
from parsim.profile import Profile
from parsim.runtimes.base import Runtime
from parsim.runtimes.eager import EAGER
from parsim.scenarios.base import ScenarioResult
from parsim.workload import Model, conv_model, mlp_model


@dataclass(frozen=True)
class PipelinePoint:
    """One pipeline step of a scenario: `figure` names its time (seconds) in the results."""

    figure: str
    schedule: str
    gpus: int
    microbatches: int
    copy_streams: bool = False
    recompute: str = "never"  # parsim.workload.recompute

    def configuration(self, model: Model, runtime: str = "hw") -> Configuration:
        return Configuration(model, self.schedule, self.gpus, self.microbatches, runtime=runtime,
                             copy_streams=self.copy_streams, recompute=self.recompute)


@dataclass(frozen=True)
class PipelineScenario:
    """A scenario made of pipeline steps that `parsim predict` simulates and `hw measure` runs unchanged."""

    name: str
    description: str
    model: Callable[[bool], Model]  # tiny=True: a model small enough for a CPU smoke test
    points: tuple[PipelinePoint, ...]
    headline: str
    ratios: Callable[[dict[str, float]], dict[str, float]]  # derived figures from the step times
    memory: bool = False  # also each point's peak memory per GPU, as `<figure>_peak_bytes` (its `_s` dropped)

    def figures(self, step_times: dict[str, float]) -> dict[str, float]:
        return {**step_times, **self.ratios(step_times)}


COPY_STREAMS = PipelineScenario(
    "copy-streams",
    "GPipe on 2 GPUs, stage-to-stage messages on the compute stream vs on dedicated copy streams",
    # Wide activations and little compute per layer: where a message on the compute stream stalls it.
    lambda tiny: mlp_model(2, 16, 64) if tiny else mlp_model(2, 512, 131072),
    (PipelinePoint("compute_stream_s", "gpipe", 2, 4), PipelinePoint("copy_streams_s", "gpipe", 2, 4, True)),
    "speedup_ratio",
    lambda t: {"speedup_ratio": t["compute_stream_s"] / t["copy_streams_s"]},
)
RESNET_SPLITS = (2, 4, 8, 16, 32)  # micro-batches of the pipelined runs ("split sizes" of 256 / m images)


def _resnet_ratios(t: dict[str, float]) -> dict[str, float]:
    """Naive model parallelism against one GPU, and the best pipelined split against one GPU."""
    best = min(RESNET_SPLITS, key=lambda m: t[f"pipelined_m{m}_s"])
    return {"model_parallel_over_single_ratio": t["model_parallel_s"] / t["single_gpu_s"],
            "best_speedup_ratio": t["single_gpu_s"] / t[f"pipelined_m{best}_s"], "best_microbatches_count": best}


PIPELINED_RESNET = PipelineScenario(
    "pipelined-resnet",
    "the conv net (ResNet-34-like, 256 images) on one GPU, split over two (naive model parallel), and pipelined",
    lambda tiny: conv_model(images=32, widths=(4, 8), blocks=(1, 1), side=8) if tiny else conv_model(),
    (PipelinePoint("single_gpu_s", "gpipe", 1, 1), PipelinePoint("model_parallel_s", "gpipe", 2, 1),
     *(PipelinePoint(f"pipelined_m{m}_s", "gpipe", 2, m) for m in RESNET_SPLITS)),
    "best_speedup_ratio",
    _resnet_ratios,
)
RECOMPUTE_SPLITS = (1, 2, 4, 8, 16, 32)


def _recompute_ratios(t: dict[str, float]) -> dict[str, float]:
    """What recomputing costs at the best split of each, and the best split's micro-batches with it."""
    kept = min(RECOMPUTE_SPLITS, key=lambda m: t[f"kept_m{m}_s"])
    redone = min(RECOMPUTE_SPLITS, key=lambda m: t[f"recomputed_m{m}_s"])
    return {"best_recomputed_over_best_kept_ratio": t[f"recomputed_m{redone}_s"] / t[f"kept_m{kept}_s"],
            "best_kept_microbatches_count": kept, "best_recomputed_microbatches_count": redone}


RECOMPUTE = PipelineScenario(
    "recompute",
    "GPipe on 2 GPUs at 1-32 micro-batches, every activation kept or every micro-batch's forward recomputed in its "
    "backward (torchgpipe's checkpointing): step time and peak memory per GPU",
    lambda tiny: mlp_model(4, 16, 128) if tiny else mlp_model(16, 2048, 8192),
    tuple(PipelinePoint(f"{kept}_m{m}_s", "gpipe", 2, m, recompute=mode) for m in RECOMPUTE_SPLITS
          for kept, mode in (("kept", "never"), ("recomputed", "always"))),
    "best_recomputed_over_best_kept_ratio",
    _recompute_ratios,
    memory=True,
)
PIPELINE_SCENARIOS = {s.name: s for s in (COPY_STREAMS, PIPELINED_RESNET, RECOMPUTE)}


def peak_figure(figure: str) -> str:
    """The peak-memory figure beside a point's time figure: "kept_m8_s" -> "kept_m8_peak_bytes"."""
    return figure.removesuffix("_s") + "_peak_bytes"


def predict_pipeline_scenario(scenario: PipelineScenario, profile: Profile, runtime: Runtime = EAGER) -> ScenarioResult:
    """Each point of `scenario` simulated with `profile`, run by `runtime`; the ratios derived as from a measurement."""
    model = scenario.model(False)
    if runtime is not EAGER and any(p.copy_streams for p in scenario.points):
        raise ParsimError(f"the {scenario.name} scenario compares hw's copy streams; it runs with the hw runtime only")
    if runtime is not EAGER and any(p.recompute != "never" for p in scenario.points):
        raise ParsimError(f"the {scenario.name} scenario recomputes, which hw's runner alone runs; it runs with the hw "
                          "runtime only")
    figures: dict[str, float] = {}
    for p in scenario.points:
        prepared = prepare(p.configuration(model, runtime.name), profile)
        figures[p.figure] = prepared.predict()[0].step_time_s
        if scenario.memory:  # what hw measures: weights, the step's gradients, activations and working memory
            figures[peak_figure(p.figure)] = prepared.runtime.peak_bytes(prepared.model, prepared.schedule, 1, "none",
                                                                         p.recompute)
    return ScenarioResult(scenario.name, scenario.figures(figures), scenario.headline, scenario.description)
