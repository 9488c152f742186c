"""PyTorch's three data-parallel interfaces as scenarios: nn.DataParallel (threads under one GIL),
DistributedDataParallel (a process per GPU) and torch.multiprocessing Hogwild (processes on CPU cores).

`python -m hw scenario data-parallel` and `hw scenario hogwild` measure the same programs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Generator

import simpy

from parsim.errors import ProfileError
from parsim.profile import GIL_STEP_KEYS, CpuCosts, GilCosts, Profile
from parsim.scenarios.base import ScenarioResult, first_line, need_host, need_kernel
from parsim.schedules import gpipe
from parsim.sim import cpu as cpu_model
from parsim.sim.dataparallel_step import (
    Replica,
    backward_stretch,
    coalesced,
    data_parallel_step_s,
    final_sync_s,
    loss_s,
    need_gil,
    zero_grad_s,
)
from parsim.sim.gil import Gil, GilLaunch, contention, gil_thread
from parsim.sim.machine import Machine
from parsim.sim.predict import simulate
from parsim.workload import Model, StageCost, Work, mlp_model, model_from_spec, stage_costs

LAUNCH_THREADS = tuple(range(1, 9))  # the GIL experiment: N Python threads launching on one GPU
DP_GPUS = tuple(range(1, 9))
HOGWILD_PROCESSES = (1, 2, 4, 8, 16)
HOGWILD_MODEL = "4x128x256"  # each process's step: 4 MLP blocks of 128, 256 tokens (fp32 on the CPU)
TEXT_BATCH = 30  # the text's DataParallel example: nn.Linear(5, 2) on batches of 30
MLP_BLOCKS, MLP_HIDDEN, MLP_TOKENS = 16, 2048, 8192  # the MLP stack (bf16), as hw.interfaces.data_parallel builds it


# --- the GIL experiment ---------------------------------------------------------------------------

PREDICTED_LAUNCHES = 200  # per thread: enough for the steady pace (the simulation's time grows with it)


def launch_pace_s(gil: GilCosts, threads: int, hold_s: float = 0.0, launches: int = PREDICTED_LAUNCHES) -> float:
    """Host time per launch of `threads` Python threads launching small kernels together (each on its own
    stream), each holding the GIL hold_s longer per launch, while all of them launch (as a time-boxed run sees it).

    The kernels are shorter than their launches, so only the host is timed. The pace is read off the launches
    that end before the first thread is done, after every sleeper has been woken twice (the steady state).
    """
    m = Machine()
    lock = Gil.calibrated(m.env, gil)
    step = GilLaunch(None, gil.held_s + hold_s, gil.released_s or 0.0)
    workers = [gil_thread(m, f"thread{t}", lock) for t in range(threads)]
    for w in workers:
        w.steps += [step] * launches
    m.run()
    done = min(w.finished_at or 0.0 for w in workers)  # every one finished: m.run raises on a deadlock
    ends = sorted(end for w in workers for _, _, end in w.launch_spans if end <= done)
    skip = 2 * threads
    return (ends[-1] - ends[skip - 1]) / (len(ends) - skip)


def launch_figures(gil: GilCosts, threads: tuple[int, ...] = LAUNCH_THREADS) -> dict[str, float]:
    """Per thread count: host time per launch of all threads together, and their throughput against one thread."""
    return launch_ratios({n: launch_pace_s(gil, n) for n in threads})


def launch_ratios(per_launch_s: dict[int, float]) -> dict[str, float]:
    """The experiment's figures from its time per launch by thread count (shared with hw, so names pair up)."""
    one = per_launch_s[1]
    return {**{f"launch_threads{n}_s": t for n, t in per_launch_s.items()},
            **{f"launch_threads{n}_speedup_ratio": one / t for n, t in per_launch_s.items()}}


CURVE_CHECK = ("the GIL's launch curve (1-8 threads launching together) is this profile's calibration: the model's "
               "contended launches follow it, so the launch experiment's figures check the calibration (a run of "
               "the same probe at another time), they are not a prediction")
GIL_GAP = ("known gap: on the lent H200 machines this GIL model predicts one and two threads' launches but is fast "
           "from three threads on, where a thread that takes the GIL from another runs its Python several times "
           "slower (docs/model.md, the interfaces' known gap); DataParallel's speedups over 3 or more GPUs are upper "
           "bounds")


