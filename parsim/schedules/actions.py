"""What a schedule is made of: actions (F, B, I, W, sends and receives) in per-rank lists.

The same lists are simulated by parsim.sim and executed by hw, so the predicted and the measured
step run one program.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from parsim.errors import ScheduleError


class Op:
    """What an action does: plain strings, so actions hash fast and read as torch's do.

    Sends and receives carry activations (F) or their gradients (B).
    """

    FORWARD = "F"
    BACKWARD = "B"  # input-grad and weight-grad together
    BACKWARD_INPUT = "I"  # input-grad only (zero-bubble schedules)
    BACKWARD_WEIGHT = "W"  # weight-grad only
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"


COMPUTE_OPS = frozenset({Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT})
COMM_OPS = frozenset({Op.SEND_F, Op.RECV_F, Op.SEND_B, Op.RECV_B})
ALL_OPS = COMPUTE_OPS | COMM_OPS


NEIGHBOUR = {Op.SEND_F: 1, Op.RECV_F: -1, Op.SEND_B: -1, Op.RECV_B: 1}  # peer stage offset
PAIRED_RECV = {Op.SEND_F: (Op.RECV_F, 1), Op.SEND_B: (Op.RECV_B, -1)}  # send -> its receive's op, stage offset
TORCH_PREFIX = "torch:"  # `torch:CLASS` names a torch.distributed.pipelining schedule (parsim.schedules.from_torch)


class Action(NamedTuple):
    """One step of one rank's program: `op` on `stage` for `microbatch`."""

    op: str
    stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.op}(s{self.stage},m{self.microbatch})"

    @property
    def is_compute(self) -> bool:
        return self.op in COMPUTE_OPS


def act(op: str, stage: int, microbatch: int) -> Action:
    """Action(op, stage, microbatch) built in C: hot loops make hundreds of thousands of them."""
    return _new_tuple(Action, (op, stage, microbatch))


def paired_recv(send: Action) -> Action:
    """The receive that consumes `send`: stage s sends forward to s+1's RECV_F, backward to s-1's RECV_B."""
    op, step = PAIRED_RECV[send.op]
    return act(op, send.stage + step, send.microbatch)


_new_tuple = tuple.__new__


