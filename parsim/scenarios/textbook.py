"""The textbook's experiments on one host thread: asynchronous launches, copy-compute overlap, several GPUs."""

from __future__ import annotations

import simpy

from parsim.profile import Profile
from parsim.scenarios.base import ScenarioResult, first_line, need_host, need_kernel
from parsim.sim.machine import HostThread, Launch, Machine, Sync, Task


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
    t1, t3 = need_host(profile, "launch_s"), need_host(profile, "sync_s")
    t2 = need_kernel(profile, "elementwise").time_s(2 * 4 * elements)  # read x, write y
    sync_each = _loop(n, t1, t2, t3, sync_each=True)
    once = _loop(n, t1, t2, t3, sync_each=False)
    return ScenarioResult("async", {"sync_each_s": sync_each, "sync_once_s": once,
                                    "speedup_ratio": sync_each / once, "t1_s": t1, "t2_s": t2, "t3_s": t3},
                          "speedup_ratio", first_line(async_front_end.__doc__))


COPY_PLACEMENTS = ("serial", "overlapped", "default_stream")  # where each result's copy to the host goes


def _matmuls_then_copies(profile: Profile, n: int, size: int, pinned: bool, placement: str) -> float:
    """n products of size x size float32 matrices on GPU 0, each result copied to the host.

    serial: all copies after all products. overlapped: each copy on a copy stream as soon as its
    product is done (an event). default_stream: each copy right after its product, but on the compute
    stream, so the next product waits for it: nothing overlaps. A copy into pageable memory blocks
    the host until it is done (CUDA stages it through a pinned buffer), so it cannot overlap
    anything the host issues later.
    """
    launch_s = need_host(profile, "launch_s")
    mm_s = need_kernel(profile, "matmul").time_s(2.0 * size**3)
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


def _copy(m: Machine, host: HostThread, after: Task, i: int, copy_s: float, launch_s: float,
          engine: tuple[simpy.Resource, ...], pinned: bool, stream: str) -> Task:
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
    figures: dict[str, float] = {}
    for pinned in (True, False):
        memory = "pinned" if pinned else "pageable"
        times = {p: _matmuls_then_copies(profile, n, size, pinned, p) for p in COPY_PLACEMENTS}
        figures |= copy_figures(memory, times)
    return ScenarioResult("overlap", figures, "pinned_speedup_ratio",
                          first_line(copy_compute_overlap.__doc__))


def copy_figures(memory: str, times: dict[str, float]) -> dict[str, float]:
    """The overlap scenario's figures for one kind of host memory, from its time per copy placement
    (shared with hw, so measured and predicted figures carry the same names)."""
    return {**{f"{memory}_{p}_s": t for p, t in times.items()},
            f"{memory}_speedup_ratio": times["serial"] / times["overlapped"],
            f"{memory}_default_stream_ratio": times["serial"] / times["default_stream"]}


def multi_gpu_matmuls(profile: Profile, n: int = 50, size: int = 4000, gpus: int = 2) -> ScenarioResult:
    """n 4000x4000 products on each of `gpus` GPUs, issued back to back by one host thread."""
    launch_s = need_host(profile, "launch_s")
    mm_s = need_kernel(profile, "matmul").time_s(2.0 * size**3)

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
                          "all_over_one_ratio", first_line(multi_gpu_matmuls.__doc__))
