"""`python -m hw scenario NAME`: measure a textbook experiment that `parsim scenario` predicts.

Each function runs the same program the simulator models and returns the same figure names.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from hw.measure.steps import Config, Job, measure_jobs, on_rank
from hw.run.ranks import require_gpus
from hw.timing import sync, sync_all
from parsim import flags
from parsim.errors import ParsimError
from parsim.files import Outputs, json_text, nonfinite_to_null
from parsim.profile import CpuCosts, GilCosts, Profile
from parsim.scenarios import COPY_PLACEMENTS, PIPELINE_SCENARIOS, PipelineScenario, copy_figures, peak_figure
from parsim.schedules import build

if TYPE_CHECKING:  # imported where it runs: DataParallel's experiment needs torch.distributed's DDP
    from hw.interfaces.data_parallel import Comparison


@dataclass(frozen=True)
class Recorded:
    """A scenario measured with its raw timings kept, and, with --calibrate, the profile sections timed beside it."""

    figures: dict[str, float]
    costs: dict[str, GilCosts | CpuCosts]  # the profile's section ("gil", "cpu") -> its costs, timed beside
    raw: dict[str, Any]  # the raw timings, written out as they are


def _timed(fn: Callable[[], object], device: torch.device, repeat: int) -> float:
    """Median wall time over `repeat` runs of a whole program that ends in its own sync."""
    fn()  # warm-up: allocator, cuBLAS handles, first-launch costs
    times = []
    for _ in range(repeat):
        sync(device)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_async(device: torch.device, n: int = 10_000, elements: int = 1_000_000, repeat: int = 5) -> dict:
    """`y = x + 1` n times: synchronised after each op, or once at the end."""
    x = torch.rand(elements, device=device)

    def sync_each() -> None:
        for _ in range(n):
            x + 1
            sync(device)

    def sync_once() -> None:
        for _ in range(n):
            x + 1
        sync(device)

    each, once = _timed(sync_each, device, repeat), _timed(sync_once, device, repeat)
    return {"sync_each_s": each, "sync_once_s": once, "speedup_ratio": each / once}


def measure_overlap(device: torch.device, n: int = 50, size: int = 4000, repeat: int = 3) -> dict:
    """n products, each result copied to the host: all copies after all compute, each on a copy stream
    as soon as it is ready, or each right after its product on the compute stream."""
    x = torch.rand(size, size, device=device)
    results = [torch.empty(size, size, device=device) for _ in range(n)]
    figures: dict[str, float] = {}
    for pinned in (True, False):
        times = _copy_times(device, x, results, pinned and device.type == "cuda", repeat)
        figures |= copy_figures("pinned" if pinned else "pageable", times)
    return figures


def _copy_times(device: torch.device, x: torch.Tensor, results: list[torch.Tensor], pin: bool,
                repeat: int) -> dict[str, float]:
    """measure_overlap's three placements of the copies into host buffers, pinned (`pin`) or pageable, timed."""
    # Pre-touched host buffers: fresh host memory is slow to fill on the lent VM.
    hosts = [torch.zeros(x.shape, pin_memory=pin) for _ in results]
    copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def serial() -> None:
        for r in results:
            torch.mm(x, x, out=r)
        for r, h in zip(results, hosts, strict=True):
            h.copy_(r, non_blocking=True)
        sync(device)

    def overlapped() -> None:
        for r, h in zip(results, hosts, strict=True):
            torch.mm(x, x, out=r)
            if copy_stream is None:
                h.copy_(r)
                continue
            copy_stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(copy_stream):
                h.copy_(r, non_blocking=True)
        sync(device)

    def default_stream() -> None:
        for r, h in zip(results, hosts, strict=True):
            torch.mm(x, x, out=r)
            h.copy_(r, non_blocking=True)
        sync(device)

    programs = {"serial": serial, "overlapped": overlapped, "default_stream": default_stream}
    return {p: _timed(programs[p], device, repeat) for p in COPY_PLACEMENTS}


def measure_multi_gpu(device: torch.device, n: int = 50, size: int = 4000, repeat: int = 3) -> dict:
    """n products on GPU 0 alone, then on every GPU, issued back to back by one thread."""
    count = torch.cuda.device_count() if device.type == "cuda" else 0
    if count < 2:
        raise ParsimError(f"the multi-gpu scenario needs at least 2 GPUs; this machine has {count}")
    devices = [torch.device("cuda", d) for d in range(count)]
    xs = [torch.rand(size, size, device=d) for d in devices]

    def run(k: int) -> None:
        for _ in range(n):
            for x in xs[:k]:
                x.mm(x)
        sync_all(devices[:k])

    one, many = _timed(lambda: run(1), device, repeat), _timed(lambda: run(count), device, repeat)
    return {"one_gpu_s": one, "all_gpus_s": many, "all_over_one_ratio": many / one}


