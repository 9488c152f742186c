"""What each action of a schedule waits for: data, its stream, and the send it pairs with.

Both the validator and the simulator read dependencies from here, so a schedule that
validates is exactly one that the simulator (and `hw`) can run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import NamedTuple, TypeVar, cast

from parsim.schedules import ALL_OPS, COMPUTE_OPS, PAIRED_RECV, Action, Op, Schedule, act


class Transfer(NamedTuple):
    """A matched send and receive: one message over the link from `src` to `dst`."""

    send: Action
    recv: Action
    src: int
    dst: int

    def __str__(self) -> str:
        return f"{self.send}->{self.recv}"


def iter_waits(schedule: Schedule, copy_streams: bool) -> Iterator[tuple[Action, list[Action]]]:
    """Each action, in program order rank by rank, with what it waits for besides its own stream.

    Data: a forward needs the previous stage's forward (same rank) or its receive; a backward (B or
    the input-grad I) its own forward and the next stage's input-grad (same rank: I where the
    backward is split, else B) or its receive; W its I; a send the action that produced its data;
    a receive its send (through the channel, not listed). A send or receive issued on the compute
    stream (as NCCL does with the current stream) first waits for every compute op issued before
    it; on a dedicated copy stream a send waits only for its data, and a receive for nothing.
    """
    new = tuple.__new__
    for action, deps in iter_wait_keys(schedule, copy_streams):
        yield action, [new(Action, d) for d in deps]


Key = tuple[str, int, int]  # (op, stage, microbatch): equal to, and hashing as, that Action
GRAD = "grad"  # in stage_waits: what makes a stage's input gradient, I where its backward is split, else B


def stage_waits(schedule: Schedule) -> dict[str, list[tuple[tuple[str, int], ...]]]:
    """op -> per stage: the (op, stage) pairs an action of that op and stage waits for, each at the action's
    own micro-batch (GRAD: whichever of I and B makes that stage's input gradient); iter_waits's data rules,
    as a table that the longest-path settling reads without building a list per action."""
    owner, last = schedule.stage_to_rank, schedule.num_stages - 1
    F, B, I, W = Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT
    table: dict[str, list[tuple[tuple[str, int], ...]]] = {op: [] for op in ALL_OPS}
    for s in range(last + 1):
        table[F].append(() if s == 0 else ((F, s - 1),) if owner[s - 1] == owner[s] else ((Op.RECV_F, s),))
        grad = () if s == last else ((GRAD, s + 1),) if owner[s + 1] == owner[s] else ((Op.RECV_B, s),)
        table[B].append(((F, s),) + grad)
        table[I].append(((F, s),) + grad)
        table[W].append(((I, s),))
        table[Op.SEND_F].append(((F, s),))
        table[Op.SEND_B].append(((GRAD, s),))
        table[Op.RECV_F].append(())  # receives wait for their send, through the channel
        table[Op.RECV_B].append(())
    return table


def iter_wait_keys(schedule: Schedule, copy_streams: bool) -> Iterator[tuple[Action, list[Key]]]:
    """iter_waits with each dependency as a plain (op, stage, microbatch) tuple.

    The rules live here, once (stage_waits, and the compute-stream rule below); plain tuples are made
    several times faster than Actions, which matters to the simulator, which reads them once per action.
    """
    split = {a for acts in schedule.actions for a in acts if a.op == Op.BACKWARD_INPUT}
    rules = stage_waits(schedule)
    B, I = Op.BACKWARD, Op.BACKWARD_INPUT
    for acts in schedule.actions:
        last_compute: Action | None = None
        for action in acts:
            op, s, i = action
            deps = [((I if (I, s2, i) in split else B) if k == GRAD else k, s2, i) for k, s2 in rules[op][s]]
            if op in COMPUTE_OPS:
                last_compute = action
            elif not copy_streams and last_compute is not None and last_compute not in deps:
                deps.append(last_compute)  # a send or receive on the compute stream: after what was issued before
            yield action, deps


def issue_waits(schedule: Schedule, copy_streams: bool) -> dict[Action, list[Action]]:
    """iter_waits as a dict."""
    return dict(iter_waits(schedule, copy_streams))


def transfers(schedule: Schedule) -> dict[tuple[int, int], list[Transfer]]:
    """The messages on each directed channel (src, dst), in the sender's program order.

    Kept on the (immutable) schedule: the validator and the simulator both ask for them.
    """
    return kept(schedule, "_transfers", _transfers)


T = TypeVar("T")


def kept(schedule: Schedule, name: str, make: Callable[[Schedule], T]) -> T:
    """make(schedule), worked out once and kept on the (immutable) schedule under `name`: what every settlement of
    a step reads the same (the sharing loop settles one step tens of times). Callers must not change it."""
    known = schedule.__dict__.get(name)
    if known is None:
        known = make(schedule)
        object.__setattr__(schedule, name, known)
    return cast(T, known)


def _transfers(schedule: Schedule) -> dict[tuple[int, int], list[Transfer]]:
    channels: dict[tuple[int, int], list[Transfer]] = defaultdict(list)
    new = tuple.__new__  # Transfer(...) without the Python-level constructor: there may be 100k of them
    stage_to_rank = schedule.stage_to_rank
    for rank, acts in enumerate(schedule.actions):
        for action in acts:
            paired = PAIRED_RECV.get(action.op)  # inlined paired_recv: this loop sees every action
            if paired:
                op, step = paired
                recv = act(op, action.stage + step, action.microbatch)
                dst = stage_to_rank[recv.stage]
                channels[rank, dst].append(new(Transfer, (action, recv, rank, dst)))
    return dict(channels)
