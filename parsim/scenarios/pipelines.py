"""Scenarios made of pipeline steps, which `parsim predict` simulates and `hw measure` runs unchanged."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from parsim.configuration import Configuration, predict
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


@dataclass(frozen=True)
class PipelineScenario:
    """A scenario made of pipeline steps that `parsim predict` simulates and `hw measure` runs unchanged."""

    name: str
    description: str
    model: Callable[[bool], Model]  # tiny=True: a model small enough for a CPU smoke test
    points: tuple[PipelinePoint, ...]
    headline: str
    ratios: Callable[[dict[str, float]], dict[str, float]]  # derived figures from the step times

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
PIPELINE_SCENARIOS = {s.name: s for s in (COPY_STREAMS, PIPELINED_RESNET)}


def predict_pipeline_scenario(scenario: PipelineScenario, profile: Profile, runtime: Runtime = EAGER) -> ScenarioResult:
    """Each point of `scenario` simulated with `profile`, run by `runtime`; the ratios derived as from a measurement."""
    model = scenario.model(False)
    if runtime is not EAGER and any(p.copy_streams for p in scenario.points):
        raise ParsimError(f"the {scenario.name} scenario compares hw's copy streams; it runs with the hw runtime only")
    times = {p.figure: predict(Configuration(model, p.schedule, p.gpus, p.microbatches, runtime=runtime.name,
                                             copy_streams=p.copy_streams), profile)[0].step_time_s
             for p in scenario.points}
    return ScenarioResult(scenario.name, scenario.figures(times), scenario.headline, scenario.description)
