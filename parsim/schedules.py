"""Pipeline schedules as data: per-rank ordered lists of actions.

The same lists are simulated by `parsim.simulate` and executed by `hw.executor`, so the
predicted and the measured step run one program.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
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


_new_tuple = tuple.__new__


@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule: which rank hosts each stage and the ordered actions of every rank."""

    name: str
    num_stages: int
    num_microbatches: int
    stage_to_rank: tuple[int, ...]
    actions: tuple[tuple[Action, ...], ...]  # actions[rank]

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


def _check_sizes(num_ranks: int, num_microbatches: int, virtual_stages: int = 1) -> None:
    if num_ranks < 1:
        raise ScheduleError(f"need at least one GPU/stage, got {num_ranks}")
    if num_microbatches < 1:
        raise ScheduleError(f"need at least one micro-batch, got {num_microbatches}")
    if virtual_stages < 1:
        raise ScheduleError(f"need at least one virtual stage per GPU, got {virtual_stages}")


def forward_with_messages(stage: int, mb: int, stage_to_rank: tuple[int, ...]) -> list[Action]:
    """Receive the input (if it comes from another rank), run the forward, send the output."""
    rank, last = stage_to_rank[stage], len(stage_to_rank) - 1
    acts = [Action(Op.RECV_F, stage, mb)] if stage > 0 and stage_to_rank[stage - 1] != rank else []
    acts.append(Action(Op.FORWARD, stage, mb))
    if stage < last and stage_to_rank[stage + 1] != rank:
        acts.append(Action(Op.SEND_F, stage, mb))
    return acts


def backward_with_messages(stage: int, mb: int, stage_to_rank: tuple[int, ...],
                           op: str = Op.BACKWARD) -> list[Action]:
    """Receive the output's gradient (if from another rank), run the backward (B, or only its
    input-grad I), send the input's gradient."""
    rank, last = stage_to_rank[stage], len(stage_to_rank) - 1
    acts = [Action(Op.RECV_B, stage, mb)] if stage < last and stage_to_rank[stage + 1] != rank else []
    acts.append(Action(op, stage, mb))
    if stage > 0 and stage_to_rank[stage - 1] != rank:
        acts.append(Action(Op.SEND_B, stage, mb))
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


def gpipe(num_ranks: int, num_microbatches: int) -> Schedule:
    """GPipe (fill-drain): all forwards, then all backwards; stage s on rank s.

    Clock diagram for 3 stages and 4 micro-batches (F = forward, B = backward):
        rank 0: F0 F1 F2 F3 .  .  .  .  .  B0 B1 B2 B3
        rank 1: .  F0 F1 F2 F3 .  .  .  B0 B1 B2 B3 .
        rank 2: .  .  F0 F1 F2 F3 B0 B1 B2 B3 .  .  .
    """
    _check_sizes(num_ranks, num_microbatches)
    p, m, owner = num_ranks, num_microbatches, tuple(range(num_ranks))
    ranks = []
    for s in range(p):
        acts = [a for i in range(m) for a in forward_with_messages(s, i, owner)]
        acts += [a for i in range(m) for a in backward_with_messages(s, i, owner)]
        ranks.append(tuple(acts))
    return Schedule("gpipe", p, m, owner, tuple(ranks))


def one_f_one_b(num_ranks: int, num_microbatches: int) -> Schedule:
    """1F1B (PipeDream-Flush): p-s-1 warm-up forwards, then alternate one forward, one backward.

    Stage s holds at most min(p-s, m) micro-batches of activations, against m for GPipe, for
    the same bubble.
        rank 0: F0 F1 F2 .  .  B0 F3 B1 .  B2 .  B3
        rank 1: .  F0 F1 .  B0 F2 B1 F3 B2 .  B3 .
        rank 2: .  .  F0 B0 F1 B1 F2 B2 F3 B3 .  .
    """
    _check_sizes(num_ranks, num_microbatches)
    p, m, owner = num_ranks, num_microbatches, tuple(range(num_ranks))
    ranks = []
    for s in range(p):
        warmup = min(p - s - 1, m)
        acts = [a for i in range(warmup) for a in forward_with_messages(s, i, owner)]
        for i in range(m - warmup):
            acts += forward_with_messages(s, warmup + i, owner)
            acts += backward_with_messages(s, i, owner)
        acts += [a for i in range(m - warmup, m) for a in backward_with_messages(s, i, owner)]
        ranks.append(tuple(acts))
    return Schedule("1f1b", p, m, owner, tuple(ranks))