@dataclass(frozen=True)
class CommPlan:
    """How a runtime posts and awaits a schedule's messages, beyond the order of its lists.

    Without one (hw's runner), each send and receive is posted alone on its directed channel's own
    stream, and a compute waits only for the message it consumes. With one, `batches` lists each
    rank's sends and receives as posted together (one batch_isend_irecv), in posting order: a rank's
    batches share one communication stream, so each starts once the one before has completed (NCCL
    runs a stream's kernels in order), while the messages of one batch run together. `waits` names,
    per compute action, messages its stream waits for besides the one it consumes (`work.wait()`).
    """

    batches: tuple[tuple[tuple[Action, ...], ...], ...]  # batches[rank]: its posts, in order
    waits: Mapping[Action, tuple[Action, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule: which rank hosts each stage and the ordered actions of every rank.

    `comm` is how its runtime posts and awaits the messages (see CommPlan); None for hw's runner.
    """

    name: str
    num_stages: int
    num_microbatches: int
    stage_to_rank: tuple[int, ...]
    actions: tuple[tuple[Action, ...], ...]  # actions[rank]
    comm: CommPlan | None = None

    @property
    def num_ranks(self) -> int:
        return len(self.actions)

    def peer(self, action: Action) -> int:
        """The rank on the other end of a send or receive."""
        return self.stage_to_rank[action.stage + NEIGHBOUR[action.op]]

    def to_text(self) -> str:
        """One line per rank, e.g. 'rank 0: F(s0,m0) SEND_F(s0,m0) ...'."""
        return "\n".join(
            f"rank {r}: " + " ".join(map(str, acts)) for r, acts in enumerate(self.actions)
        )


def check_layout(schedule: Schedule) -> None:
    """Its sizes, and each stage on a rank that exists: what a walk over its actions (or validate) relies on."""
    s, m, p = schedule.num_stages, schedule.num_microbatches, schedule.num_ranks
    if s < 1 or m < 1 or p < 1:
        raise ScheduleError(f"{schedule.name}: needs >= 1 stage, micro-batch and rank")
    if len(schedule.stage_to_rank) != s:
        raise ScheduleError(f"{schedule.name}: stage_to_rank has {len(schedule.stage_to_rank)} "
                            f"entries for {s} stages")
    if any(not 0 <= r < p for r in schedule.stage_to_rank):
        raise ScheduleError(f"{schedule.name}: stage_to_rank names a rank outside 0..{p - 1}")


def receives_at_use(schedule: Schedule) -> Schedule:
    """`schedule`, noted as posting each receive right before the compute that consumes it (as with_messages places
    them), which parsim.sim.sharing then need not read off every action. The note is on this object only:
    dataclasses.replace makes a schedule without it."""
    object.__setattr__(schedule, "receives_at_use", True)
    return schedule


def valid_as_built(schedule: Schedule, peaks: tuple[int, ...]) -> Schedule:
    """`schedule` of one stage per rank, noted as valid by construction (check.validate passes it, channel order
    included) with each send right after the compute it sends, as with_messages places them, and per rank the most
    micro-batches its stage holds at once (`peaks`): the longest-path walk then need not vouch for it, nor memory
    read its program (parsim.sim.longest_path, parsim.sim.lower). On this object only: dataclasses.replace makes
    a schedule without it."""
    object.__setattr__(schedule, "valid_as_built", True)
    object.__setattr__(schedule, "peaks_as_built", peaks)
    return schedule


def forward_with_messages(stage: int, mb: int, stage_to_rank: tuple[int, ...]) -> list[Action]:
    """Receive the input (if it comes from another rank), run the forward, send the output."""
    rank, new = stage_to_rank[stage], _new_tuple  # actions built in C: generators make 400k of them
    acts = [new(Action, (Op.RECV_F, stage, mb))] if stage > 0 and stage_to_rank[stage - 1] != rank else []
    acts.append(new(Action, (Op.FORWARD, stage, mb)))
    if stage < len(stage_to_rank) - 1 and stage_to_rank[stage + 1] != rank:
        acts.append(new(Action, (Op.SEND_F, stage, mb)))
    return acts


def backward_with_messages(stage: int, mb: int, stage_to_rank: tuple[int, ...],
                           op: str = Op.BACKWARD) -> list[Action]:
    """Receive the output's gradient (if from another rank), run the backward (B, or only its
    input-grad I), send the input's gradient."""
    rank, new = stage_to_rank[stage], _new_tuple
    last = len(stage_to_rank) - 1
    acts = [new(Action, (Op.RECV_B, stage, mb))] if stage < last and stage_to_rank[stage + 1] != rank else []
    acts.append(new(Action, (op, stage, mb)))
    if stage > 0 and stage_to_rank[stage - 1] != rank:
        acts.append(new(Action, (Op.SEND_B, stage, mb)))
    return acts


def with_messages(compute: Iterable[Action], stage_to_rank: tuple[int, ...]) -> list[Action]:
    """A rank's compute actions in order, each with the sends and receives it needs, placed as above."""
    out: list[Action] = []
    for a in compute:
        if a.op == Op.FORWARD:
            out += forward_with_messages(a.stage, a.microbatch, stage_to_rank)
        elif a.op in (Op.BACKWARD, Op.BACKWARD_INPUT):
            out += backward_with_messages(a.stage, a.microbatch, stage_to_rank, a.op)
        else:
            out.append(a)
    return out


def place_messages(compute: list[list[Action]], stage_to_rank: tuple[int, ...]) -> tuple[tuple[Action, ...], ...]:
    """Every rank's compute order with its messages: as with_messages places them, but a receive moves
    earlier where a message sent before it on the same channel is consumed later, so that each rank
    receives a channel's messages in the order they are sent (NCCL matches them in order).

    Needed where a channel carries two streams of messages, as between the two arms of a V.
    """
    actions = [with_messages(acts, stage_to_rank) for acts in compute]
    sent: dict[tuple[int, int], list[Action]] = {}  # (src, dst) -> the receives, in send order
    for rank, acts in enumerate(actions):
        for a in acts:
            if a.op in PAIRED_RECV:
                recv = paired_recv(a)
                sent.setdefault((rank, stage_to_rank[recv.stage]), []).append(recv)
    return tuple(_receive_in_send_order(acts, rank, sent, stage_to_rank) for rank, acts in enumerate(actions))


def _receive_in_send_order(acts: list[Action], rank: int, sent: dict[tuple[int, int], list[Action]],
                           stage_to_rank: tuple[int, ...]) -> tuple[Action, ...]:
    """A rank's actions where each receive first brings forward the receives sent before it on its channel.

    A receive that nothing sends stays where it is, for the validator to name.
    """
    channel = {recv: (src, k) for (src, dst), recvs in sent.items() if dst == rank for k, recv in enumerate(recvs)}
    taken = {src: 0 for src, dst in sent if dst == rank}  # per channel into this rank: receives placed so far
    out: list[Action] = []
    for a in acts:
        if a not in channel:
            out.append(a)  # compute, a send, or a receive that nothing sends
            continue
        src, k = channel[a]
        if k >= taken[src]:  # not brought forward already
            out += sent[src, rank][taken[src]:k + 1]
            taken[src] = k + 1
    return tuple(out)
