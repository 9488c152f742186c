"""The schedule generators: pure functions from (GPUs, micro-batches) to per-rank action lists."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import repeat, starmap

from parsim.errors import ScheduleError
from parsim.schedules.actions import (
    Action,
    Op,
    Schedule,
    act,
    backward_with_messages,
    forward_with_messages,
    place_messages,
    receives_at_use,
    valid_as_built,
    with_messages,
)


def _check_sizes(num_ranks: int, num_microbatches: int, virtual_stages: int = 1) -> None:
    if num_ranks < 1:
        raise ScheduleError(f"need at least one GPU/stage, got {num_ranks}")
    if num_microbatches < 1:
        raise ScheduleError(f"need at least one micro-batch, got {num_microbatches}")
    if virtual_stages < 1:
        raise ScheduleError(f"need at least one virtual stage per GPU, got {virtual_stages}")



def gpipe(num_ranks: int, num_microbatches: int) -> Schedule:
    """GPipe (fill-drain): all forwards, then all backwards; stage s on rank s.

    Clock diagram for 3 stages and 4 micro-batches (F = forward, B = backward):
        rank 0: F0 F1 F2 F3 .  .  .  .  .  B0 B1 B2 B3
        rank 1: .  F0 F1 F2 F3 .  .  .  B0 B1 B2 B3 .
        rank 2: .  .  F0 F1 F2 F3 B0 B1 B2 B3 .  .  .
    """
    _check_sizes(num_ranks, num_microbatches)
    p, m, owner = num_ranks, num_microbatches, tuple(range(num_ranks))
    ranks, mbs = [], tuple(range(m))
    for s in range(p):
        forward, backward = _columns(s, mbs, owner)
        ranks.append((*_rows(forward), *_rows(backward)))
    return valid_as_built(receives_at_use(Schedule("gpipe", p, m, owner, tuple(ranks))), (m,) * p)


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
    ranks, mbs = [], tuple(range(m))
    for s in range(p):
        w = min(p - s - 1, m)  # warm-up forwards
        forward, backward = _columns(s, mbs, owner)
        steady = [c[w:] for c in forward] + [c[:m - w] for c in backward]
        ranks.append((*_rows([c[:w] for c in forward]), *_rows(steady), *_rows([c[m - w:] for c in backward])))
    peaks = tuple(min(p - s, m) for s in range(p))  # w warm-up forwards, then one more before each backward
    return valid_as_built(receives_at_use(Schedule("1f1b", p, m, owner, tuple(ranks))), peaks)


def _columns(stage: int, mbs: tuple[int, ...], owner: tuple[int, ...],
             ) -> tuple[list[list[Action]], list[list[Action]]]:
    """A stage's forwards and backwards with their messages as forward_with_messages and backward_with_messages
    place them, by column: (receive,) compute, (send), each over the micro-batches `mbs` (0..m-1), built in C."""
    last, rank = len(owner) - 1, owner[stage]
    forward = [[Op.RECV_F]] if stage > 0 and owner[stage - 1] != rank else []
    forward += [[Op.FORWARD]] + ([[Op.SEND_F]] if stage < last and owner[stage + 1] != rank else [])
    backward = [[Op.RECV_B]] if stage < last and owner[stage + 1] != rank else []
    backward += [[Op.BACKWARD]] + ([[Op.SEND_B]] if stage > 0 and owner[stage - 1] != rank else [])
    return ([_column(c[0], stage, mbs) for c in forward], [_column(c[0], stage, mbs) for c in backward])


def _column(op: str, stage: int, mbs: tuple[int, ...]) -> list[Action]:
    """Action(op, stage, i) for i in `mbs`: hot (a large schedule is 400k actions), so made without a Python loop
    (starmap hands zip's tuples on as they are: fewer made than by map), the micro-batch numbers shared (range would
    make a new int for each action past 256)."""
    return list(starmap(_new_tuple, zip(repeat(Action), zip(repeat(op), repeat(stage), mbs))))


def _rows(columns: list[list[Action]]) -> list[Action]:
    """The columns' actions (equally many in each) row by row: each micro-batch's actions in column order. Laid by
    slice assignment, in C, four times as fast as chaining zip's rows."""
    k = len(columns)
    rows = columns[0] * k  # the length wanted; every slot is overwritten below
    for j, column in enumerate(columns):
        rows[j::k] = column
    return rows


_new_tuple = tuple.__new__


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
    ranks = [tuple(with_messages(acts, owner)) for acts in interleaved_orders(p, m, v)]
    return receives_at_use(Schedule("interleaved-1f1b", p * v, m, owner, tuple(ranks)))


