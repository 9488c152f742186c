"""A receive's kernel waiting on its GPU slows the compute beside it.

NCCL's send-receive holds its SMs from the moment its stream starts it until the data has moved; the compute
beside it runs at `profile.resident_comm.rate` of its speed meanwhile. That happens where a runtime posts a receive
ahead of a compute other than its consumer (torch's multi-stage classes). Slowdown and times depend on each other,
so the step is settled again and again, each compute lengthened by (1 - rate) times its overlap with its rank's
waiting receives, half-way towards what the last settlement implies, until they agree."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import islice
from typing import TYPE_CHECKING, TypeVar, cast

from parsim.schedules import COMPUTE_OPS, PAIRED_RECV, Action, Op, Schedule
from parsim.sim.dataflow import iter_wait_keys
from parsim.sim.lower import Chunk, OpTable, Rebuild, comm_waits, compute_track

if TYPE_CHECKING:  # the machine's types only: it is the caller's, made where a step is lowered
    from parsim.sim.machine import Machine, Task

RECEIVES = frozenset(recv for recv, _ in PAIRED_RECV.values())
CONSUMERS = {Op.RECV_F: (Op.FORWARD,), Op.RECV_B: (Op.BACKWARD, Op.BACKWARD_INPUT)}
TOLERANCE_S = 1e-8  # the lengthenings agree when none moves more than this
MAX_ROUNDS = 200  # settlements at most (the damped rounds of the 2-8 GPU torch grids agree within 70)

Slower = dict[Action, float]  # compute action -> seconds added to its GPU time


def stretch(rate: float, spin: float) -> float:
    """A compute's time against alone with a kernel waiting beside its first `spin` x that time, at `rate` meanwhile:
    done while the kernel waits, or after it left with the work it had left."""
    return 1 / rate if 1 / rate <= spin else spin + 1 - spin * rate


def rate_beside(ratio: float, spin: float) -> float:
    """Compute's speed beside a waiting kernel, read off a chunk that took `ratio` x its time alone with a kernel
    waiting beside it for the first `spin` x that time: 1 / ratio where the kernel outlasted the chunk, else the
    speed that leaves the time lost to make up after it left (ratio = spin + 1 - spin x rate); within (0, 1]."""
    rate = 1 / ratio if ratio <= spin else (1 + spin - ratio) / spin
    return min(1.0, max(rate, 1e-3))


def early_receives(schedule: Schedule) -> frozenset[Action]:
    """The receives each rank posts ahead of a compute other than the one that consumes them: none where the schedule
    is noted to post each right before its consumer (parsim.schedules.receives_at_use)."""
    if schedule.__dict__.get("receives_at_use"):
        return frozenset()
    early: set[Action] = set()
    for acts in schedule.actions:
        pending: list[Action] = []
        for a in acts:  # unpacked, not read by name: this sees every action
            kind, stage, mb = a
            if kind in RECEIVES:
                pending.append(a)
            elif pending and kind in COMPUTE_OPS:
                for r in pending:
                    if r[1] != stage or r[2] != mb or kind not in CONSUMERS[r[0]]:
                        early.add(r)
                pending = []
    return frozenset(early)


Span = tuple[object, float, float]  # a compute stream's op: its action (or its label), start, end
Observed = tuple[list[list[Span]], list[list[tuple[float, float]]]]  # per rank: compute spans, waiting windows
EarlyWaits = list[list[tuple[Action, tuple[tuple[str, int, int], ...]]]]  # per rank: early receive, its waits


def early_waits(schedule: Schedule, early: frozenset[Action], copy_streams: bool = False) -> EarlyWaits:
    """Per rank, in program order, each early receive with what it waits for on its rank (its stream and its
    runtime's waits, less its own message, whose send and receive are one op): worked out once per step, read
    every round."""
    more = comm_waits(schedule) or {}
    keys = iter_wait_keys(schedule, copy_streams)  # rank by rank, in program order
    out: EarlyWaits = []
    for acts in schedule.actions:
        mine = []
        for a, deps in islice(keys, len(acts)):
            if a in early:
                send, step = _SEND_OF[a.op]
                itself = {a, (send, a.stage - step, a.microbatch)}
                waits: list[tuple[str, int, int]] = [*deps, *more.get(a, ())]
                mine.append((a, tuple(d for d in waits if d not in itself)))
        out.append(mine)
    return out


def waiting(waits: EarlyWaits, posted: Sequence[Mapping[Action, float]],
            end: Callable[[tuple[str, int, int]], float]) -> list[list[tuple[float, float]]]:
    """Per rank, when each early receive's kernel waits on its GPU: from when its rank could start it (`posted`: per
    rank, when its host let the device start each early receive, and what it waits for on that rank has ended,
    `end` of each action) to the end of its message. Both engines' settlements are read through this."""
    out = []
    for rank, mine in enumerate(waits):
        spans = []
        for a, deps in mine:
            start = posted[rank][a]
            for d in deps:
                e = end(d)
                if e > start:
                    start = e
            message_end = end(a)
            if message_end > start:
                spans.append((start, message_end))
        out.append(_union(spans))
    return out