def interleaved_1f1b(num_ranks: int, num_microbatches: int, virtual_stages: int = 2) -> Schedule:
    """Interleaved 1F1B (Megatron-LM): v stages per GPU, stage s on rank s mod p.

    Micro-batches go in groups of p: a rank runs a group's forwards through its chunks in
    order, its backwards through its chunks in reverse. Warm-up is (p-r-1)*2 + (v-1)*p
    forwards on rank r, then one forward, one backward. The bubble shrinks v-fold, for v
    times as many messages. Needs m to be a multiple of p.
    """
    _check_sizes(num_ranks, num_microbatches, virtual_stages)
    p, m, v = num_ranks, num_microbatches, virtual_stages
    if m % p:
        raise ScheduleError(f"interleaved 1F1B needs the micro-batch count ({m}) to be a multiple "
                            f"of the GPU count ({p})")
    owner = tuple(s % p for s in range(p * v))
    ranks = []
    for r in range(p):
        forwards = [(c * p + r, g * p + k) for g in range(m // p) for c in range(v) for k in range(p)]
        backwards = [(c * p + r, g * p + k) for g in range(m // p) for c in reversed(range(v)) for k in range(p)]
        warmup = min((p - r - 1) * 2 + (v - 1) * p, m * v)
        acts = [a for st, i in forwards[:warmup] for a in forward_with_messages(st, i, owner)]
        for (fs, fi), (bs, bi) in zip(forwards[warmup:], backwards):
            acts += forward_with_messages(fs, fi, owner) + backward_with_messages(bs, bi, owner)
        acts += [a for st, i in backwards[m * v - warmup:] for a in backward_with_messages(st, i, owner)]
        ranks.append(tuple(acts))
    return Schedule("interleaved-1f1b", p * v, m, owner, tuple(ranks))


def zb_h1(num_ranks: int, num_microbatches: int) -> Schedule:
    """Zero-bubble ZB-H1 (Qi et al., 2023): 1F1B with the backward split into input-grad I and weight-grad W.

    Gradients flow back through I alone; rank r lets up to r weight-grads wait, so they fill
    what would be 1F1B's bubbles, and runs the rest at the end. With free communication the
    step is m(T_F+T_I+T_W) + (p-1)(T_F+T_I-T_W) for T_W <= T_I: a third of 1F1B's bubble
    when the three are equal, with p micro-batches in flight per stage (1F1B's worst stage).
    """
    _check_sizes(num_ranks, num_microbatches)
    p, m, owner = num_ranks, num_microbatches, tuple(range(num_ranks))
    ranks = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        acts = [a for i in range(warmup) for a in forward_with_messages(r, i, owner)]
        waiting: list[int] = []  # micro-batches whose weight-grad is still to run

        def input_grad(i: int, allowed_waiting: int) -> list[Action]:
            out = backward_with_messages(r, i, owner, Op.BACKWARD_INPUT)
            waiting.append(i)
            while len(waiting) > allowed_waiting:
                out.append(Action(Op.BACKWARD_WEIGHT, r, waiting.pop(0)))
            return out

        for i in range(m - warmup):
            acts += forward_with_messages(r, warmup + i, owner) + input_grad(i, r)
        for i in range(m - warmup, m):
            acts += input_grad(i, len(waiting))  # cool-down: one W after each I fills its wait
        acts += [Action(Op.BACKWARD_WEIGHT, r, i) for i in waiting]
        ranks.append(tuple(acts))
    return Schedule("zb-h1", p, m, owner, tuple(ranks))


SCHEDULES: dict[str, Callable[..., Schedule]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved-1f1b": interleaved_1f1b,
    "zb-h1": zb_h1,
}
VIRTUAL = {"interleaved-1f1b"}  # schedules that take virtual_stages


TORCH_PREFIX = "torch:"  # `torch:CLASS` names a torch.distributed.pipelining schedule


def _imported(name: str) -> bool:
    """Whether `name` asks for a schedule from torch: `torch:CLASS` or a torch schedule CSV file."""
    return name.startswith(TORCH_PREFIX) or name.lower().endswith(".csv")


def schedule_name(text: str) -> str:
    """argparse type for --schedule: a registered name, `torch:CLASS` or a torch schedule CSV file."""
    if text.lower() in SCHEDULES or _imported(text):
        return text
    raise argparse.ArgumentTypeError(f"unknown schedule {text!r}; choose one of {', '.join(sorted(SCHEDULES))}, "
                                     "torch:CLASS (a torch.distributed.pipelining schedule) or a schedule .csv")


def build(name: str, num_ranks: int, num_microbatches: int, virtual_stages: int | None = None) -> Schedule:
    """The schedule registered as `name`, or imported: `torch:CLASS` or a torch schedule CSV file.

    Generators are checked by the tests; simulate validates whatever it is given.
    """
    if _imported(name):
        from parsim import torch_schedules

        if name.startswith(TORCH_PREFIX):
            return torch_schedules.from_torch(name.removeprefix(TORCH_PREFIX), num_ranks, num_microbatches,
                                              virtual_stages)
        return torch_schedules.load_csv(name)
    key = name.lower()
    if key not in SCHEDULES:
        known = ", ".join(sorted(SCHEDULES))
        raise ScheduleError(f"unknown schedule {name!r}; choose one of: {known}")
    if key in VIRTUAL:
        return SCHEDULES[key](num_ranks, num_microbatches, virtual_stages or 2)
    if virtual_stages not in (None, 1):
        raise ScheduleError(f"{key} runs one stage per GPU; --virtual-stages applies to "
                            f"{', '.join(sorted(VIRTUAL))}")
    return SCHEDULES[key](num_ranks, num_microbatches)
