"""Hogwild with torch.multiprocessing: N processes train one model whose parameters live in shared memory,
each updating them without a lock; and the CPU costs `parsim.scenarios.interfaces` models it with (cores, memory).

Every process runs one intra-op thread (torch's advice against oversubscribing the cores) and is forked,
so it shares the parent's model. Each runs for a fixed time after all are ready; its rate is its steps over
the time between its first and last step, and the processes' rates add up to the throughput.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from multiprocessing.queues import Queue
from typing import Any, TypeVar

import torch
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F

from hw.nets.blocks import build_layers
from hw.run.ranks import stop_ranks
from parsim.errors import ParsimError
from parsim.interrupts import default_signals, die_with_parent, note
from parsim.profile import CpuCosts
from parsim.workload import model_from_spec

T = TypeVar("T")

Job = Callable[[], None]  # one step of a process's loop
RUN_S = 0.25  # one timed run of a point: many short runs in shuffled turns (hogwild_rounds)
ROUNDS = 12  # runs per point: 3 s of each in all


def run_processes(make_job: Callable[[int], Job], processes: int, duration_s: float,
                  timeout_s: float = 120.0) -> list[list[float]]:
    """Fork `processes` workers; each builds its job (make_job(rank)), waits for the others, then runs the job
    for duration_s. Returns each one's step end times (time.perf_counter, the same clock for all)."""
    ctx = mp.get_context("fork")
    ready = ctx.Barrier(processes + 1)
    results = ctx.Queue()
    parent = os.getpid()

    def worker(rank: int) -> None:
        die_with_parent(parent)
        default_signals()  # the parent's SIGTERM handler came along with the fork
        torch.set_num_threads(1)
        try:
            job = make_job(rank)
            job()  # warm-up
        except BaseException as e:  # the parent hears of it at once, not after timeout_s
            results.put((rank, f"{type(e).__name__}: {e}"))
            ready.abort()
            raise
        ready.wait(timeout=timeout_s)
        t0 = time.perf_counter()
        ends: list[float] = []
        while not ends or ends[-1] - t0 < duration_s:
            job()
            ends.append(time.perf_counter())
        results.put((rank, ends))

    procs = [ctx.Process(target=worker, args=(r,), daemon=True) for r in range(processes)]
    for p in procs:
        p.start()
    try:
        ready.wait(timeout=timeout_s)
        out = dict(results.get(timeout=duration_s + timeout_s) for _ in procs)
    except Exception as e:  # noqa: BLE001 - a broken barrier or an empty queue: a worker died
        for p in procs:  # a failed worker's reason is in the queue once it has exited
            p.join(timeout=5)
        said = [what for _, what in _drain(results) if isinstance(what, str)]
        codes = [p.exitcode for p in procs]
        raise ParsimError(f"a worker of {processes} did not finish ({'; '.join(said) or type(e).__name__}; "
                          f"exit codes {codes})") from None
    except BaseException as e:  # Ctrl-C, SIGTERM or SIGHUP (parsim.interrupts): stop the workers now
        stopped = stop_ranks(procs, grace_s=0.0)
        if stopped:
            note(e, f"stopped {len(stopped)} worker process(es) (pids {', '.join(str(procs[r].pid) for r in stopped)})")
        raise
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    return [out[r] for r in range(processes)]


def _drain(queue: Queue[Any]) -> list:
    """Whatever the workers left in `queue`."""
    out = []
    while not queue.empty():
        out.append(queue.get(timeout=1))
    return out


def rates(ends: list[list[float]]) -> list[float]:
    """Each process's steps per second between its first and last step end."""
    return [(len(e) - 1) / (e[-1] - e[0]) for e in ends if len(e) > 1]


def hogwild_job(model: nn.Module, tokens: int, hidden: int, lr: float = 1e-4) -> Callable[[int], Job]:
    """A process's training step on the shared `model`: its own random batch, MSE loss, SGD on the shared weights."""
    # the optimizer's first step imports seconds of modules: once, here, before the fork, not in every worker;
    # no backward here: on a machine with GPUs that starts autograd's device threads, and a forked child can
    # then run no backward at all ("Unable to handle autograd's threading in combination with fork")
    warm = torch.zeros(1, requires_grad=True)
    warm.grad = torch.zeros(1)
    torch.optim.SGD([warm], lr=lr).step()

    def make(rank: int) -> Job:
        torch.manual_seed(1000 + rank)
        x, y = torch.randn(tokens, hidden), torch.randn(tokens, hidden)
        opt = torch.optim.SGD(model.parameters(), lr=lr)

        def step() -> None:
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
        return step
    return make


def shared_model(spec: str) -> tuple[nn.Module, int, int]:
    """The model of a spec (LAYERSxHIDDENxTOKENS) in float32, its parameters in shared memory; with hidden, tokens."""
    model = model_from_spec(spec)
    net = nn.Sequential(*build_layers(model)).float()
    net.share_memory()
    return net, model.tokens, model.layers[0].hidden


def hogwild_steps(spec: str, processes: int, duration_s: float) -> dict:
    """Train `spec` Hogwild-style in `processes` processes; seconds per step of all together, and whether the
    shared parameters moved (the parent sees the workers' updates)."""
    net, tokens, hidden = shared_model(spec)
    before = [p.detach().clone() for p in net.parameters()]
    per_process = rates(run_processes(hogwild_job(net, tokens, hidden), processes, duration_s))
    moved = any(not torch.equal(a, p.detach()) for a, p in zip(before, net.parameters(), strict=True))
    return {"step_s": 1 / sum(per_process), "process_rates": per_process, "params_moved": moved}


