"""What each action of a schedule waits for: data, its stream, and the send it pairs with.

Both the validator and the simulator read dependencies from here, so a schedule that
validates is exactly one that the simulator (and `hw`) can run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import NamedTuple

from parsim.schedules import COMPUTE_OPS, Action, Op, Schedule, act

_PAIRED_RECV = {Op.SEND_F: (Op.RECV_F, 1), Op.SEND_B: (Op.RECV_B, -1)}


class Transfer(NamedTuple):
    """A matched send and receive: one message over the link from `src` to `dst`."""

    send: Action
    recv: Action
    src: int
    dst: int

    def __str__(self) -> str:
        return f"{self.send}->{self.recv}"


def recv_for(send: Action) -> Action:
    """The receive that consumes `send` (stage s sends forward to s+1, backward to s-1)."""
    op, step = _PAIRED_RECV[send.op]
    return act(op, send.stage + step, send.microbatch)


def _backward_of(split: set[Action], stage: int, mb: int) -> Action:
    """The action that produces stage `stage`'s input-grad: a split-off I if there is one, else B."""
    input_grad = act(Op.BACKWARD_INPUT, stage, mb)
    return input_grad if input_grad in split else act(Op.BACKWARD, stage, mb)


def data_inputs(schedule: Schedule, action: Action, split: set[Action]) -> list[Action]:
    """Actions whose results `action` consumes (on its own rank or as the receive it needs)."""
    s, i = action.stage, action.microbatch
    last = schedule.num_stages - 1
    if action.op == Op.FORWARD:
        if s == 0:
            return []
        local = schedule.stage_to_rank[s - 1] == schedule.stage_to_rank[s]
        return [act(Op.FORWARD, s - 1, i) if local else act(Op.RECV_F, s, i)]
    if action.op == Op.BACKWARD or action.op == Op.BACKWARD_INPUT:
        if s == last:
            return [act(Op.FORWARD, s, i)]
        local = schedule.stage_to_rank[s + 1] == schedule.stage_to_rank[s]
        return [act(Op.FORWARD, s, i), _backward_of(split, s + 1, i) if local else act(Op.RECV_B, s, i)]
    if action.op == Op.BACKWARD_WEIGHT:
        return [act(Op.BACKWARD_INPUT, s, i)]
    if action.op == Op.SEND_F:
        return [act(Op.FORWARD, s, i)]
    if action.op == Op.SEND_B:
        return [_backward_of(split, s, i)]
    return []  # receives wait for their send, through the channel


def iter_waits(schedule: Schedule, copy_streams: bool) -> Iterator[tuple[Action, list[Action]]]:
    """Each action with its dependencies other than its own stream's order.

    A send or receive issued on the compute stream (as NCCL does with the current stream)
    first waits for every compute op issued before it; on a dedicated copy stream a send
    waits only for the op that produced its data, and a receive for nothing.
    """
    split = {a for acts in schedule.actions for a in acts if a.op == Op.BACKWARD_INPUT}
    for acts in schedule.actions:
        last_compute: Action | None = None
        for action in acts:
            deps = data_inputs(schedule, action, split)
            if action.op in COMPUTE_OPS:
                last_compute = action
            elif not copy_streams and last_compute is not None and last_compute not in deps:
                deps.append(last_compute)
            yield action, deps



def issue_waits(schedule: Schedule, copy_streams: bool) -> dict[Action, list[Action]]:
    """iter_waits as a dict."""
    return dict(iter_waits(schedule, copy_streams))


def transfers(schedule: Schedule) -> dict[tuple[int, int], list[Transfer]]:
    """The messages on each directed channel (src, dst), in the sender's program order.

    Kept on the (immutable) schedule: the validator and the simulator both ask for them.
    """
    known = schedule.__dict__.get("_transfers")
    if known is None:
        known = _transfers(schedule)
        object.__setattr__(schedule, "_transfers", known)
    return known


def _transfers(schedule: Schedule) -> dict[tuple[int, int], list[Transfer]]:
    channels: dict[tuple[int, int], list[Transfer]] = defaultdict(list)
    new = tuple.__new__  # Transfer(...) without the Python-level constructor: there may be 100k of them
    stage_to_rank = schedule.stage_to_rank
    for rank, acts in enumerate(schedule.actions):
        for action in acts:
            paired = _PAIRED_RECV.get(action.op)
            if paired:
                op, step = paired
                recv = act(op, action.stage + step, action.microbatch)
                dst = stage_to_rank[recv.stage]
                channels[rank, dst].append(new(Transfer, (action, recv, rank, dst)))
    return dict(channels)
