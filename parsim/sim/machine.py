"""The machine model in SimPy: host threads issue ops onto streams; streams run them in order.

Asynchronous execution falls out of it: a host pays a dispatch cost per op and moves on, an op
starts once issued, once its stream reaches it and once its dependencies (events, as
cudaStreamWaitEvent) are done. Ops holding a shared resource (a copy engine, a link)
serialise on it; ops on different streams and resources overlap.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from parsim.errors import ScheduleError
from parsim.progress import watch as watch_progress
from parsim.sim.collector import gc_paused as gc_paused  # its home before parsim.sim.collector

if TYPE_CHECKING:  # imported where a machine is made: a step the walk settles needs no SimPy (nor its start-up)
    import simpy

_NAN = float("nan")


class Task:
    """One piece of device work (kernel, copy, message) on one stream.

    It may start once every host that must issue it has done so (`issuers`), its stream is
    free, its dependencies are done and its resources are free. Waiting on an op that is
    already issued or done costs no simulation event. It lasts `gpu_s`, but not
    less than the host's last launch plus `tail_s`: a host issuing kernels slower than the
    GPU runs them keeps the GPU waiting. "Done" means its end time is known, which may be
    ahead of the simulation clock. HostThread.run issues ops and Stream.advance settles them,
    inline: they are the hot loops of large runs.
    """

    __slots__ = ("env", "label", "track", "category", "gpu_s", "tail_s", "deps", "resources", "issuers",
                 "available_at", "last_issue_at", "start_s", "end_s", "_issued", "_done", "waiters", "contended",
                 "held")

    def __init__(self, env: simpy.Environment, label: object, track: str, gpu_s: float, *,
                 category: str = "compute", tail_s: float = 0.0, issuers: int = 1,
                 resources: tuple[simpy.Resource, ...] = ()):
        if not gpu_s >= 0:  # also rejects NaN
            raise ScheduleError(f"{label}: duration must be >= 0 seconds, got {gpu_s}")
        # One store per statement: a large run makes 260k ops, and tuple assignments are slower.
        self.env = env
        self.label = label
        self.track = track
        self.category = category
        self.gpu_s = gpu_s
        self.tail_s = tail_s
        self.deps: list[Task] = []
        self.resources = resources
        self.issuers = issuers
        self.available_at = self.last_issue_at = 0.0
        self.start_s = self.end_s = _NAN
        # False until it is done; then True, or the event a host's sync yields on (fired then).
        self._done: bool | simpy.Event = False
        self._issued = self.contended = self.held = False
        # contended: a resource of it is shared with another stream's ops (set by Machine.run);
        # held: it has been handed to the clock to take them in time order (Machine.hold).
        self.waiters: list[Stream] | None = None  # streams stopped at it until it is issued or done

    @property
    def name(self) -> str:
        """What the op is, e.g. 'F(s0,m3)'; built on demand, as large runs never print most ops."""
        return str(self.label)

    @property
    def is_done(self) -> bool:
        return self._done is True

    @property
    def is_issued(self) -> bool:
        return self._issued is True

    def wait_done(self) -> simpy.Event:
        """An event that fires when the op ends; only for an op that is not done."""
        if self._done is False:
            self._done = self.env.event()
        return self._done  # type: ignore[return-value]  # an Event: asked only of an op not done


class Launch(NamedTuple):
    """Host step: spend host_s launching `op`; the device may start it after first_s."""

    op: Task
    host_s: float
    first_s: float


class Sync(NamedTuple):
    """Host step: block until every op in `ops` is done (cudaStreamSynchronize, .item(), ...)."""

    ops: tuple[Task, ...]


@dataclass
class HostThread:
    """One rank's Python thread: runs its steps in order, busy during launches."""

    name: str
    steps: list[Launch | Sync] = field(default_factory=list)
    started_at: float = 0.0
    synced_at: list[float] = field(default_factory=list)  # when each Sync returned, in order
    finished_at: float | None = None
    blocked_on: Task | None = None

    def run(self, env: simpy.Environment, wake: Callable[[Task], None]) -> Generator[simpy.Event, object, None]:
        # The thread never blocks between two syncs, so each run of launches is issued in one go,
        # at the times it would reach each op: one simulation event per run instead of per op.
        # Only the sync times are kept: `spans` replays the launch times from them when asked.
        t = self.started_at = env.now
        for step in self.steps:
            if type(step) is Launch:  # the op is issued (by every host that must issue it: then waiters wake)
                op, host_s, first_s = step
                if t + first_s > op.available_at:
                    op.available_at = t + first_s
                if t + host_s > op.last_issue_at:
                    op.last_issue_at = t + host_s
                op.issuers -= 1
                if op.issuers == 0:
                    op._issued = True
                    if op.waiters:
                        wake(op)
                if host_s > 0:
                    t += host_s
                continue
            for op in step.ops:  # type: ignore[union-attr]  # a Sync: launches went on above. A sync returns once every op has ended (settled ops may end ahead of the clock)
                if op._done is not True:
                    self.blocked_on = op
                    yield op.wait_done()
                if op.end_s > t:
                    t = op.end_s
            self.blocked_on = None
            self.synced_at.append(t)
        self.finished_at = t

    def spans(self) -> list[tuple[Task, float, float]]:
        """(op, start, end) of each launch that kept the host busy, for timelines.

        Replayed from the steps and the sync times with run's arithmetic, so the times are run's
        own; made on demand because large runs are seldom drawn.
        """
        return [(step.op, t, t + step.host_s) for step, t in self._replay() if step.host_s > 0]

    def issued(self) -> dict[int, float]:
        """id(op) -> when this host let the device start it (its launch's start plus first_s)."""
        return {id(step.op): t + step.first_s for step, t in self._replay()}

    def _replay(self) -> Iterator[tuple[Launch, float]]:
        """Each launch with the time the host began it."""
        t, synced = self.started_at, iter(self.synced_at)
        for step in self.steps:
            if type(step) is Launch:
                yield step, t
                if step.host_s > 0:
                    t += step.host_s
                continue
            returned = next(synced, None)
            if returned is None:  # the run stopped in this sync (a deadlock)
                break
            t = returned