def gil_assumption(gil: GilCosts) -> str:
    """What the GIL model takes from the calibration, in one line."""
    held = (f"holds the GIL {gil.held_s * 1e6:.2f} us and runs {gil.released_s * 1e6:.2f} us without it (the op "
            "issued from TorchScript)" if gil.released_s is not None else "holds the GIL all its time (its "
            "GIL-free part was not measured)")
    cores = f"threads on {gil.cores} cores" if gil.cores else "a core per thread"
    share = gil.handoff_share or 0.0
    where = "(as two threads did)" if gil.handoff_share is not None else "(not measured before 2026-11-27)"
    if gil.launch_curve:
        factor = contention(gil.launch_curve)
        curve = ", ".join(f"x{factor(n):.2f} at {n}" for n, _ in gil.launch_curve if n > 1)
        woken = ("while k threads launch, each GIL-held step lasts the launch curve's c_k / c_1 of its time alone "
                 f"({curve}; measured with 1-8 threads launching together), wake-ups included")
    else:
        (s0, c0), (s1, c1) = gil.wake[0], gil.wake[-1]
        woken = ("each release wakes the first sleeper, and the releaser pays a wake-up that grows with how long "
                 f"the sleeper's core was idle ({c0 * 1e6:.1f} us after {s0 * 1e6:.0f} us idle, {c1 * 1e6:.1f} us "
                 f"after {s1 * 1e6:.0f} us; measured with two threads holding the GIL longer per launch)")
    return (f"GIL: a launch takes {gil.launch_s * 1e6:.2f} us alone and {held}; a thread that finds the GIL held "
            f"sleeps in line; {woken}; a launching thread leaves the GIL to the one it woke at {share:.0%} of its "
            f"releases {where} and takes it back first at the rest; {cores}; CPython's forced switch (every 5 ms) "
            "is left out")


# --- nn.DataParallel against DistributedDataParallel ------------------------------------------------

def step_calls_assumption(gil: GilCosts, sync_s: float | None) -> str:
    """How a plain step's frame, the text's Linear and DDP's own work are priced, in one line (both interfaces
    alike; neither carries hw's runner's per-step cost)."""
    def us(t: float | None) -> str:
        return "not measured" if t is None else f"{t * 1e6:.1f} us"

    sync = (f"the final sync {us(final_sync_s(gil, sync_s, 1))} (as timed after a small step), {us(sync_s)} each "
            "further GPU synced")
    if all(getattr(gil, k) is None for k in GIL_STEP_KEYS):
        return ("a module call, loss.backward() and a small matmul cost the host an elementwise launch each (their "
                f"own costs not measured: profiles before 2026-11-27); zero_grad is left out; {sync}")
    zero_grad = ("zero_grad left out (not measured)" if gil.zero_grad_s is None else
                 f"zero_grad {us(gil.zero_grad_s)} for one module of one tensor, {us(gil.zero_grad_module_s)} a "
                 f"further module, {us(gil.zero_grad_param_s)} a further tensor")
    linear = ("the text's Linear: its forward call and backward nodes as timed on a small Linear "
              f"({us(gil.linear_forward_s)}, {us(gil.linear_backward_s)})" if gil.linear_forward_s is not None else
              f"the text's Linear: a module call and a small matmul's launch ({us(gil.matmul_launch_s)}) forward, "
              "the matmul's and an elementwise launch backward")
    ddp = ("DDP's own work not measured (it needs 2+ GPUs' calibration): the module's alone"
           if gil.ddp_forward_s is None else
           f"DDP over 2+ GPUs adds {us(gil.ddp_forward_s)} to the forward and {us(gil.ddp_backward_s)} plus "
           f"{us(gil.ddp_param_s)} a further parameter tensor to the backward (hooks, bucket copies, all-reduce "
           "calls; timed in a process group of one)")
    return (f"a plain step: {zero_grad}; a module call {us(gil.module_call_s)} beyond its launches; the loss "
            f"{us(loss_s(gil))}; loss.backward() {us(gil.backward_call_s)} "
            f"(autograd's set-up and hand-off to its device thread); {linear}; {sync}; the MLP stack's layer costs "
            f"include their own; {ddp}")


