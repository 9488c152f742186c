"""Starts one process per rank on this machine and brings back their results, or one clear error.

Every wait is bounded: the process group's timeout bounds each collective and message, and the
parent's deadline bounds the whole run; when one rank fails, the others are stopped at once. Every rank dies
with the parent, whatever ends it (hw.run.teardown); SIGTERM or SIGHUP to the parent stops the ranks and names them.
Under torchrun (RANK set) `hw` runs as that rank instead, so the same code runs across hosts, and torchrun's
agent ends it.
"""

from __future__ import annotations

import datetime
import gc
import os
import pickle
import queue
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from parsim.errors import ParsimError
from parsim.interrupts import default_signals, die_with_parent, note

SAFE_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
                 # hw gives each directed channel its own group, so in-group ordering is intended: no warning
                 "TORCH_NCCL_SHOW_EAGER_INIT_P2P_SERIALIZATION_WARNING": "false"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backend_for(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


def autograd_threads() -> list[int]:
    """Thread ids of this process's autograd workers (`pt_autograd_N`): on a GPU they run each backward
    while the thread that called it waits."""
    tids = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().startswith("pt_autograd"):
                    tids.append(int(tid))
        except OSError:  # the thread ended meanwhile
            continue
    return tids


def release_unused(device: torch.device) -> None:
    """Free what finished jobs held on the GPU: a runner sits in reference cycles (its program holds its bound
    methods), so its tensors and graph pools go only when the collector runs, which GPU memory does not prompt."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


@contextmanager
def host_pinned(device: torch.device, slot: int) -> Iterator[None]:
    """On a GPU, bind the calling (dispatching) thread to a core of its own while the block runs: a dispatch-bound
    step runs faster and steadier so, and hw times GPU steps and host costs so. HW_PIN=0 turns it off; HW_PIN=same
    binds the autograd workers to that core too (faster on average, less repeatable: not the default)."""
    mode = os.environ.get("HW_PIN", "1")
    if device.type != "cuda" or mode == "0":
        yield
        return
    threads = [0, *autograd_threads()] if mode == "same" else [0]  # 0: the calling thread
    before = {t: os.sched_getaffinity(t) for t in threads}
    cores = sorted(before[0])
    core = {cores[(slot + 1) % len(cores)]}  # core 0 takes the most interrupts
    for t in threads:
        os.sched_setaffinity(t, core)
    try:
        yield
    finally:
        for t, mask in before.items():
            try:
                os.sched_setaffinity(t, mask)
            except ProcessLookupError:  # an autograd worker that ended
                pass


def local_rank(rank: int) -> int:
    """This process's rank on its host (torchrun's LOCAL_RANK), which picks its GPU and its core."""
    return int(os.environ.get("LOCAL_RANK", rank))


def init_rank(rank: int, world: int, device: str, timeout_s: float) -> torch.device:
    """Join the process group (env:// rendezvous) and pick this rank's device."""
    os.environ.update(SAFE_NCCL_ENV)
    if device == "cuda":
        local = local_rank(rank)
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    dist.init_process_group(backend_for(device), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s),
                            device_id=dev if device == "cuda" else None)
    return dev


def kill_point() -> tuple[int, int] | None:
    """Fault injection for tests: HW_KILL_AT="RANK:N" kills that rank (SIGKILL) at its N-th timed action."""
    spec = os.environ.get("HW_KILL_AT")
    if not spec:
        return None
    rank, n = spec.split(":")
    return int(rank), int(n)