class Stream:
    """A CUDA stream (or a message channel): runs its ops one at a time, in order.

    An op whose inputs are all known is settled at once, ahead of the clock: its start and end
    follow from them (max-plus), with no simulation event. Only an op on a resource that ops of
    another stream use too waits for the clock (in a process of its own), so that ops take the
    resource in time order; a resource only one stream uses never makes it wait longer than the
    stream does.
    """

    def __init__(self, name: str):
        self.name = name
        self.ops: list[Task] = []
        self.next = 0  # the first op not settled
        self.free_at = 0.0  # when the last settled op ends

    @property
    def head(self) -> Task | None:
        """The first op not yet done (where a stuck stream is stuck)."""
        return next((op for op in self.ops if op._done is not True), None)

    def advance(self, machine: Machine) -> None:
        """Settle ops in order until one waits for something; register there to be woken.

        Only Machine's pump calls it, so the streams an op wakes are queued on it directly.
        """
        ops, k, free_at = self.ops, self.next, self.free_at
        woken = machine._woken
        while k < len(ops):
            op = ops[k]
            if op._done is True:  # a resource op whose process finished it
                free_at = op.end_s
                k += 1
                continue
            blocker = None if op._issued else op
            ready = op.available_at if op.available_at > free_at else free_at
            for dep in op.deps:
                if blocker is not None:
                    break
                if dep._done is not True:
                    blocker = dep
                elif dep.end_s > ready:
                    ready = dep.end_s
            if blocker is None and op.contended:
                if not op.held:  # first time here: hand it to the clock
                    op.held = True
                    machine.env.process(machine.hold(op, ready))
                blocker = op
            if blocker is not None:
                if blocker.waiters is None:
                    blocker.waiters = []
                blocker.waiters.append(self)
                break
            end = ready + op.gpu_s
            if op.last_issue_at + op.tail_s > end:
                end = op.last_issue_at + op.tail_s
            # machine.settle(op, ready, end), inlined: this runs once per op
            op.start_s = ready
            op.end_s = end
            event, op._done = op._done, True
            if event is not False:
                event.succeed()
            if op.waiters:
                woken.extend(op.waiters)
                op.waiters = None
            free_at = end
            k += 1
        self.next, self.free_at = k, free_at