def calls_assumption(gil: GilCosts) -> str:
    """How DataParallel's own calls are priced, in one line: as timed on this machine's GPUs, or as launches."""
    mlp = mlp_tensors(MLP_HIDDEN, 2) * MLP_BLOCKS
    chunks = ("replicate's broadcast and the gradients' reduction go chunk by chunk as torch coalesces the "
              f"parameters (10 MiB buffers: {len(coalesced(mlp, True))} and {len(coalesced(mlp, False))} chunks for "
              "the MLP stack)")
    if not gil.calls:
        return ("DataParallel's calls not timed (they need 2+ GPUs: `python -m hw scenario data-parallel --gpus N "
                "--calibrate`): each scatter and gather copy a launch, each thread a plain thread's start and join, "
                f"each chunk a launch; {chunks}")
    timed = {name: points for name, points in gil.calls.items() if name != "backward"}  # backward: read as a ratio
    counts = sorted({g for points in timed.values() for g, _ in points})
    top = {name: max(points)[1] for name, points in timed.items()}
    stretch = {g: backward_stretch(gil, g) for g, _ in gil.calls.get("backward", ()) if g > 1}
    threads = (("together, autograd's device threads take " + ", ".join(f"{s:.2f}x at {g} GPUs" for g, s in
                                                                         sorted(stretch.items()))
                + " one thread's host time for their backward (a probe model's backward timed over 1 GPU and more)")
               if stretch else "autograd's device threads run their backward as fast together as alone (not timed)")
    return (f"DataParallel's calls cost the host what hw timed them at {counts[0]}-{counts[-1]} GPUs on probe tensors "
            f"(at {counts[-1]}: " + ", ".join(f"{name} {t * 1e6:.0f} us" for name, t in sorted(top.items()))
            + f"), linear between GPU counts and along the last two beyond; {chunks}, each further chunk at the "
            f"cost timed per chunk (a launch where not timed); {threads}")


def _text_replica(profile: Profile, batch: int) -> Replica:
    """The text's model, nn.Linear(5, 2) in float32: its forward and its backward's host time as hw timed a small
    Linear's (else a module call and a matmul forward, the weight gradient's matmul and the bias gradient's sum
    backward: a matmul's launch as timed, else an elementwise op's)."""
    launch_s, matmul, gil = need_host(profile, "launch_s"), need_kernel(profile, "matmul"), need_gil(profile)
    mm_launch_s = gil.matmul_launch_s or launch_s
    forward_s = gil.linear_forward_s if gil.linear_forward_s is not None else (gil.module_call_s or 0.0) + mm_launch_s
    backward_s = gil.linear_backward_s if gil.linear_backward_s is not None else mm_launch_s + launch_s
    mm_s = matmul.time_s(2.0 * batch * 5 * 2)
    layer = StageCost(Work(mm_s, forward_s, 1), Work(0.0, 0.0, 1), Work(2 * mm_s, backward_s, 1),
                      send_bytes=batch * 2 * 4, stash_bytes=batch * 5 * 4, grad_bytes=(5 * 2 + 2) * 4)
    return Replica((layer,), batch * 5 * 4, modules=1, tensors=(5 * 2 * 4, 2 * 4))


def mlp_tensors(hidden: int, dtype_bytes: int) -> tuple[int, ...]:
    """An MLP block's parameter tensors' bytes in module order, as hw.nets.blocks.MlpBlock holds them: the layer norm's
    scale and shift, fc1's weight and bias, fc2's weight and bias."""
    return tuple(n * dtype_bytes for n in (hidden, hidden, 4 * hidden**2, 4 * hidden, 4 * hidden**2, hidden))


def model_replica(model: Model, profile: Profile) -> Replica:
    """An MLP stack's layers, each costed as a stage of its own; 4 modules per block, 1 for the Sequential."""
    layers = tuple(stage_costs(model, len(model.layers), 1, profile))
    first = model.layers[0]
    tensors = tuple(b for layer in model.layers for b in mlp_tensors(layer.hidden, layer.dtype_bytes))
    return Replica(layers, model.tokens * first.hidden * first.side**2 * first.dtype_bytes, 4 * len(model.layers) + 1,
                   tensors)


