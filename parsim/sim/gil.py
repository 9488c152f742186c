"""Python's interpreter lock (GIL) as CPython hands it between threads, and what waking a sleeping thread costs.

A thread that finds the GIL held sleeps in line; a release wakes the first sleeper and the releaser pays a wake-up
that grows with how long the sleeper's core was idle (`GilCosts.wake`). A launching thread that wants the GIL back
takes it before the woken one runs, except at the calibrated share of releases (`GilCosts.handoff_share`); a thread
that leaves (sync, join, end) hands it to the woken one. Where the profile has the launch curve (1-8 threads
launching together, `GilCosts.launch_curve`), that curve is the calibration: while k threads launch, a GIL-held step
lasts c_k / c_1 of its time alone (`contention`, `Gil.stretched`) and wake-ups cost nothing apart.
Kept apart from HostThread, whose run is the simulator's hot loop: a thread without a GIL pays nothing here."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import simpy

from parsim.profile import GilCosts
from parsim.sim.machine import HostThread, Launch, Machine, Sync, Task

WakeCost = Callable[[float], float]  # how long a core has been idle (s) -> what waking a thread on it costs (s)


class GilLaunch(NamedTuple):
    """Host step under the GIL: hold it for held_s, then released_s without it; `op` (if any) is issued at the end."""

    op: Task | None
    held_s: float
    released_s: float


def wake_cost(points: Sequence[tuple[float, float]]) -> WakeCost:
    """The cost of a wake-up, linear between the measured (slept_s, cost_s) points and flat beyond them."""
    if not points:
        return lambda slept_s: 0.0
    import numpy as np  # where used: importing it costs every command a tenth of a second

    slept, cost = np.array(points, dtype=float).T
    return lambda slept_s: float(np.interp(slept_s, slept, cost))


def contention(curve: Sequence[tuple[int, float]]) -> Callable[[int], float]:
    """k launching threads -> how much longer a GIL-held step lasts than with one thread: c_k / c_1 of the launch
    curve, linear between the measured counts and flat beyond them.

    k threads whose launches hold the GIL all their time (as hw calibrate measures them) launch one at a time, so
    their pace is each launch's held time: stretched so, it is the curve's c_k exactly.
    """
    if not curve:
        return lambda k: 1.0
    import numpy as np  # where used (see wake_cost)

    counts, per_launch = np.array(curve, dtype=float).T
    factors = per_launch / float(np.interp(1.0, counts, per_launch))
    return lambda k: 1.0 if k <= 1 else float(np.interp(k, counts, factors))


def wake_points(one_s: Sequence[float], two_s: Sequence[float]) -> tuple[tuple[float, float], ...]:
    """The wake-up curve from the two-thread probes: one_s[k] and two_s[k] are the time per launch of one and of
    two threads that hold the GIL some extra time after each launch (the k-th hold).

    Each probe is read as the model runs it (`wake_readings`); with two threads the sleeper's core has been idle
    for one launch of the other, one_s[k], and each launch costs two_s[k] - one_s[k] more than alone; the
    readings are fitted as `wake_curve` fits them.
    """
    return wake_curve(wake_readings(2, one_s, two_s))


def wake_curve(readings: Sequence[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """(slept_s, cost_s) readings as a curve: in order of sleep, the costs fitted never to fall as the core sleeps
    longer (a deeper idle state is never quicker to leave) and never below zero."""
    import numpy as np  # where used (see wake_cost)

    slept, cost = np.array(sorted(readings), dtype=float).reshape(-1, 2).T
    fitted = np.maximum(non_decreasing(cost), 0.0)
    return tuple((float(s), float(c)) for s, c in zip(slept, fitted))


def wake_readings(threads: int, one_s: Sequence[float], many_s: Sequence[float]) -> list[tuple[float, float]]:
    """(how long the sleeper's core idled, what its wake-up cost) as the model reads `threads` threads launching
    together, many_s[k] a launch, against one thread's one_s[k] with the same extra hold.

    One thread keeps the GIL and wakes a sleeper at every launch, so each launch costs c = many_s[k] - one_s[k]
    more than alone; each of the threads-1 sleepers is woken once every threads-1 launches and went back to sleep
    when last woken, so its core idled (threads-1) many_s[k] - c (one_s[k] with two threads). Where the GIL is
    handed over instead (Gil.handoff_share), the sleeper idles c longer: the same pace, within 0.01% on every
    committed calibration. Not fitted: a reading of probes at one thread count, to set beside the curve that
    another count calibrated.
    """
    return [((threads - 2) * many + one, many - one) for one, many in zip(one_s, many_s)]  # (threads-1) many - c


def non_decreasing(values: Sequence[float]) -> list[float]:
    """The non-decreasing sequence nearest to `values` in least squares (isotonic regression: pool adjacent
    violators). scipy.optimize.isotonic_regression does it from scipy 1.12; parsim allows scipy 1.10."""
    blocks: list[list[float]] = []  # [mean, count] of each pooled run
    for v in values:
        blocks.append([float(v), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return [m for m, n in blocks for _ in range(int(n))]


@dataclass
class _Sleeper:
    thread: object
    event: simpy.Event  # fires when it is handed the GIL


class Gil:
    """One process's GIL: held by one thread at a time; a line of sleepers; a wake-up cost per sleeper woken.

    Threads run on `cores` CPU cores, the i-th thread seen on core i mod cores (one core each if None); a
    sleeper's core has been idle since any thread last ran on it (not idle while one runs there).
    """

    def __init__(self, env: simpy.Environment, wake: WakeCost | None = None, cores: int | None = None,
                 handoff_share: float = 0.0, contended: Callable[[int], float] | None = None):
        self.env = env
        self.wake = wake or (lambda slept_s: 0.0)
        self.contended = contended or (lambda k: 1.0)
        self.launching: set[int] = set()  # id() of the threads in a run of GIL-held steps
        self.cores = cores
        self.handoff_share = handoff_share
        self._handoff_credit = 0.0
        self.holder: object | None = None  # holding it, or woken to take it
        self.line: deque[_Sleeper] = deque()
        self._core: dict[int, int] = {}  # id(thread) -> its core
        self._running: Counter[int] = Counter()  # threads running on each core
        self._idle_since: dict[int, float] = {}
        self.held_s = 0.0  # for reports and tests
        self.wakes = 0  # sleepers woken
        self.wake_s = 0.0  # what waking them cost
        self.handoffs = 0  # of the GIL to a woken sleeper

    @classmethod
    def calibrated(cls, env: simpy.Environment, costs: GilCosts) -> Gil:
        """The GIL of a process on the calibrated host: its launch curve (or else its wake-up curve), cores and
        hand-off share."""
        if costs.launch_curve:
            return cls(env, None, costs.cores, costs.handoff_share or 0.0, contention(costs.launch_curve))
        return cls(env, wake_cost(costs.wake), costs.cores, costs.handoff_share or 0.0)

    def stretched(self, held_s: float) -> float:
        """How long a step that holds the GIL held_s alone holds it while the threads now launching do."""
        return held_s * self.contended(len(self.launching))

    # --- where threads run ---

    def core(self, thread: object) -> int:
        key = id(thread)  # threads are dataclasses: compared by value, not hashable
        if key not in self._core:
            n = len(self._core)
            self._core[key] = n % self.cores if self.cores else n
        return self._core[key]

    def running(self, thread: object) -> None:
        """`thread` runs on its core from now (it started, or woke from a sync or from the line)."""
        self._running[self.core(thread)] += 1

    def stopped(self, thread: object) -> None:
        """`thread` leaves its core (it sleeps or ends); the core is idle from now if no other thread runs there."""
        core = self.core(thread)
        self._running[core] -= 1
        self._idle_since[core] = max(self._idle_since.get(core, 0.0), self.env.now)

    def slept_s(self, thread: object) -> float:
        """How long the core `thread` would wake on has been idle."""
        core = self.core(thread)
        if self._running[core] > 0:
            return 0.0
        return max(self.env.now - self._idle_since.get(core, 0.0), 0.0)

    # --- the lock ---

    def take(self, thread: object) -> simpy.Event | None:
        """Take the GIL: None if `thread` has it at once, else the event that hands it over (the thread sleeps)."""
        if self.holder is None:
            self.holder = thread
            return None
        sleeper = _Sleeper(thread, self.env.event())
        self.line.append(sleeper)
        self.stopped(thread)
        return sleeper.event

    def release(self, thread: object, coming_back: bool) -> float:
        """Give the GIL up and wake the first sleeper; what waking it costs `thread` (0 if none sleeps).

        coming_back: `thread` will want the GIL again straight after its GIL-free part; it then takes it
        before the woken one runs, which goes back to sleep, last in line, except at handoff_share of such
        releases. Otherwise the woken one takes it.
        """
        self.holder = None
        if not self.line:
            return 0.0
        if coming_back:
            coming_back = not self._hands_off()
        first = self.line.popleft()
        cost = self.wake(self.slept_s(first.thread))
        self.wakes += 1
        self.wake_s += cost
        woken_at = self.env.now + cost
        if coming_back:  # it ran a moment at woken_at, found the GIL taken and sleeps again
            core = self.core(first.thread)
            self._idle_since[core] = max(self._idle_since.get(core, 0.0), woken_at)
            self.line.append(first)
        else:
            self.holder = first.thread
            self.handoffs += 1
            timer = self.env.timeout(cost)
            timer.callbacks.append(lambda _: _succeed(first.event))
        return cost

    def _hands_off(self) -> bool:
        """Whether this release of a thread that wants the GIL back goes to the sleeper it wakes: handoff_share of
        them, spread evenly (a running sum), so the order is the same from run to run."""
        self._handoff_credit += self.handoff_share
        if self._handoff_credit < 1.0:
            return False
        self._handoff_credit -= 1.0
        return True


def _succeed(event: simpy.Event) -> None:
    event.succeed()


def issue(op: Task, available_at: float, last_issue_at: float, wake: Callable[[Task], None]) -> None:
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
    """A Python thread of a process with a GIL: GilLaunch steps take it; Launch steps (C++ threads such as autograd's
    device threads) and syncs do not, as torch's synchronize and Thread.join release it."""

    # a GIL thread's steps may take the GIL too: a wider list than a plain host's
    steps: list[Launch | Sync | GilLaunch] = field(default_factory=list)  # type: ignore[assignment]
    gil: Gil | None = None
    launch_spans: list[tuple[Task | None, float, float]] = field(default_factory=list)

    def run(self, env: simpy.Environment, wake: Callable[[Task], None]) -> Generator[simpy.Event, object, None]:
        gil = self.gil
        assert gil is not None, "a GIL thread is made by gil_thread, with its process's GIL"
        self.started_at = env.now
        gil.running(self)
        steps = self.steps
        for i, step in enumerate(steps):
            if isinstance(step, GilLaunch):
                op, held_s, released_s = step
                start = env.now
                gil.launching.add(id(self))
                handed = gil.take(self)
                if handed is not None:
                    yield handed
                    gil.running(self)
                held_s = gil.stretched(held_s)
                if held_s > 0:
                    gil.held_s += held_s
                    yield env.timeout(held_s)
                coming_back = i + 1 < len(steps) and isinstance(steps[i + 1], GilLaunch)
                free_s = gil.release(self, coming_back) + released_s
                if free_s > 0:
                    yield env.timeout(free_s)
                self.launch_spans.append((op, start, env.now))
                if op is not None:
                    issue(op, env.now, env.now, wake)
            elif isinstance(step, Launch):
                launched, host_s, first_s = step
                issue(launched, env.now + first_s, env.now + host_s, wake)
                if host_s > 0:
                    self.launch_spans.append((launched, env.now, env.now + host_s))
                    yield env.timeout(host_s)
            else:
                gil.launching.discard(id(self))
                for synced in step.ops:
                    if synced._done is not True:
                        self.blocked_on = synced
                        gil.stopped(self)
                        yield synced.wait_done()
                        gil.running(self)
                    if synced.end_s > env.now:  # an op settled ahead of the clock
                        yield env.timeout(synced.end_s - env.now)
                self.blocked_on = None
                self.synced_at.append(env.now)
        gil.launching.discard(id(self))
        gil.stopped(self)
        self.finished_at = env.now

    def spans(self) -> list[tuple[Task, float, float]]:
        """(op, start, end) of each launch, as run saw them (waits for the GIL included)."""
        return [(op, a, b) for op, a, b in self.launch_spans if op is not None]


def gil_thread(machine: Machine, name: str, gil: Gil) -> GilThread:
    """A new thread of the process that owns `gil`, run by `machine` with its other hosts."""
    thread = GilThread(name, gil=gil)
    machine.hosts.append(thread)
    return thread
