"""Observers a runner calls around each action: GPU-event and host-clock timers."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

import torch

from parsim.schedules import Action

Mark = torch.cuda.Event | float  # a point in time: a recorded CUDA event on a GPU, perf_counter's seconds on the CPU


def between(start: Mark, end: Mark) -> float:
    """Seconds from one mark to another of the same kind."""
    if isinstance(start, float) and isinstance(end, float):
        return end - start
    if isinstance(start, torch.cuda.Event) and isinstance(end, torch.cuda.Event):
        return start.elapsed_time(end) / 1e3
    raise TypeError(f"marks of different kinds: {type(start).__name__} and {type(end).__name__}")


class ActionTimer:
    """Times each compute action: CUDA events on a GPU (read after the step), wall clock on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.open: dict[Action, Mark] = {}
        self.spans: list[tuple[Action, Mark, Mark]] = []
        self.first: Mark | None = None  # the first compute's start mark

    def _mark(self) -> Mark:
        """Now: a CUDA event recorded on the current stream, or the host's clock."""
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def __call__(self, action: Action, phase: str) -> None:
        if not action.is_compute:
            return
        mark = self._mark()
        if phase == "start":
            self.open[action] = mark
            if self.first is None:
                self.first = mark
        else:
            self.spans.append((action, self.open.pop(action), mark))

    def seconds(self) -> dict[tuple[int, str], list[float]]:
        """(stage, op) -> durations; on a GPU call after the device is synchronised."""
        out: dict[tuple[int, str], list[float]] = defaultdict(list)
        for action, start, end in self.spans:
            out[action.stage, action.op].append(between(start, end))
        return out

    def timeline(self) -> list[tuple[str, float, float]]:
        """(action, start, end) of each compute in seconds from the first one's start, in the order they ended: where
        the rank's compute stream waited between them, without a profiler's host overhead."""
        first = self.first
        if first is None:  # no compute was timed
            return []
        return [(str(action), between(first, start), between(first, end)) for action, start, end in self.spans]


class HostSpans:
    """The host's wall time around each action `keep` accepts: what the front end spends issuing it."""

    def __init__(self, keep: Callable[[Action], bool] = lambda action: True):
        self.keep = keep
        self.open: dict[Action, float] = {}
        self.spans: list[tuple[Action, float]] = []

    def __call__(self, action: Action, phase: str) -> None:
        if not self.keep(action):
            return
        if phase == "start":
            self.open[action] = time.perf_counter()
        else:
            self.spans.append((action, time.perf_counter() - self.open.pop(action)))

    def of(self, op: str) -> list[float]:
        """The spans of every action of kind `op`."""
        return [s for action, s in self.spans if action.op == op]