def _ddp_step_s(replica: Replica, gpus: int, profile: Profile) -> float:
    """DDP over `gpus` processes: the whole replica as one stage, its gradients all-reduced in DDP's buckets; one
    GPU: the module alone. A step is zero_grad, forward, loss, backward and a sync of the rank's GPU.

    Its forward's host time includes the loss and the backward call (a launch and autograd's set-up), as
    DataParallel's does, and over 2+ GPUs DDP's own costs where timed (its forward's wrapper; its backward's hooks,
    bucket copies and all-reduce calls, by parameter tensor); neither carries hw's runner's per-action or per-step
    costs (a plain step has no runner)."""
    gil, layers, tensors = need_gil(profile), replica.layers, len(replica.tensor_bytes)
    wrapped = gpus > 1
    ddp_forward = (gil.ddp_forward_s or 0.0) if wrapped else 0.0
    ddp_backward = (gil.ddp_backward_s or 0.0) + (tensors - 1) * (gil.ddp_param_s or 0.0) if wrapped else 0.0
    loss_and_call = Work(0.0, ddp_forward + loss_s(gil) + need_host(profile, "launch_s") + (gil.backward_call_s or 0.0),
                         0)
    stage = StageCost(sum((c.forward for c in layers), loss_and_call),
                      sum((c.backward_input for c in layers), Work(0.0, 0.0, 0)),
                      sum((c.backward_weight for c in layers), Work(0.0, ddp_backward, 0)),
                      layers[-1].send_bytes, sum(c.stash_bytes for c in layers), sum(c.grad_bytes for c in layers))
    host = dataclasses.replace(profile.host, action_s=0.0, step_s=0.0,
                               begin_s=zero_grad_s(gil, replica.modules + wrapped, tensors))
    step_s = simulate(gpipe(1, 1), [stage], dataclasses.replace(profile, host=host), data_parallel=gpus).step_time_s
    return step_s + final_sync_s(gil, profile.host.sync_s, 1)


def dp_figures(name: str, replica_at: Callable[[int], Replica], profile: Profile,
               gpus: tuple[int, ...] = DP_GPUS) -> dict[str, float]:
    """Step time and speedup over one GPU of DataParallel and DDP, for each GPU count, the global batch fixed
    (one node holds them all)."""
    profile = dataclasses.replace(profile, gpus_per_node=max(profile.gpus_per_node, max(gpus)))
    out: dict[str, float] = {}
    one = None
    for g in gpus:
        replica = replica_at(g)
        dp, ddp = data_parallel_step_s(replica, g, profile), _ddp_step_s(replica, g, profile)
        one = one or dp
        out |= {f"dp_{name}_{g}gpus_s": dp, f"ddp_{name}_{g}gpus_s": ddp,
                f"dp_{name}_{g}gpus_speedup_ratio": one / dp, f"ddp_{name}_{g}gpus_speedup_ratio": one / ddp}
    return out


DP_ASSUMPTIONS = (
    "launch experiment: N threads each launch small kernels on its own stream of one GPU for a fixed time; "
    "kernels run faster than they are launched, so only the host is timed",
    "DataParallel's forward threads hold the GIL for the same share of each layer's host time as a launch does; "
    "backward runs in autograd's C++ device threads without it, except Gather's and Broadcast's Python backward",
    "replicate: the parameters broadcast by NCCL chunk by chunk, one all-reduce latency and its bus bandwidth, then "
    "gil.replicate_module_s of Python per module per GPU; gradients reduced onto GPU 0 the same way",
    "scatter and gather: one NVLink copy per GPU; DDP: the whole model one stage, its gradients all-reduced in "
    "25 MiB buckets; neither counts the optimizer step or the data loader",
    f"the global batch is fixed and split as torch's scatter does (ceil): the text's nn.Linear(5, 2) on "
    f"{TEXT_BATCH} samples, the MLP stack ({MLP_BLOCKS} x h={MLP_HIDDEN}) on {MLP_TOKENS} tokens",
)


def data_parallel(profile: Profile) -> ScenarioResult:
    """N threads launching on one GPU (the GIL), and nn.DataParallel against DDP over 1-8 GPUs."""
    gil = need_gil(profile)
    figures = launch_figures(gil)
    assumptions: tuple[str, ...] = DP_ASSUMPTIONS + (
        gil_assumption(gil), step_calls_assumption(gil, profile.host.sync_s), calls_assumption(gil),
        CURVE_CHECK if gil.launch_curve else GIL_GAP, f"GIL costs: {gil.source}")
    if gil.replicate_module_s is None:  # a CPU calibration: the launch experiment alone
        assumptions += ("DataParallel against DDP not predicted: this profile's gil section has no "
                        "replicate_module_s, which `python -m hw calibrate --interfaces` measures on a GPU",)
    else:
        figures |= dp_figures("text", lambda g: _text_replica(profile, math.ceil(TEXT_BATCH / g)), profile)
        figures |= dp_figures("mlp", lambda g: model_replica(
            mlp_model(MLP_BLOCKS, MLP_HIDDEN, math.ceil(MLP_TOKENS / g)), profile), profile)
    return ScenarioResult("data-parallel", figures, "launch_threads8_speedup_ratio",
                          first_line(data_parallel.__doc__), assumptions)