def measure_pipeline_scenario(scenario: PipelineScenario, cpu: bool, timeout_s: float = 120.0) -> dict[str, float]:
    """Every point of `scenario` timed with `hw measure`'s machinery, in one process group."""
    model = scenario.model(cpu)
    config = Config(steps=3 if cpu else 20, warmup=1 if cpu else 3, dtype="fp32" if cpu else "bf16")
    jobs = [Job(build(p.schedule, p.gpus, p.microbatches), model, config, copy_streams=p.copy_streams,
                recompute=p.recompute) for p in scenario.points]
    world = max(job.ranks for job in jobs)
    require_gpus(world, cpu=cpu)
    results = measure_jobs(jobs, world, "cpu" if cpu else "cuda", timeout_s)
    figures = {}
    for p, job, r in zip(scenario.points, jobs, results, strict=True):
        figures[p.figure] = statistics.median(on_rank(r, 0).times)
        peaks = [on_rank(r, rank).peak_memory_bytes for rank in range(job.ranks)]
        if scenario.memory and None not in peaks:  # each job's own peak, on a GPU
            figures[peak_figure(p.figure)] = float(max(b for b in peaks if b is not None))
    return scenario.figures(figures)


def measure_data_parallel(device: torch.device, window_s: float | None = None, rounds: int | None = None,
                          calibrate: bool = False,
                          holds_s: tuple[float, ...] | None = None, crowd_holds_s: tuple[float, ...] | None = None,
                          source: str = "", gpus: int | None = None, tiny: bool = False) -> Recorded:
    """The GIL experiment: 1-8 threads launching small kernels for window_s, each on its own stream of one GPU
    (or CPU ops); `rounds` rounds, the counts taking turns (hw.interfaces.launch_threads's WINDOW_S and
    EXPERIMENT_ROUNDS unless given). With calibrate, the GIL's costs (hw.interfaces.launch_threads.gil_costs, holds_s
    and crowd_holds_s as there) are timed in the same rounds, apart from the experiment's points.

    With gpus: nn.DataParallel against DDP too, over 1..gpus GPUs (hw.interfaces.data_parallel: on the CPU gpus gloo
    processes; tiny: a smoke test's sizes)."""
    from hw.interfaces.hogwild import machine
    from hw.interfaces.launch_threads import (
        BLOCK,
        CROWD_HOLDS_S,
        ELEMENTS,
        EXPERIMENT_ROUNDS,
        HOLDS_S,
        WINDOW_S,
        gil_costs,
        launch_times,
    )
    from parsim.scenarios.interfaces import LAUNCH_THREADS, launch_ratios

    window_s = WINDOW_S if window_s is None else window_s
    rounds = EXPERIMENT_ROUNDS if rounds is None else rounds
    before = machine()
    costs: dict[str, GilCosts] = {}
    calibration = None
    if calibrate:
        gil, calibration = gil_costs(device, window_s, rounds, holds_s or HOLDS_S, source,
                                     CROWD_HOLDS_S if crowd_holds_s is None else crowd_holds_s, LAUNCH_THREADS)
        times, costs = calibration.pop("experiment"), {"gil": gil}
    else:
        times = launch_times(device, LAUNCH_THREADS, window_s, rounds)
    raw = {"window_s": window_s, "rounds": rounds, "elements": ELEMENTS[device.type], "block": BLOCK,
           "machine_before": before, "machine_after": machine(), "times": {str(n): t for n, t in times.items()}}
    figures = launch_ratios({n: t["per_launch_s"] for n, t in times.items()})
    if gpus:
        launch_s = costs["gil"].launch_s if calibrate else 0.0
        figures, raw, run = _data_parallel_against_ddp(device, gpus, tiny, figures, raw, calibrate, launch_s)
        if run.calls:  # timed in the comparison's turns and process: the prediction beside it is priced with them
            timed: dict[str, Any] = {"calls": run.calls, **run.ddp, **run.step}  # GilCosts' fields by name
            costs["gil"] = dataclasses.replace(costs["gil"], **timed)
    return Recorded(figures, {**costs}, raw | ({"calibration": calibration} if calibration else {}))


