"""The textbook experiments as simulated scenarios; `hw.scenarios` measures the same programs.

Each scenario builds host programs on the machine model from a profile's measured costs and
returns named times; the `headline` figure is the one compared with the measurement.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

from parsim.errors import ParsimError, ProfileError
from parsim.sim.machine import Launch, Machine, Sync
from parsim.sim.predict import predict
from parsim.profile import KernelCost, Profile
from parsim.runtimes.base import Runtime
from parsim.runtimes.eager import EAGER
from parsim.workload import Model, conv_model, mlp_model


@dataclass(frozen=True)
class ScenarioResult:
    name: str
    figures: dict[str, float]  # seconds, or a plain ratio where the key says so
    headline: str  # the key of the figure to compare with measurement
    description: str
    assumptions: tuple[str, ...] = ()  # what the model takes as given, printed with the figures


def _need_host(profile: Profile, field: str) -> float:
    value = getattr(profile.host, field)
    if value is None:
        raise ProfileError(f"this profile has no host.{field}; the scenarios need it: "
                           "re-run `python -m hw calibrate` to measure it")
    return value


def _need_kernel(profile: Profile, kind: str) -> KernelCost:
    if kind not in profile.kernels:
        raise ProfileError(f"this profile has no kernels.{kind} cost; the scenarios need it: "
                           "re-run `python -m hw calibrate` to measure it")
    return profile.kernels[kind]


def _loop(n: int, launch_s: float, gpu_s: float, sync_s: float, sync_each: bool) -> float:
    """One host launching n ops on one stream, synchronising after each or once at the end."""
    m = Machine()
    host = m.host("host0")
    ops = []
    for i in range(n):
        op = m.op("gpu0 compute", f"op{i}", gpu_s)
        ops.append(op)
        host.steps.append(Launch(op, launch_s, launch_s))
        if sync_each or i == n - 1:
            host.steps += [Sync((op,)), Launch(m.op("host0 sync", "sync", 0.0), sync_s, sync_s)]
    return m.run()


def async_front_end(profile: Profile, n: int = 10_000, elements: int = 1_000_000) -> ScenarioResult:
    """`y = x + 1` n times on a float32 tensor of `elements`: synchronised after each op, or once.

    The textbook's claim: about n (t1 + t2 + t3) against t1 + n t2 + t3, or n t1 + t2 + t3
    when launching (t1) is slower than running (t2).
    """
    t1, t3 = _need_host(profile, "launch_s"), _need_host(profile, "sync_s")
    t2 = _need_kernel(profile, "elementwise").time_s(2 * 4 * elements)  # read x, write y
    sync_each = _loop(n, t1, t2, t3, sync_each=True)
    once = _loop(n, t1, t2, t3, sync_each=False)
    return ScenarioResult("async", {"sync_each_s": sync_each, "sync_once_s": once,
                                    "speedup_ratio": sync_each / once, "t1_s": t1, "t2_s": t2, "t3_s": t3},
                          "speedup_ratio", async_front_end.__doc__.splitlines()[0])


COPY_PLACEMENTS = ("serial", "overlapped", "default_stream")  # where each result's copy to the host goes


def _matmuls_then_copies(profile: Profile, n: int, size: int, pinned: bool, placement: str) -> float:
    """n products of size x size float32 matrices on GPU 0, each result copied to the host.

    serial: all copies after all products. overlapped: each copy on a copy stream as soon as its
    product is done (an event). default_stream: each copy right after its product, but on the compute
    stream, so the next product waits for it: nothing overlaps. A copy into pageable memory blocks
    the host until it is done (CUDA stages it through a pinned buffer), so it cannot overlap
    anything the host issues later.
    """
    launch_s = _need_host(profile, "launch_s")
    mm_s = _need_kernel(profile, "matmul").time_s(2.0 * size**3)
    link = profile.links["d2h_pinned" if pinned else "d2h_pageable"]
    copy_s = link.time_s(4 * size * size)
    m = Machine()
    host = m.host("host0")
    engine = (m.resource("gpu0 d2h"),)
    stream = "gpu0 copy" if placement == "overlapped" else "gpu0 compute"
    products, copies = [], []
    for i in range(n):  # ops join their stream in the order the host creates them
        mm = m.op("gpu0 compute", f"mm{i}", mm_s)
        products.append(mm)
        host.steps.append(Launch(mm, launch_s, launch_s))
        if placement != "serial":
            copies.append(_copy(m, host, mm, i, copy_s, launch_s, engine, pinned, stream))
    if placement == "serial":
        for i, mm in enumerate(products):
            copies.append(_copy(m, host, mm, i, copy_s, launch_s, engine, pinned, stream))
    host.steps.append(Sync(tuple(products + copies)))
    return m.run()


def _copy(m: Machine, host, after, i: int, copy_s: float, launch_s: float, engine, pinned: bool, stream: str):
    op = m.op(stream, f"copy{i}", copy_s, category="comm", resources=engine)
    op.deps.append(after)
    host.steps.append(Launch(op, launch_s, launch_s))
    if not pinned:
        host.steps.append(Sync((op,)))
    return op


def copy_compute_overlap(profile: Profile, n: int = 50, size: int = 4000) -> ScenarioResult:
    """n 4000x4000 products, each result copied to the host: after all, on a copy stream, or on the compute stream.

    Overlapped copies go on a copy stream as each product is done; on the compute stream (the
    default) each copy right after its product holds the next product back."""
    figures = {}
    for pinned in (True, False):
        memory = "pinned" if pinned else "pageable"
        times = {p: _matmuls_then_copies(profile, n, size, pinned, p) for p in COPY_PLACEMENTS}
        figures |= copy_figures(memory, times)
    return ScenarioResult("overlap", figures, "pinned_speedup_ratio",
                          copy_compute_overlap.__doc__.splitlines()[0])


def copy_figures(memory: str, times: dict[str, float]) -> dict[str, float]:
    """The overlap scenario's figures for one kind of host memory, from its time per copy placement
    (shared with hw, so measured and predicted figures carry the same names)."""
    return {**{f"{memory}_{p}_s": t for p, t in times.items()},
            f"{memory}_speedup_ratio": times["serial"] / times["overlapped"],
            f"{memory}_default_stream_ratio": times["serial"] / times["default_stream"]}


def multi_gpu_matmuls(profile: Profile, n: int = 50, size: int = 4000, gpus: int = 2) -> ScenarioResult:
    """n 4000x4000 products on each of `gpus` GPUs, issued back to back by one host thread."""
    launch_s = _need_host(profile, "launch_s")
    mm_s = _need_kernel(profile, "matmul").time_s(2.0 * size**3)

    def run(devices: int) -> float:
        m = Machine()
        host = m.host("host0")
        ops = []
        for i in range(n):
            for d in range(devices):
                op = m.op(f"gpu{d} compute", f"mm{i}", mm_s)
                ops.append(op)
                host.steps.append(Launch(op, launch_s, launch_s))
        host.steps.append(Sync(tuple(ops)))
        return m.run()

    one, many = run(1), run(gpus)
    return ScenarioResult("multi-gpu", {"one_gpu_s": one, "all_gpus_s": many, "all_over_one_ratio": many / one},
                          "all_over_one_ratio", multi_gpu_matmuls.__doc__.splitlines()[0])


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
    times = {p.figure: predict(runtime.build(p.schedule, p.gpus, p.microbatches), model, profile, p.copy_streams,
                               runtime=runtime)[0].step_time_s for p in scenario.points}
    return ScenarioResult(scenario.name, scenario.figures(times), scenario.headline, scenario.description)


def _interface(name: str) -> Callable[[Profile], ScenarioResult]:
    """A scenario of parsim.interfaces, imported when run (that module builds on this one)."""
    def run(profile: Profile) -> ScenarioResult:
        from parsim import interfaces

        return getattr(interfaces, name)(profile)
    return run


SCENARIOS: dict[str, Callable[[Profile], ScenarioResult]] = {
    "async": async_front_end,
    "multi-gpu": multi_gpu_matmuls,
    "overlap": copy_compute_overlap,
    **{name: functools.partial(predict_pipeline_scenario, s) for name, s in PIPELINE_SCENARIOS.items()},
    "data-parallel": _interface("data_parallel"),
    "hogwild": _interface("hogwild"),
}


def with_op_costs(profile: Profile, costs: dict) -> Profile:
    """`profile` with the host and kernel costs that `python -m hw.opcosts` measured (its JSON)."""
    try:
        host = dataclasses.replace(profile.host, launch_s=float(costs["host"]["launch_s"]),
                                   sync_s=float(costs["host"]["sync_s"]))
        kernels = {k: KernelCost(float(v["fixed_s"]), float(v["rate"])) for k, v in costs["kernels"].items()}
    except (KeyError, TypeError, ValueError) as e:
        raise ProfileError(f"op-cost measurements are malformed ({type(e).__name__}: {e})") from None
    return dataclasses.replace(profile, host=host, kernels={**profile.kernels, **kernels})


def compare_figures(predicted: ScenarioResult, measured: dict[str, float]) -> list[tuple[str, float, float, float]]:
    """(figure, predicted, measured, relative error) for every figure both sides have."""
    return [(k, predicted.figures[k], v, predicted.figures[k] / v - 1)
            for k, v in measured.items() if k in predicted.figures]