def _entry(parent_pid: int, rank: int, world: int, device: str, timeout_s: float, fn: Callable, args: tuple,
           results: Any) -> None:
    die_with_parent(parent_pid)  # first: a rank must not outlive the run that started it
    try:
        dev = init_rank(rank, world, device, timeout_s)
        out = fn(rank, world, dev, *args)
        # Plain pickle copies tensors into the message; torch's queue would share their storage by file
        # descriptor, which vanishes when this process exits before the parent has read it.
        results.put((rank, "ok", pickle.dumps(out)))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which decides
        results.put((rank, "error", f"{type(e).__name__}: {e}", traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - the group may be broken by a failed peer
                pass


def _death(procs: list, outputs: dict, killed_only: bool = False) -> str | None:
    """A line naming the first rank that died without reporting (killed by a signal, or exited), if any."""
    for r, p in enumerate(procs):
        code = p.exitcode
        if r in outputs or code in (None, 0) or (killed_only and code > 0):
            continue
        return f"rank {r} was killed by signal {-code}" if code < 0 else f"rank {r} exited with status {code}"
    return None


def stop_ranks(procs: list, grace_s: float = 2.0) -> list[int]:
    """Stop every rank still running (SIGTERM, then SIGKILL after grace_s) and reap them all; the ranks it stopped."""
    started = [p for p in procs if p.pid is not None]
    running = [r for r, p in enumerate(procs) if p.pid is not None and p.is_alive()]
    for r in running:
        procs[r].terminate()
    end = time.monotonic() + grace_s
    for p in started:
        p.join(timeout=max(end - time.monotonic(), 0.0))
    for p in started:
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
    return running


def _clear_line() -> None:
    """Blank the terminal line a stopped rank's progress line was left on, so the report starts a clean line."""
    if sys.stderr.isatty():
        sys.stderr.write("\r" + " " * (os.get_terminal_size(sys.stderr.fileno()).columns - 1) + "\r")


CPU_RANKS = 16  # --cpu: a process per rank, each with torch loaded; the 2-core CI machine ran out of processes at 37


def require_gpus(count: int, cpu: bool = False) -> None:
    """Refuse, before anything starts, a run that needs more CUDA GPUs than this machine has (under torchrun only
    one: its ranks may span hosts), or with `cpu`, more rank processes than CPU_RANKS."""
    if cpu:
        if count > CPU_RANKS:
            raise ParsimError(f"--gpus {count} with --cpu starts {count} rank processes; --cpu runs at most "
                              f"{CPU_RANKS} (it tests the pipeline's code, not its scale)")
        return
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have == 0 or (have < count and not under_torchrun()):
        raise ParsimError(f"--gpus {count} needs {count} CUDA GPUs; this machine has {have} "
                          "(pass --cpu to run the ranks on the CPU)")


def launched_rank(env: Mapping[str, str] = os.environ) -> tuple[int, int] | None:
    """(rank, world size) where torchrun (or another launcher) started this process as one rank of a group, None
    where nothing did; one clear error naming the variable where the launcher's environment is partial, malformed or
    inconsistent (hw would otherwise start its own ranks beside a launcher's, or hang at its rendezvous)."""
    given = [v for v in ("RANK", "WORLD_SIZE") if v in env]
    if not given:
        return None
    if len(given) == 1:
        missing = "WORLD_SIZE" if given == ["RANK"] else "RANK"
        raise ParsimError(f"{given[0]} is set but {missing} is not: a launcher such as torchrun sets both; unset "
                          f"{given[0]} to let hw start its own ranks")
    rank, world = _env_whole(env, "RANK", 0), _env_whole(env, "WORLD_SIZE", 1)
    if rank >= world:
        raise ParsimError(f"RANK {rank} is not below WORLD_SIZE {world}: each rank of a launcher's group is 0 .. "
                          "WORLD_SIZE - 1")
    if "LOCAL_RANK" in env:
        _env_whole(env, "LOCAL_RANK", 0)
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not env.get(name, "").strip():
            raise ParsimError(f"{name} is not set: under a launcher (RANK and WORLD_SIZE set) each rank joins the "
                              "group at MASTER_ADDR:MASTER_PORT, which the launcher sets")
    _env_whole(env, "MASTER_PORT", 1, 65535)
    return rank, world


def _env_whole(env: Mapping[str, str], name: str, lo: int, hi: int = 1 << 31) -> int:
    """An environment variable's whole number in [lo, hi], or one clear error naming it."""
    text = env[name].strip()
    if not text.isdigit() or not lo <= int(text) <= hi:
        raise ParsimError(f"{name}={env[name]!r} in the environment: expected a whole number from {lo} to {hi:,}")
    return int(text)


def under_torchrun() -> bool:
    """Whether torchrun (or another launcher) started this process as one rank of a group (launched_rank)."""
    return launched_rank() is not None


def spawn(fn: Callable, world: int, args: tuple = (), device: str = "cpu", timeout_s: float = 60.0,
          deadline_s: float = 600.0) -> list[Any]:
    """Run fn(rank, world, device, *args) in `world` processes; return their results by rank.

    Raises ParsimError naming the first rank that failed, once every process has been stopped.
    Under torchrun this process is one of the ranks instead (see as_torchrun_rank).
    """
    if under_torchrun():
        return as_torchrun_rank(fn, world, args, device, timeout_s)
    ctx = mp.get_context("spawn")
    # A rank stopped mid-write leaves the queue's semaphore behind; the tracker's shutdown warning
    # about it would only add a second line to the one-line error.
    os.environ.setdefault("PYTHONWARNINGS", "ignore::UserWarning:multiprocessing.resource_tracker")
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), **SAFE_NCCL_ENV})
    results = ctx.Queue()
    parent = os.getpid()
    procs = [ctx.Process(target=_entry, args=(parent, r, world, device, timeout_s, fn, args, results), daemon=True)
             for r in range(world)]
    outputs: dict[int, Any] = {}
    failure: str | None = None
    end = time.monotonic() + deadline_s
    try:
        for p in procs:
            p.start()
        while len(outputs) < world and failure is None:
            if time.monotonic() > end:
                failure = f"the run passed its {deadline_s:.3g} s deadline"
                break
            try:
                rank, status, *rest = results.get(timeout=0.2)
            except queue.Empty:
                failure = _death(procs, outputs)
                continue
            if status == "ok":
                outputs[rank] = pickle.loads(rest[0])
            else:  # a rank's error is often the echo of a peer that died first: name that one
                time.sleep(0.5)
                failure = _death(procs, outputs, killed_only=True) or f"rank {rank} failed: {rest[0]}"
    except BaseException as e:  # Ctrl-C, SIGTERM or SIGHUP (parsim.interrupts): say which ranks it stopped
        stopped = stop_ranks(procs)
        if stopped:
            note(e, "stopped " + ", ".join(f"rank {r} (pid {procs[r].pid})" for r in stopped))
            _clear_line()
        raise
    finally:
        stop_ranks(procs)
    if failure:
        raise ParsimError(failure + "; every other rank was stopped")
    return [outputs[r] for r in range(world)]