class Machine:
    """Streams, shared resources and host threads in one SimPy environment."""

    def __init__(self) -> None:
        import simpy

        self.env = simpy.Environment()
        self.streams: dict[str, Stream] = {}
        self.resources: dict[str, simpy.Resource] = {}
        self.hosts: list[HostThread] = []
        self._woken: list[Stream] = []  # streams to advance (see _go_on)
        self._pumping = False

    def stream(self, name: str) -> Stream:
        if name not in self.streams:
            self.streams[name] = Stream(name)
        return self.streams[name]

    def resource(self, name: str) -> simpy.Resource:
        """A unit that serves one op at a time: a copy engine, a link."""
        if name not in self.resources:
            import simpy

            self.resources[name] = simpy.Resource(self.env, capacity=1)
        return self.resources[name]

    def op(self, stream: str, label: object, gpu_s: float, **kwargs: Any) -> Task:
        """A new op at the end of `stream`; str(label) names it."""
        op = Task(self.env, label, stream, gpu_s, **kwargs)
        self.stream(stream).ops.append(op)
        return op

    def host(self, name: str) -> HostThread:
        thread = HostThread(name)
        self.hosts.append(thread)
        return thread

    def settle(self, op: Task, start_s: float, end_s: float) -> None:
        """The op runs from start_s to end_s: wake the host syncing on it and the streams waiting."""
        op.start_s, op.end_s = start_s, end_s
        event, op._done = op._done, True
        if event is not False:
            event.succeed()  # type: ignore[union-attr]  # not True: settled once
        if op.waiters:
            self.wake(op)

    def wake(self, op: Task) -> None:
        """Let the streams stopped at `op` go on."""
        waiters, op.waiters = op.waiters, None  # cleared first: a stream may stop at `op` again
        self._go_on(waiters or [])

    def _go_on(self, streams: list[Stream]) -> None:
        """Advance streams one after the other, never one inside another's advance."""
        self._woken.extend(streams)
        if self._pumping:
            return
        self._pumping = True
        while self._woken:
            self._woken.pop().advance(self)
        self._pumping = False

    def hold(self, op: Task, ready_s: float) -> Generator[simpy.Event, object, None]:
        """An op on shared resources: at ready_s it queues for them, holds them while it runs."""
        env = self.env
        if ready_s > env.now:
            yield env.timeout(ready_s - env.now)
        requests = [r.request() for r in op.resources]
        for req in requests:
            yield req
        start = env.now
        end = max(start + op.gpu_s, op.last_issue_at + op.tail_s)
        yield env.timeout(end - start)
        for r, req in zip(op.resources, requests):
            r.release(req)
        self.settle(op, start, end)

    def run(self) -> float:
        """Simulate to the end; return when the last host finished, or raise on a deadlock."""
        env = self.env
        with gc_paused():
            self._mark_contended()
            for h in self.hosts:
                env.process(h.run(env, self.wake))
            self._go_on(list(self.streams.values())[::-1])
            streams = list(self.streams.values())
            total = sum(len(s.ops) for s in streams)
            watch_progress(lambda: (sum(s.next for s in streams), total))  # ops settled, for a progress line
            env.run()
        if any(h.finished_at is None for h in self.hosts) or any(
                s.ops and not s.ops[-1].is_done for s in self.streams.values()):
            raise ScheduleError("deadlock: " + self._stuck_report())
        return max((h.finished_at for h in self.hosts if h.finished_at is not None), default=0.0)

    def _mark_contended(self) -> None:
        """Mark the ops that must take their resources in clock order: those on a resource that
        ops of several streams use. On a resource of one stream, each op waits for the one
        before anyway (the stream runs them in order), so it settles like any other op."""
        users: dict[simpy.Resource, set[Stream]] = defaultdict(set)
        on_resources = []
        for s in self.streams.values():
            ops = [op for op in s.ops if op.resources]
            for op in ops:
                for r in op.resources:
                    users[r].add(s)
            on_resources += ops
        for op in on_resources:
            op.contended = any(len(users[r]) > 1 for r in op.resources)

    def _stuck_report(self) -> str:
        lines = []
        for s in self.streams.values():
            op = s.head
            if op is not None:
                if not op.is_issued:
                    why = "never issued by every host that must issue it"
                else:
                    pending = [d.name for d in op.deps if not d.is_done]
                    why = f"waiting for {', '.join(pending)}"
                lines.append(f"{s.name} stuck at {op.name} ({why})")
        for h in self.hosts:
            if h.blocked_on is not None:
                lines.append(f"{h.name} blocked in a sync on {h.blocked_on.name}")
        return "; ".join(lines[:6]) + ("; ..." if len(lines) > 6 else "")