def _data_parallel_against_ddp(device: torch.device, gpus: int, tiny: bool, figures: dict[str, float],
                               raw: dict[str, Any], calls: bool = False, launch_s: float = 0.0,
                               ) -> tuple[dict[str, float], dict[str, Any], Comparison]:
    """The figures and raw record with nn.DataParallel's and DDP's step times over 1..gpus GPUs added, and
    hw.interfaces.data_parallel.measure's result: with calls, on GPUs, DataParallel's calls' host times by GPU count,
    DDP's own costs and a plain step's, timed in the comparison's turns."""
    from hw.interfaces import data_parallel

    steps, rounds = (2, 1) if tiny else (data_parallel.STEPS, data_parallel.ROUNDS)
    run = data_parallel.measure(tuple(range(1, gpus + 1)), device.type, steps, rounds, tiny, calls=calls,
                                launch_s=launch_s)
    return (figures | run.figures, raw | {"data_parallel_against_ddp": {"steps": steps, "rounds": rounds,
                                                                         "step_s": run.raw}}, run)


def measure_hogwild(device: torch.device, spec: str | None = None, duration_s: float | None = None,
                    rounds: int | None = None, counts: tuple[int, ...] | None = None, calibrate: bool = False,
                    source: str = "") -> Recorded:
    """Hogwild on this machine's CPU cores: 1-16 processes training one shared model (the device is unused), in
    `rounds` runs of duration_s (hw.interfaces.hogwild's RUN_S and ROUNDS unless given). With calibrate, the CPU's
    costs (hw.interfaces.hogwild.cpu_costs) are measured in the same rounds, apart from the experiment's counts."""
    from hw.interfaces.hogwild import ROUNDS, RUN_S, cpu_costs, machine
    from hw.interfaces.hogwild import measure_hogwild as measure
    from parsim.scenarios.interfaces import HOGWILD_MODEL, HOGWILD_PROCESSES, hogwild_ratios

    spec, counts = spec or HOGWILD_MODEL, counts or HOGWILD_PROCESSES
    duration_s = RUN_S if duration_s is None else duration_s
    rounds = ROUNDS if rounds is None else rounds
    before = machine()
    costs: dict[str, CpuCosts] = {}
    calibration = None
    if calibrate:
        cpu, calibration = cpu_costs(spec, duration_s, rounds=rounds, source=source, experiment=counts)
        runs, costs = calibration.pop("experiment"), {"cpu": cpu}
    else:
        runs = measure(spec, counts, duration_s, rounds)
    raw = {"model": spec, "duration_s": duration_s, "rounds": rounds, "machine_before": before,
           "machine_after": machine(), "runs": {str(n): r for n, r in runs.items()}}
    return Recorded(hogwild_ratios({n: r["step_s"] for n, r in runs.items()}), {**costs},
                    raw | ({"calibration": calibration} if calibration else {}))


Measure = Callable[..., dict[str, float] | Recorded]  # (device, **sizes) -> the figures, or the figures recorded
MEASURE: dict[str, Measure] = {"async": measure_async, "overlap": measure_overlap, "multi-gpu": measure_multi_gpu,
           "data-parallel": measure_data_parallel, "hogwild": measure_hogwild}
TINY: dict[str, dict[str, Any]] = {  # --cpu: each scenario's keyword arguments at a smoke test's sizes
    "async": {"n": 50, "elements": 16}, "overlap": {"n": 3, "size": 16}, "multi-gpu": {"n": 2, "size": 16},
    "data-parallel": {"window_s": 0.01, "rounds": 2, "tiny": True},
    "hogwild": {"spec": "1x16x8", "duration_s": 0.2, "rounds": 1, "counts": (1, 2)}}
TINY_PROBES: dict[str, dict[str, Any]] = {  # --cpu --calibrate
    "data-parallel": {"holds_s": (0.0, 32e-6), "crowd_holds_s": (32e-6,)}, "hogwild": {}}
ON_ANY_MACHINE = ("data-parallel", "hogwild")  # they run on the CPU where no GPU is visible, at full size
CALIBRATED = ("data-parallel", "hogwild")  # they can time their profile section (gil, cpu) in their own rounds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=sorted([*MEASURE, *PIPELINE_SCENARIOS]))
    parser.add_argument("--cpu", action="store_true", help="run on the CPU at tiny sizes (a smoke test)")
    parser.add_argument("--out", type=flags.path, metavar="FILE", help="also write the result as JSON")
    parser.add_argument("--profile", type=flags.path, metavar="FILE", help="profile for the prediction shown beside it")
    parser.add_argument("--gpus", type=flags.whole(1, 8), metavar="N",
                        help="data-parallel: also measure nn.DataParallel against DDP over 1..N GPUs (N processes; "
                             "with --cpu, N gloo processes at tiny sizes)")
    parser.add_argument("--calibrate", action="store_true",
                        help="data-parallel, hogwild: time the costs the prediction needs (the profile's gil, cpu "
                             "section) in the same rounds as the experiment, apart from its points, and predict "
                             "from them: the lent hosts drift within minutes")