# --- Hogwild ------------------------------------------------------------------------------------------

SPEED_PROBES = {  # what measured CpuCosts.core_speed
    "step": "speeds measured with the Hogwild step itself, 3, 6, 12, .. processes sharing the parameters (more "
            "processes than cores time-share them)",
    "matmul": "speeds measured with a private 128x128 matmul in each process (profiles before 2026-11-24; it "
              "slows more than the Hogwild step as cores fill)",
}


def need_cpu(profile: Profile) -> CpuCosts:
    if profile.cpu is None:
        raise ProfileError("this profile has no cpu section, which the hogwild scenario needs: "
                           "run `python -m hw calibrate --interfaces --out FILE` and pass --profile FILE")
    return profile.cpu


def step_bytes(model: Model) -> float:
    """Bytes one training step moves through memory: the parameters 6 times (read by forward and backward,
    gradients written, then read by SGD with the parameters, which it writes back) and the stash twice."""
    params = sum(layer.params * layer.dtype_bytes for layer in model.layers)
    stash = sum(layer.stash_bytes_per_token for layer in model.layers) * model.tokens
    return float(6.0 * params + 2.0 * stash)


def hogwild_model(cpu: CpuCosts) -> Model:
    """The model whose step the calibration timed, in float32 as the CPU trains it."""
    model = model_from_spec(cpu.step_model)
    return dataclasses.replace(model, layers=tuple(dataclasses.replace(layer, dtype_bytes=4) for layer in model.layers))


def hogwild_step_s(cpu: CpuCosts, processes: int, steps: int = 20) -> float:
    """Seconds per training step of `processes` Hogwild processes together (1 / their steps per second).

    Each step is a job on the cores (the step's time alone, in core-seconds) and on the memory bandwidth
    (its bytes) at once; it ends when both are served, so memory only slows a step once its share is too small.
    """
    env = simpy.Environment()
    cores, memory = cpu_model.cores(env, cpu), cpu_model.memory(env, cpu)
    nbytes = step_bytes(hogwild_model(cpu))
    ends: list[float] = []

    def process() -> Generator[simpy.Event, object, None]:
        for _ in range(steps):
            yield env.all_of([cores.serve(cpu.step_s), memory.serve(nbytes)])
        ends.append(env.now)

    for _ in range(processes):
        env.process(process())
    env.run()
    return max(ends) / (processes * steps)


def hogwild_ratios(step_s: dict[int, float]) -> dict[str, float]:
    """The Hogwild figures from seconds per step by process count (shared with hw, so names pair up)."""
    one = step_s[1]
    return {**{f"hogwild_procs{n}_s": t for n, t in step_s.items()},
            **{f"hogwild_procs{n}_speedup_ratio": one / t for n, t in step_s.items()}}


def hogwild(profile: Profile) -> ScenarioResult:
    """Hogwild: N processes training one model's shared parameters on the CPU, throughput against one process."""
    cpu = need_cpu(profile)
    figures = hogwild_ratios({n: hogwild_step_s(cpu, n) for n in HOGWILD_PROCESSES})
    model = hogwild_model(cpu)
    assumptions = (
        f"each process trains {cpu.step_model} (fp32, one intra-op thread, SGD) on its own data; one step alone "
        f"takes {cpu.step_s * 1e3:.2f} ms of core time and moves {step_bytes(model) / 1e6:.1f} MB "
        f"(parameters x6, stash x2) through memory, the two overlapped",
        f"{cpu.cores} cores shared by the processes (one each up to {cpu.cores}), each at the measured speed for "
        f"that many processes ({', '.join(f'{n}: {s:.2f}' for n, s in sorted(cpu.core_speed.items()))}), "
        f"linear in between, flat beyond; {SPEED_PROBES.get(cpu.core_speed_probe, cpu.core_speed_probe)}",
        f"memory: {cpu.bandwidth_Bps / 1e9:.1f} GB/s shared, at most {cpu.core_bandwidth_Bps / 1e9:.1f} GB/s a "
        "process; updates to the shared parameters take no lock and cost nothing beyond what the speed probe saw",
        f"CPU costs: {cpu.source}",
    )
    return ScenarioResult("hogwild", figures, f"hogwild_procs{max(HOGWILD_PROCESSES)}_speedup_ratio",
                          first_line(hogwild.__doc__), assumptions)