def interleaved_zb(num_ranks: int, num_microbatches: int, virtual_stages: int = 2) -> Schedule:
    """Interleaved zero bubble (ZB1P, Qi et al., 2023; torch's ScheduleInterleavedZeroBubble): interleaved
    1F1B with each backward split into I and W, rank r letting r weight-grads wait to fill its bubbles.
    Any m that its rounds divide (see interleaved_orders)."""
    _check_sizes(num_ranks, num_microbatches, virtual_stages)
    p, m, v = num_ranks, num_microbatches, virtual_stages
    owner = tuple(s % p for s in range(p * v))
    return Schedule("interleaved-zb", p * v, m, owner, place_messages(interleaved_orders(p, m, v, True), owner))


def interleaved_orders(num_ranks: int, num_microbatches: int, virtual_stages: int,
                       zero_bubble: bool = False) -> list[list[Action]]:
    """Each rank's compute order under interleaved 1F1B, or its zero-bubble variant (ZB1P, torch's
    ScheduleInterleavedZeroBubble: backwards split into I and W, rank r holding back r weight-grads).

    Micro-batches go in rounds of m // max(1, m // p); a rank runs a round's forwards through its
    stages in order and its backwards through them in reverse; warm-up is (v-1) rounds plus 2 (1 for
    zero bubble) forwards per rank after it. For m a multiple of p this is Megatron-LM's order; torch
    also runs it for any m that its rounds divide.
    """
    p, m, v = num_ranks, num_microbatches, virtual_stages
    rounds = max(1, m // p)
    if m % rounds:
        raise ScheduleError(f"interleaved schedules need the micro-batch count ({m}) to be a multiple of "
                            f"its rounds ({rounds})")
    per_round = m // rounds
    return [_interleaved_rank(p, m, v, r, per_round, zero_bubble) for r in range(p)]


def _interleaved_rank(p: int, m: int, v: int, r: int, per_round: int, zero_bubble: bool) -> list[Action]:
    warmup = min((v - 1) * per_round + (1 if zero_bubble else 2) * (p - 1 - r), m * v)
    backward_op = Op.BACKWARD_INPUT if zero_bubble else Op.BACKWARD
    taken: Counter[tuple[str, int]] = Counter()
    out: list[Action] = []
    waiting: list[int] = []  # steps of the backwards whose weight-grad has not run, oldest first

    def add(kind: str, stage: int) -> None:
        out.append(act(kind, stage, taken[kind, stage]))
        taken[kind, stage] += 1

    def forward_stage(step: int) -> int:
        return (step // per_round) % v * p + r

    def backward_stage(step: int) -> int:
        return (v - 1 - (step - warmup) // per_round % v) * p + r

    for step in range(m * v + warmup):
        if step < m * v:
            add(Op.FORWARD, forward_stage(step))
        if step >= warmup:
            add(backward_op, backward_stage(step))
            if zero_bubble:
                waiting.append(step)
                if step - warmup >= r:  # rank r lets r weight-grads wait
                    add(Op.BACKWARD_WEIGHT, backward_stage(waiting.pop(0)))
    for step in waiting:
        add(Op.BACKWARD_WEIGHT, backward_stage(step))
    return out


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
        for i in range(m - warmup):
            acts += forward_with_messages(r, warmup + i, owner) + _input_grad(r, i, owner, waiting, r)
        for i in range(m - warmup, m):
            acts += _input_grad(r, i, owner, waiting, len(waiting))  # cool-down: one W after each I fills its wait
        acts += [Action(Op.BACKWARD_WEIGHT, r, i) for i in waiting]
        ranks.append(tuple(acts))
    return receives_at_use(Schedule("zb-h1", p, m, owner, tuple(ranks)))


def _input_grad(r: int, i: int, owner: tuple[int, ...], waiting: list[int], allowed_waiting: int) -> list[Action]:
    """ZB-H1's input-grad of micro-batch i on rank r, then weight-grads of the oldest `waiting` ones until at most
    `allowed_waiting` wait (`waiting` updated)."""
    out = backward_with_messages(r, i, owner, Op.BACKWARD_INPUT)
    waiting.append(i)
    while len(waiting) > allowed_waiting:
        out.append(Action(Op.BACKWARD_WEIGHT, r, waiting.pop(0)))
    return out


def v_stage_to_rank(num_ranks: int) -> tuple[int, ...]:
    """V-shaped placement of 2p stages: rank r hosts stages r and 2p-1-r, so rank 0 holds the first and the last."""
    return tuple(s if s < num_ranks else 2 * num_ranks - 1 - s for s in range(2 * num_ranks))


class _RankOrder:
    """One rank's compute actions as a schedule lays them down, in order.

    Each kind of action on a stage takes that stage's next micro-batch; a split backward runs
    the input-grad I now and leaves its weight-grad W waiting until asked for.
    """

    def __init__(self) -> None:
        self.actions: list[Action] = []
        self.slots: list[tuple[Action, ...]] = []  # the actions, an overlapped pair as one slot (torch's OVERLAP_F_B)
        self.next: Counter[tuple[str, int]] = Counter()  # (F or backward, stage) -> next micro-batch
        self.waiting: list[Action] = []  # weight-grads whose input-grad has run, oldest first
        self._pair: list[Action] | None = None

    @contextmanager
    def overlapped(self) -> Iterator[None]:
        """The actions laid down inside form one slot: a forward and a backward that DualPipe overlaps."""
        self._pair = []
        yield
        self.slots.append(tuple(self._pair))
        self._pair = None

    def _emit(self, a: Action) -> None:
        self.actions.append(a)
        if self._pair is None:
            self.slots.append((a,))
        else:
            self._pair.append(a)

    def done(self, kind: str, stage: int) -> int:
        """How many micro-batches have had their forward (F) or backward (B: whole or I) on `stage`."""
        return self.next[kind, stage]

    def forward(self, stage: int) -> None:
        self._emit(act(Op.FORWARD, stage, self._take(Op.FORWARD, stage)))

    def backward(self, stage: int, split: bool = True) -> None:
        """The next backward on `stage`: its input-grad, with the weight-grad left waiting, or whole (B)."""
        i = self._take(Op.BACKWARD, stage)
        self._emit(act(Op.BACKWARD_INPUT if split else Op.BACKWARD, stage, i))
        if split:
            self.waiting.append(act(Op.BACKWARD_WEIGHT, stage, i))

    def weight(self, stage: int | None = None) -> None:
        """Run the oldest waiting weight-grad (of `stage`, where given), if there is one."""
        w = next((w for w in self.waiting if stage is None or w.stage == stage), None)
        if w is not None:
            self.waiting.remove(w)
            self._emit(w)

    def all_weights(self, stage: int) -> None:
        """Run every weight-grad still waiting on `stage`, oldest first."""
        while any(w.stage == stage for w in self.waiting):
            self.weight(stage)

    def _take(self, kind: str, stage: int) -> int:
        i = self.next[kind, stage]
        self.next[kind, stage] = i + 1
        return i


def zbv(num_ranks: int, num_microbatches: int) -> Schedule:
    """ZB-V (Qi et al., 2024): two stages per GPU placed in a V, backward split into I and W.

    Rank r hosts stage r (going down the V) and stage 2p-1-r (coming back up), so the last
    stage's output turns around on rank 0 and every rank sees each micro-batch twice. Warm-up:
    rank r runs 2(p-r)-1 forwards down, then r pairs up-down, then p-r times F, I, W up;
    steady state: F, I, W down then up; cool-down: r pairs of input-grads (down, up) with the
    weight-grads held back, p-r more down each with one held weight-grad, then the rest. Rank r
    holds at most 2p chunk-micro-batches of activations, 1F1B's p whole-stage ones, and with
    T_F = T_I = T_W the step is the lower bound 2m(T_F+T_I+T_W) + (p-1)T_F (per-chunk times)
    once m >= (3p-1)/2: rank p-1 waits (p-1)T_F for its first input, then never idles. (The
    paper's "zero bubble" is across steps, where the next step's forwards fill that wait.)
    Planned as for at least 2p-1 micro-batches (a full V), as torch's ScheduleZBVZeroBubble is,
    with the actions of micro-batches beyond m left out.
    """
    _check_sizes(num_ranks, num_microbatches)
    p, m, owner = num_ranks, num_microbatches, v_stage_to_rank(num_ranks)
    n = max(m, 2 * p - 1)
    ranks = []
    for r in range(p):
        down, up, order = r, 2 * p - 1 - r, _RankOrder()
        for _ in range(2 * (p - r) - 1):
            order.forward(down)
        for _ in range(r):
            order.forward(up)
            order.forward(down)
        for _ in range(p - r):
            _zbv_forward_backward(order, up)
        while order.done(Op.FORWARD, up) < n:
            if order.done(Op.FORWARD, down) < n:
                order.forward(down)
            order.backward(down)
            order.weight(down)
            _zbv_forward_backward(order, up)
        for _ in range(r):
            order.backward(down)
            order.backward(up)
        for _ in range(p - r):
            order.backward(down)
            order.weight(down)
        order.all_weights(up)
        order.all_weights(down)
        ranks.append([a for a in order.actions if a.microbatch < m])
    return Schedule("zbv", 2 * p, m, owner, place_messages(ranks, owner))


def _zbv_forward_backward(order: _RankOrder, stage: int) -> None:
    """F, I and W on `stage`: the forward of its next micro-batch, the backward of its oldest."""
    order.forward(stage)
    order.backward(stage)
    order.weight(stage)


def dualpipev(num_ranks: int, num_microbatches: int) -> Schedule:
    """DualPipeV (DeepSeek-V3's DualPipe folded into a V, as torch's ScheduleDualPipeV runs it).

    Stages placed as ZB-V's. Rank r runs 2(p-r-1) forwards down, r+1 pairs down-up, p-r-1
    times I, W, F up; then its main phase pairs a forward of one stage with a whole backward
    of the other (F down, B up, F up, B down), which DualPipe overlaps to hide its MoE
    all-to-alls (parsim has none, so each pair runs in order); then p-r-1 times B up, F up,
    B down. In the cool-down the first half of the remaining 2(r+1) backwards run whole and the
    second half split, whose held weight-grads then fill the tail. Needs m >= 2p, as DeepSeek's
    and torch's do: rank 0 alone runs 2p-1 forwards before its first backward.
    """
    owner = v_stage_to_rank(num_ranks)
    ranks = [order.actions for order in dualpipev_orders(num_ranks, num_microbatches)]
    return Schedule("dualpipev", 2 * num_ranks, num_microbatches, owner, place_messages(ranks, owner))


def dualpipev_orders(num_ranks: int, num_microbatches: int) -> list[_RankOrder]:
    """Each rank's DualPipeV order (see dualpipev), with the pairs DualPipe overlaps as single slots."""
    _check_sizes(num_ranks, num_microbatches)
    p, m = num_ranks, num_microbatches
    if m < 2 * p:
        raise ScheduleError(f"DualPipeV needs at least two micro-batches per GPU (2p = {2 * p}), got {m}")
    orders = []
    for r in range(p):
        down, up, order = r, 2 * p - 1 - r, _RankOrder()
        for _ in range(2 * (p - r - 1)):
            order.forward(down)
        for _ in range(r + 1):
            order.forward(down)
            order.forward(up)
        for _ in range(p - r - 1):
            order.backward(up)
            order.weight()
            order.forward(up)
        for i in range(m - 2 * p + r + 1):
            if i == 0 and r == p - 1:  # the last rank's first pair is not overlapped, to shorten its bubble
                order.forward(down)
                order.backward(up, split=False)
            else:
                with order.overlapped():
                    order.forward(down)
                    order.backward(up, split=False)
            with order.overlapped():
                order.forward(up)
                order.backward(down, split=False)
        for _ in range(p - r - 1):
            order.backward(up, split=False)
            with order.overlapped():
                order.forward(up)
                order.backward(down, split=False)
        for k, stage in enumerate([up, down] * (r + 1)):
            order.backward(stage, split=k >= r + 1)
        for _ in range(p - r - 1):
            order.weight()
            order.backward(down)
        for _ in range(r + 1):
            order.weight()
        orders.append(order)
    return orders


def looped_bfs(num_ranks: int, num_microbatches: int, virtual_stages: int = 2) -> Schedule:
    """Looped BFS (Lamy-Poirier, 2022; torch's ScheduleLoopedBFS): v stages per GPU, stage s on rank s mod p.

    Breadth first: a rank runs every micro-batch's forward on its first stage, then on its
    next, ...; then the backwards, last stage first, each stage's micro-batches newest first.
    Every stage holds all m micro-batches (GPipe's memory); with free communication and m >= p
    the step is interleaved 1F1B's, m(T_F+T_B) + (p-1)(T_F+T_B)/v.
    """
    _check_sizes(num_ranks, num_microbatches, virtual_stages)
    p, m, v = num_ranks, num_microbatches, virtual_stages
    owner = tuple(s % p for s in range(p * v))
    ranks = []
    for r in range(p):
        stages = range(r, p * v, p)
        compute = [act(Op.FORWARD, s, i) for s in stages for i in range(m)]
        ranks.append(compute + [act(Op.BACKWARD, s, i) for s in reversed(stages) for i in reversed(range(m))])
    return Schedule("looped-bfs", p * v, m, owner, place_messages(ranks, owner))