def shuffled_rounds(points: Sequence[T], rounds: int, run: Callable[[T], dict]) -> dict[T, list[dict]]:
    """Per point, `rounds` runs of it: the points take turns within each round, so that a drift of the host's
    speed touches them all alike, in an order shuffled anew each round (seeded), so that what ran just before a
    point varies (one GIL thread timed right after eight ran ~15% slower than its twin earlier in the round)."""
    runs: dict[T, list[dict]] = {p: [] for p in points}
    for k in range(rounds):
        for p in random.Random(k).sample(list(points), len(points)):
            runs[p].append(run(p))
    return runs


def hogwild_rounds(spec: str, points: list[tuple[str, int]], duration_s: float, rounds: int) -> dict[tuple, dict]:
    """Per point (tag, processes): `rounds` runs in shuffled turns (shuffled_rounds); the median seconds per step and
    every run. A tag keeps two timings of one count apart (the core-speed probe's and the experiment's). Runs should
    be many and short (RUN_S, ROUNDS): a process runs at its vCPU's speed of the moment, which flips."""
    runs = shuffled_rounds(points, rounds, lambda p: hogwild_steps(spec, p[1], duration_s))
    return {p: {"step_s": statistics.median(r["step_s"] for r in v), "runs": v} for p, v in runs.items()}


def measure_hogwild(spec: str, counts: tuple[int, ...], duration_s: float, rounds: int) -> dict[int, dict]:
    """Each process count `rounds` times, the counts taking turns; the median seconds per step of each."""
    runs = hogwild_rounds(spec, [("experiment", n) for n in counts], duration_s, rounds)
    return {n: runs[("experiment", n)] for n in counts}


def cpu_name() -> str:
    """The processor's model name, from /proc/cpuinfo where there is one."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def cpu_cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0))


def machine() -> dict:
    """What the CPU measurements ran on: processor, cores this process may use, and the load at the time."""
    return {"cpu": cpu_name(), "cores": cpu_cores(), "loadavg": os.getloadavg()}


# --- the CPU's costs ------------------------------------------------------------------------------------

def _stream_job(nbytes: int) -> Callable[[int], Job]:
    """A memory-bound probe: copying a private buffer far larger than the caches (2 x nbytes moved a step)."""
    def make(rank: int) -> Job:
        src, dst = torch.ones(nbytes // 4), torch.empty(nbytes // 4)

        def step() -> None:
            dst.copy_(src)
        return step
    return make


def speed_counts(cores: int) -> tuple[int, ...]:
    """Process counts for the core-speed probe, none of them the experiment's (1, 2, 4, 8, 16): 3, 6, 12, ..
    up to the core count (at least to 12: on fewer cores, processes time-share them, as 4-16 do in the
    experiment), and one less than the core count if that is no power of two."""
    counts = [3 << k for k in range(32) if 3 << k <= max(cores, 12)]
    if cores - 1 > max(counts) and (cores - 1) & (cores - 2):
        counts.append(cores - 1)
    return tuple(counts)


def core_speeds(spec: str, cores: int, duration_s: float, rounds: int,
                experiment: tuple[int, ...] = ()) -> tuple[float, dict[int, float], dict, dict[int, dict]]:
    """One Hogwild step alone, and a core's speed with n processes against one alone, from the Hogwild step
    itself: n processes training the shared model, for each n in speed_counts(cores) (the counts take turns in
    each round; medians over rounds): all their steps a second over min(n, cores), against one alone.

    experiment: process counts of the Hogwild experiment to run in the same rounds, apart from the probe's (its
    one process is not the probe's own): per count, as measure_hogwild gives them.
    """
    counts = (1, *speed_counts(cores))
    runs = hogwild_rounds(spec, [("probe", n) for n in counts] + [("experiment", n) for n in experiment],
                          duration_s, rounds)
    step = {n: runs[("probe", n)]["step_s"] for n in counts}
    speed = {1: 1.0} | {n: step[1] / (step[n] * min(n, cores)) for n in counts[1:]}
    return (step[1], speed, {str(n): runs[("probe", n)]["runs"] for n in counts},
            {n: runs[("experiment", n)] for n in experiment})


def cpu_costs(spec: str, duration_s: float = 1.0, stream_bytes: int = 64 << 20, rounds: int = 2,
              source: str = "", experiment: tuple[int, ...] = ()) -> tuple[CpuCosts, dict]:
    """Cores, each core's speed as more are busy (the Hogwild step's own), memory bandwidth of one core and of
    all, and one Hogwild step of `spec` alone; with experiment, raw["experiment"] as in core_speeds."""
    cores = cpu_cores()
    stream = {n: rates(run_processes(_stream_job(stream_bytes), n, duration_s)) for n in (1, cores)}
    moved = 2 * stream_bytes
    step_s, core_speed, runs, measured = core_speeds(spec, cores, duration_s, rounds, experiment)
    costs = CpuCosts(cores, core_speed, moved * statistics.median(stream[1]), moved * sum(stream[cores]),
                     step_s, spec, source, core_speed_probe="step")
    raw = {"speed_probe_runs": runs, "stream_rates": {str(n): r for n, r in stream.items()},
           "stream_bytes": moved, "duration_s": duration_s, "rounds": rounds}
    return costs, raw | ({"experiment": measured} if experiment else {})