def main(args: argparse.Namespace) -> int:
    from parsim.profile import load_profile

    if args.cpu and args.profile:
        raise ParsimError("--profile is for the prediction shown beside a full-size run; --cpu makes none")
    if args.gpus and args.name != "data-parallel":
        raise ParsimError(f"--gpus is for data-parallel (nn.DataParallel against DDP), not {args.name}")
    if args.gpus:
        require_gpus(args.gpus, cpu=args.cpu)  # now, not after the GIL experiment (the full-size models need the GPUs)
    if args.calibrate and args.name not in CALIBRATED:
        raise ParsimError(f"--calibrate is for {' and '.join(CALIBRATED)}, whose costs are timed beside them; "
                          f"calibrate the others with `python -m hw calibrate`")
    profile = load_profile(args.profile) if args.profile else None  # a bad one fails now, not after the run
    gpu = torch.cuda.is_available()
    if not args.cpu and not gpu and args.name not in ON_ANY_MACHINE:
        raise ParsimError("no CUDA GPU is visible; run on a GPU machine, or pass --cpu for a smoke test")
    with Outputs() as outputs:
        out = outputs.add(args.out, "--out")
        text = json_text(nonfinite_to_null(_result(args, gpu, profile)), indent=2)  # a failed timing: null
        if out:
            outputs.write(out, text + "\n")
        print(text)
    return 0


def _result(args: argparse.Namespace, gpu: bool, profile: Profile | None) -> dict[str, Any]:
    """The scenario measured here, with parsim's prediction of it beside (not with --cpu)."""
    device = torch.device("cuda", 0) if gpu and not args.cpu and args.name != "hogwild" else torch.device("cpu")
    raw: dict[str, Any] | None = None
    costs: dict[str, GilCosts | CpuCosts] = {}
    figures: dict[str, float]
    if args.name in PIPELINE_SCENARIOS:
        figures = measure_pipeline_scenario(PIPELINE_SCENARIOS[args.name], args.cpu)
    else:
        sizes: dict[str, Any] = TINY[args.name] | (TINY_PROBES[args.name] if args.calibrate else {}) if args.cpu else {}
        if args.calibrate:
            now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            sizes |= {"calibrate": True, "source": f"{_device_name(device)}, torch {torch.__version__}, "
                                                   f"python -m hw {' '.join(sys.argv[1:])}, {now}"}
        if args.gpus:
            sizes["gpus"] = args.gpus
        measured = MEASURE[args.name](device, **sizes)
        if isinstance(measured, Recorded):  # the scenario kept its raw timings (and, with --calibrate, its costs) too
            figures, raw, costs = measured.figures, measured.raw, measured.costs
        else:
            figures = measured
    result: dict[str, Any] = {"scenario": args.name, "measured": figures, "device": _device_name(device),
              "torch": torch.__version__, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "python": platform.python_version(), "tiny": bool(args.cpu)}
    if raw is not None:
        result |= {"command": "python -m hw " + " ".join(sys.argv[1:]), "raw": raw}
    if costs:
        result["calibrated"] = {name: dataclasses.asdict(c) for name, c in costs.items()}
    if not args.cpu:
        result["predicted"] = predicted(args.name, profile, costs)
    return result


def _device_name(device: torch.device) -> str:
    """The GPU's name, or the processor's."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"


def predicted(name: str, profile: Profile | None, costs: dict[str, GilCosts | CpuCosts] | None = None,
              ) -> dict[str, float] | str:
    """parsim's figures for the same scenario from `profile` (None: the shipped one) with the sections in `costs`
    replaced (timed beside the experiment), or why there are none."""
    from parsim.errors import ProfileError
    from parsim.profile import load_profile
    from parsim.scenarios import SCENARIOS

    sections: dict[str, Any] = dict(costs or {})  # a Profile field's name -> its value
    try:
        return SCENARIOS[name](dataclasses.replace(profile or load_profile(), **sections)).figures
    except ProfileError as e:
        return f"no prediction: {e}"
