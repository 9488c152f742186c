"""Python's interpreter lock (GIL) as a host resource: threads of one process take turns running Python.

A GilThread is a HostThread whose launches hold the process's GIL for their Python part and run the
rest (argument parsing done, the C++ dispatch and the driver's launch) without it, as torch's bindings
release it. Threads waiting for the GIL take it in turn; each handoff from one thread to another may
cost the newcomer a calibrated handoff_s (waking it). Kept apart from HostThread, whose run is the
simulator's hot loop: a thread that holds no GIL never pays for this one's events.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import simpy

from parsim.sim.machine import HostThread, Launch, Machine, Op


class GilLaunch(NamedTuple):
    """Host step under the GIL: hold it for held_s, then released_s without it; `op` (if any) is issued at the end."""

    op: Op | None
    held_s: float
    released_s: float


class Gil:
    """One process's GIL: one thread holds it at a time; waiting threads take it first come, first served.

    Taking it from another thread costs handoff_s more, held (the measured cost of contention per launch);
    taking it back with no one else in between costs nothing.
    """

    def __init__(self, env: simpy.Environment, handoff_s: float = 0.0):
        self.env = env
        self.handoff_s = handoff_s
        self.lock = simpy.Resource(env, capacity=1)
        self.last_holder: object | None = None
        self.held_s = 0.0  # time it was held, handoffs included, for reports and tests
        self.handoffs = 0

    def hold(self, thread: object, seconds: float) -> Iterator[simpy.Event]:
        """Take the GIL (waiting in line), hold it `seconds` (plus a handoff if it changed hands), give it back."""
        with self.lock.request() as req:
            yield req
            if self.last_holder is not None and self.last_holder is not thread:
                seconds += self.handoff_s
                self.handoffs += 1
            self.last_holder = thread
            self.held_s += seconds
            if seconds > 0:
                yield self.env.timeout(seconds)


def issue(op: Op, available_at: float, last_issue_at: float, wake: Callable[[Op], None]) -> None:
    """The host's part of launching `op` is done: the device may start it from `available_at`.

    HostThread.run does the same inline (its hot loop); this is the slow path's copy of it.
    """
    if available_at > op.available_at:
        op.available_at = available_at
    if last_issue_at > op.last_issue_at:
        op.last_issue_at = last_issue_at
    op.issuers -= 1
    if op.issuers == 0:
        op._issued = True
        if op.waiters:
            wake(op)


@dataclass
class GilThread(HostThread):
    """A Python thread of a process with a GIL: GilLaunch steps take it, Launch steps (C++ threads such as
    autograd's device threads) and syncs do not, as torch's synchronize and Thread.join release it."""

    gil: Gil | None = None
    launch_spans: list[tuple[Op | None, float, float]] = field(default_factory=list)

    def run(self, env: simpy.Environment, wake: Callable[[Op], None]) -> Iterator[simpy.Event]:
        self.started_at = env.now
        for step in self.steps:
            kind = type(step)
            if kind is GilLaunch:
                op, held_s, released_s = step
                start = env.now
                yield from self.gil.hold(self, held_s)
                if released_s > 0:
                    yield env.timeout(released_s)
                self.launch_spans.append((op, start, env.now))
                if op is not None:
                    issue(op, env.now, env.now, wake)
            elif kind is Launch:
                op, host_s, first_s = step
                issue(op, env.now + first_s, env.now + host_s, wake)
                if host_s > 0:
                    self.launch_spans.append((op, env.now, env.now + host_s))
                    yield env.timeout(host_s)
            else:
                for op in step.ops:
                    if op._done is not True:
                        self.blocked_on = op
                        yield op.wait_done()
                    if op.end_s > env.now:  # an op settled ahead of the clock
                        yield env.timeout(op.end_s - env.now)
                self.blocked_on = None
                self.synced_at.append(env.now)
        self.finished_at = env.now

    def spans(self) -> list[tuple[Op, float, float]]:
        """(op, start, end) of each launch, as run saw them (waits for the GIL included)."""
        return [(op, a, b) for op, a, b in self.launch_spans if op is not None]


def gil_thread(machine: Machine, name: str, gil: Gil) -> GilThread:
    """A new thread of the process that owns `gil`, run by `machine` with its other hosts."""
    thread = GilThread(name, gil=gil)
    machine.hosts.append(thread)
    return thread
