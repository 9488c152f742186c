"""Host launch and sync costs, and standalone kernel costs, as `parsim.scenarios` needs them."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable

import numpy as np
import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sync_all(devices: Iterable[torch.device]) -> None:
    """Wait for every one of `devices` (the CPU's nothing to wait for)."""
    for d in devices:
        sync(d)


def median_s(fn: Callable[[], object], device: torch.device, repeat: int = 20, warmup: int = 3) -> float:
    """Median wall time of fn() with the device synchronised before and after each call."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeat):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gpu_time_s(fn: Callable[[], object], device: torch.device, batch: int, repeat: int = 20,
               lead_cycles: int = 4_000_000, heat: int = 0, sustained_s: float = 0.0) -> float:
    """GPU time of one call of fn, without the host's launch gaps.

    On CUDA a spin kernel of `lead_cycles` keeps the GPU busy while the host queues `batch` calls, so CUDA events
    around them time the GPU alone; on the CPU it is wall time. heat > 0 puts that many large bf16 matmuls first.
    sustained_s > 0: the calls are timed after `sustained_s` of them at the pace a step at this host's speed keeps
    (duty_lead_s), at the clock the GPU holds under that load, which a call fresh from idle never sees."""
    if device.type != "cuda":
        return median_s(lambda: [fn() for _ in range(batch)], device, repeat) / batch
    for _ in range(3):
        fn()
    if sustained_s > 0:
        busy = _sustained_s(fn, device, batch, repeat, lead_cycles, sustained_s)
        if busy is not None:
            return busy
    heater = torch.ones(8192, 8192, device=device, dtype=torch.bfloat16) if heat else None
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(lead_cycles)  # longer than queueing the batch takes the host
        if heater is not None:
            for _ in range(heat):
                torch.mm(heater, heater)
        start.record()
        for _ in range(batch):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / batch)
    return statistics.median(times)


SPIN_HZ = 2.0e9  # torch.cuda._sleep's cycles per second at an H200's top SM clock (1980 MHz); slower clocks spin longer
LEAD_MARGIN = 1.2  # a lead this much over the slowest host timing's shortfall keeps the host ahead of the GPU


def duty_lead_s(gpu_s: float, host_s: float) -> float | None:
    """How long a spin kernel must run before each call so that the host has queued the whole call before the GPU
    reaches it: 0 where the host (`host_s`, its slowest issue of the call) is faster than the GPU, else a little
    over the difference, so the GPU runs at the duty (and clock) a step at this host's pace gives it. None where the
    host is over twice as slow: the call is then timed fresh behind a long spin, which a slow host's gaps cannot
    reach."""
    if host_s > 2 * gpu_s:
        return None
    return LEAD_MARGIN * max(0.0, host_s - gpu_s)


def slowest_issue_s(fn: Callable[[], object], device: torch.device, repeat: int = 5,
                    setup: Callable[[], object] = lambda: None) -> float:
    """The host's time to issue fn (after an untimed `setup`), the GPU idle when it starts (so the host never waits
    for it): the slowest of `repeat`, so that a lead from it (duty_lead_s) keeps a slow call's host gaps out of the
    GPU's timing too (the lent hosts' steps vary by up to 1.6x). Timed in a run of calls instead, a GPU-bound
    call's host would wait for the GPU's earlier ones."""
    times = []
    for _ in range(repeat):
        sync(device)
        setup()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    sync(device)
    return max(times)


def spin(seconds: float) -> None:
    """Keep the current CUDA stream busy for about `seconds` (longer where the SM clock is below its top)."""
    if seconds > 0:
        torch.cuda._sleep(int(seconds * SPIN_HZ))


def _sustained_s(fn: Callable[[], object], device: torch.device, batch: int, repeat: int, lead_cycles: int,
                 sustained_s: float) -> float | None:
    """gpu_time_s's sustained timing: the calls at the duty this host's pace gives the GPU (duty_lead_s), after
    `sustained_s` of them, each between its own events; None where they are to be timed fresh."""
    host_s = slowest_issue_s(fn, device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(lead_cycles)
    start.record()
    fn()
    end.record()
    end.synchronize()
    one_s = start.elapsed_time(end) / 1e3
    lead_s = duty_lead_s(one_s, host_s)
    if lead_s is None:
        return None
    for _ in range(int(np.ceil(sustained_s / (one_s + lead_s)))):
        spin(lead_s)
        fn()
    spans = []
    for _ in range(repeat * batch):
        spin(lead_s)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        spans.append((start, end))
    spans[-1][1].synchronize()
    return statistics.median(a.elapsed_time(b) / 1e3 for a, b in spans)