def as_torchrun_rank(fn: Callable, world: int, args: tuple, device: str, timeout_s: float) -> list[Any]:
    """Run fn as the rank torchrun made this process; rank 0 gets every rank's result, the others exit.

    A rank that fails or dies leaves its peers' next wait to time out after timeout_s, so each
    exits with an error, and torchrun with non-zero status.
    """
    default_signals()  # torchrun's agent ends its workers with SIGTERM (then SIGKILL): end at once, as it expects
    launched = launched_rank()
    assert launched is not None, "spawn runs this under a launcher only"
    rank, size = launched
    if size != world:
        raise ParsimError(f"torchrun started {size} processes but this run needs {world}; "
                          f"pass --nproc-per-node {world} (times the number of nodes)")
    dev = init_rank(rank, world, device, timeout_s)
    try:
        out = fn(rank, world, dev, *args)
        gathered: list[Any] | None = [None] * world if rank == 0 else None
        dist.gather_object(out, gathered, dst=0)
    except (RuntimeError, dist.DistBackendError) as e:  # a peer died or hung: its messages never came
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ParsimError(f"rank {rank} failed: {type(e).__name__}: {first} (did another rank die?)") from None
    finally:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - the group may be broken by a failed peer
            pass
    if rank != 0:
        raise SystemExit(0)  # rank 0 reports for everyone
    if gathered is None:
        raise ParsimError("rank 0 gathered no results")  # rank 0 always makes the list it gathers into
    return gathered
