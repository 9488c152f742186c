"""A CPU as shared resources: its cores and its memory bandwidth, each shared by the processes using it at once.

Both are processor sharing, as an operating system's scheduler and a memory controller serve many
requesters: with n jobs on one, each progresses at rate(n) units per second, and a job's end moves
whenever another job starts or ends. Hogwild training is N such processes, each step a job on both.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import simpy

from parsim.profile import CpuCosts


class SharedRate:
    """A capacity shared equally by the jobs on it at once: with n jobs, each gets rate(n) units per second."""

    def __init__(self, env: simpy.Environment, rate: Callable[[int], float]):
        self.env = env
        self.rate = rate
        self.jobs: dict[simpy.Event, list[float]] = {}  # job -> [units left, units asked]
        self.updated_at = 0.0
        self._timer = 0  # only the latest timer may end jobs

    def serve(self, units: float) -> simpy.Event:
        """An event that fires once `units` (core-seconds, bytes) have been served to this job."""
        done = self.env.event()
        if units <= 0:
            return done.succeed()
        self._advance()
        self.jobs[done] = [units, units]
        self._schedule()
        return done

    def _advance(self) -> None:
        """Serve every job what it got since the last change."""
        now = self.env.now
        if self.jobs:
            served = (now - self.updated_at) * self.rate(len(self.jobs))
            for left in self.jobs.values():
                left[0] -= served
        self.updated_at = now

    def _schedule(self) -> None:
        """A timer for the next job to end at the current sharing."""
        self._timer += 1
        if self.jobs:
            first = min(left for left, _ in self.jobs.values())
            timer = self.env.timeout(max(first, 0.0) / self.rate(len(self.jobs)))
            timer.callbacks.append(partial(self._on_timer, self._timer))

    def _on_timer(self, k: int, _: object = None) -> None:
        if k != self._timer:  # a job started or ended since: a newer timer stands
            return
        self._advance()
        for job, (left, asked) in list(self.jobs.items()):
            if left <= asked * 1e-9:
                del self.jobs[job]
                job.succeed()
        self._schedule()


def core_speed(cpu: CpuCosts, processes: int) -> float:
    """A core's speed while `processes` run, against one alone: the measured counts, linear in between, flat beyond
    (more processes than cores time-share them: what that leaves of each core)."""
    busy = processes
    known = sorted(cpu.core_speed.items())
    if busy <= known[0][0]:
        return known[0][1]
    for (n0, s0), (n1, s1) in zip(known, known[1:]):
        if busy <= n1:
            return s0 + (s1 - s0) * (busy - n0) / (n1 - n0)
    return known[-1][1]


def cores(env: simpy.Environment, cpu: CpuCosts) -> SharedRate:
    """The CPU's cores: up to `cores` jobs run on one each, more share them; each at the speed that many allow."""
    return SharedRate(env, lambda n: min(1.0, cpu.cores / n) * core_speed(cpu, n))


def memory(env: simpy.Environment, cpu: CpuCosts) -> SharedRate:
    """The memory bandwidth: shared equally, no job faster than one core can stream."""
    return SharedRate(env, lambda n: min(cpu.core_bandwidth_Bps, cpu.bandwidth_Bps / n))