_SEND_OF = {recv: (send, step) for send, (recv, step) in PAIRED_RECV.items()}  # a receive's send op, stage offset


def machine_observed(schedule: Schedule, machine: Machine, table: OpTable, early: frozenset[Action],
                     waits: EarlyWaits) -> Observed:
    """What a settlement on the event-driven machine tells the sharing loop: each first-replica rank's compute
    stream (its ops' actions, starts and ends) and its early receives' waiting windows."""
    ops: dict[str, list[list[Task]]] = table  # type: ignore[assignment]  # every action has its op: no None
    posted = []
    for rank, acts in enumerate(schedule.actions):
        issued = machine.hosts[rank].issued()
        posted.append({a: issued[id(ops[a.op][a.stage][a.microbatch])] for a in acts if a in early})
    windows = waiting(waits, posted, lambda d: ops[d[0]][d[1]][d[2]].end_s)
    computes = [[(op.label.action if isinstance(op.label, (Chunk, Rebuild)) else op.label, op.start_s, op.end_s)
                 for op in machine.streams[compute_track(rank)].ops] for rank in range(schedule.num_ranks)]
    return computes, windows


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return merged


def lengthening(computes: list[list[Span]], windows: list[list[tuple[float, float]]], rate: float) -> Slower:
    """Each compute action's GPU time lost to the waiting receives beside it: (1 - rate) x its overlap with them
    (`computes`: per rank, its compute stream's spans in order; `windows`: per rank, disjoint and in time order)."""
    out: Slower = {}
    for spans, ops in zip(windows, computes):
        if not spans:
            continue
        first, last = 0, len(spans)  # the first window still open at the op's start: ops start in order
        for action, start, end in ops:
            while first < last and spans[first][1] <= start:
                first += 1
            if first == last:
                break
            overlap, k = 0.0, first
            while k < last and spans[k][0] < end:
                overlap += min(end, spans[k][1]) - max(start, spans[k][0])
                k += 1
            if overlap > 0:
                key = cast(Action, action)
                out[key] = out.get(key, 0.0) + (1.0 - rate) * overlap
    return out


T = TypeVar("T")


def settle_sharing(run: Callable[[Slower], tuple[T, Observed]], rate: float) -> tuple[T, Slower]:
    """The step with each compute slowed by the early receives (early_receives) waiting beside it: `run(slower)`
    settles it with those lengthenings (on either engine) and observes it; returns the last settlement and its
    lengthenings, once they imply themselves."""
    slower: Slower = {}
    for rounds in range(1, MAX_ROUNDS + 1):
        settled, (computes, windows) = run(slower)
        target = lengthening(computes, windows, rate)
        actions = target.keys() | slower.keys()
        if rounds == MAX_ROUNDS or all(abs(target.get(a, 0.0) - slower.get(a, 0.0)) <= TOLERANCE_S for a in actions):
            return settled, slower
        slower = {a: (slower.get(a, 0.0) + target.get(a, 0.0)) / 2 for a in actions}
    raise AssertionError("unreachable")
