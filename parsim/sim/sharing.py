"""A receive's kernel waiting on its GPU slows the compute beside it.

NCCL's send-receive holds its SMs from the moment its stream starts it until the data has moved; the compute
beside it runs at `profile.resident_comm.rate` of its speed meanwhile. That happens where a runtime posts a receive
ahead of a compute other than its consumer (torch's multi-stage classes). Slowdown and times depend on each other,
so the step is settled again and again, each compute lengthened by (1 - rate) times its overlap with its rank's
waiting receives, half-way towards what the last settlement implies, until they agree."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from itertools import islice
from typing import cast

from parsim.schedules import COMPUTE_OPS, PAIRED_RECV, Action, Op, Schedule
from parsim.sim.dataflow import iter_wait_keys
from parsim.sim.lower import Chunk, OpTable, compute_track, runtime_waits
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
    """The receives each rank posts ahead of a compute other than the one that consumes them."""
    early: set[Action] = set()
    for acts in schedule.actions:
        pending: list[Action] = []
        for a in acts:
            if a.op in RECEIVES:
                pending.append(a)
            elif a.op in COMPUTE_OPS:
                early.update(r for r in pending if not (a.op in CONSUMERS[r.op] and a[1:] == r[1:]))
                pending = []
    return frozenset(early)


def waiting(schedule: Schedule, machine: Machine, table: OpTable, early: frozenset[Action],
            copy_streams: bool = False) -> list[list[tuple[float, float]]]:
    """Per rank, when each early receive's kernel waits on its GPU: from when its rank could start it (its host
    posted it, and what it waits for on that rank has ended) to the end of its message."""
    more = runtime_waits(schedule.comm) if schedule.comm is not None else {}
    ops: dict[str, list[list[Task]]] = table  # type: ignore[assignment]  # every action has its op: no None
    keys = iter_wait_keys(schedule, copy_streams)  # rank by rank, in program order
    out = []
    for rank, acts in enumerate(schedule.actions):
        posted = machine.hosts[rank].issued()
        spans = []
        for a, deps in islice(keys, len(acts)):
            if a not in early:
                continue
            op = ops[a.op][a.stage][a.microbatch]
            start = posted[id(op)]
            for d in (*deps, *more.get(a, ())):
                dep = ops[d[0]][d[1]][d[2]]
                if dep is not op and dep.end_s > start:
                    start = dep.end_s
            if op.end_s > start:
                spans.append((start, op.end_s))
        out.append(_union(spans))
    return out


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return merged


def lengthening(schedule: Schedule, machine: Machine, windows: list[list[tuple[float, float]]],
                rate: float) -> Slower:
    """Each compute action's GPU time lost to the waiting receives beside it: (1 - rate) x its overlap with them
    (`windows`: per rank, disjoint and in time order)."""
    out: Slower = {}
    for rank, spans in enumerate(windows):
        if not spans:
            continue
        ends = [b for _, b in spans]
        for op in machine.streams[compute_track(rank)].ops:
            overlap, k = 0.0, bisect_right(ends, op.start_s)  # the first window still open at the op's start
            while k < len(spans) and spans[k][0] < op.end_s:
                overlap += min(op.end_s, spans[k][1]) - max(op.start_s, spans[k][0])
                k += 1
            if overlap > 0:
                action = cast(Action, op.label.action if isinstance(op.label, Chunk) else op.label)
                out[action] = out.get(action, 0.0) + (1.0 - rate) * overlap
    return out


def settle_sharing(run: Callable[[Slower], tuple[Machine, OpTable]], schedule: Schedule, early: frozenset[Action],
                   rate: float, copy_streams: bool = False) -> tuple[Machine, Slower]:
    """The step with each compute slowed by the `early` receives (early_receives) waiting beside it: `run(slower)`
    settles it with those lengthenings; returns the last settlement and its lengthenings, once they imply
    themselves."""
    slower: Slower = {}
    for rounds in range(1, MAX_ROUNDS + 1):
        machine, table = run(slower)
        target = lengthening(schedule, machine, waiting(schedule, machine, table, early, copy_streams), rate)
        actions = target.keys() | slower.keys()
        if rounds == MAX_ROUNDS or all(abs(target.get(a, 0.0) - slower.get(a, 0.0)) <= TOLERANCE_S for a in actions):
            return machine, slower
        slower = {a: (slower.get(a, 0.0) + target.get(a, 0.0)) / 2 for a in actions}
    raise AssertionError("unreachable")
