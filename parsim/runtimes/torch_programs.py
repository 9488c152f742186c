"""Each rank's program as torch.distributed.pipelining's classes issue it (parsim.runtimes.torch_pipelining says
what decides their step): the hand-written loops of GPipe and 1F1B, and the comm-annotated lists torch's runtime
executes for the other classes. Loaded when the torch runtime first builds a schedule."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from parsim.errors import ScheduleError
from parsim.schedules import (
    COMPUTE_OPS,
    PAIRED_RECV,
    Action,
    CommPlan,
    Op,
    Schedule,
    act,
    dualpipev_orders,
    gpipe,
    interleaved_orders,
    looped_bfs,
    one_f_one_b,
    v_stage_to_rank,
    zbv,
)

FSDP_ACTIVE_STAGES = 3  # _add_unshard_reshard's max_active_stages

Slot = tuple[Action, ...] | None  # one turn of a rank's list: an action, an overlapped pair, or an FSDP action


def torch_schedule(name: str, p: int, m: int, v: int) -> Schedule:
    """torch's class `name` (by parsim's name, its sizes checked) on p ranks and m micro-batches, v stages per rank
    where it loops over them: its actions in the order torch issues them, with how it posts and awaits its
    messages."""
    if name == "gpipe":
        return _single(name, gpipe(p, m), _gpipe_programs(p, m))
    if name == "1f1b":
        return _single(name, one_f_one_b(p, m), _one_f_one_b_programs(p, m))
    owner, slots = _compute_slots(name, p, m, v)
    return _runtime_schedule(name, m, owner, slots)


# --- the classes with hand-written loops (PipelineScheduleSingle) ----------------------------------------------

class _Program:
    """One rank's host program as torch's loop issues it: computes, batches of messages posted, and waits."""

    def __init__(self) -> None:
        self.actions: list[Action] = []
        self.batches: list[tuple[Action, ...]] = []
        self.waits: dict[Action, tuple[Action, ...]] = {}
        self._pending: list[Action] = []  # waited for since the last compute: the next compute's stream waits

    def post(self, messages: Sequence[Action]) -> tuple[Action, ...]:
        """batch_isend_irecv(messages) (nothing for an empty list); the batch, to wait on later."""
        if messages:
            self.actions += messages
            self.batches.append(tuple(messages))
        return tuple(messages)

    def wait(self, messages: Sequence[Action]) -> None:
        """work.wait() on each: the compute stream waits for them before its next kernel."""
        self._pending += messages

    def compute(self, a: Action) -> None:
        self.actions.append(a)
        if self._pending:
            self.waits[a] = tuple(self._pending)
            self._pending = []


def _single(name: str, generated: Schedule, programs: list[_Program]) -> Schedule:
    """A one-stage-per-rank schedule as torch's loops post it: the compute order is the generator's."""
    assert [[a for a in acts if a.op in COMPUTE_OPS] for acts in generated.actions] == \
        [[a for a in p.actions if a.op in COMPUTE_OPS] for p in programs]
    comm = CommPlan(tuple(tuple(p.batches) for p in programs), {a: w for p in programs for a, w in p.waits.items()})
    return Schedule(name, generated.num_stages, generated.num_microbatches, generated.stage_to_rank,
                    tuple(tuple(p.actions) for p in programs), comm)


Messages = Callable[[int], list[Action]]  # a stage's messages of one kind for micro-batch i


def _messages(p: int, s: int) -> tuple[Messages, Messages, Messages, Messages]:
    """Stage s's receive-forward, send-forward, receive-backward and send-backward of micro-batch i, as lists
    (empty where the stage has no such neighbour)."""
    def recv_f(i: int) -> list[Action]:
        return [act(Op.RECV_F, s, i)] if s > 0 else []

    def send_f(i: int) -> list[Action]:
        return [act(Op.SEND_F, s, i)] if s < p - 1 else []

    def recv_b(i: int) -> list[Action]:
        return [act(Op.RECV_B, s, i)] if s < p - 1 else []

    def send_b(i: int) -> list[Action]:
        return [act(Op.SEND_B, s, i)] if s > 0 else []

    return recv_f, send_f, recv_b, send_b


def _gpipe_programs(p: int, m: int) -> list[_Program]:
    """ScheduleGPipe._step_microbatches: receive, compute and send each forward, then wait for every forward
    send, then the backwards alike."""
    programs = []
    for s in range(p):
        prog, (recv_f, send_f, recv_b, send_b) = _Program(), _messages(p, s)
        sends: list[Action] = []
        for i in range(m):
            prog.wait(prog.post(recv_f(i)))
            prog.compute(act(Op.FORWARD, s, i))
            sends += prog.post(send_f(i))
        prog.wait(sends)
        for i in range(m):
            prog.wait(prog.post(recv_b(i)))
            prog.compute(act(Op.BACKWARD, s, i))
            prog.post(send_b(i))
        programs.append(prog)
    return programs


def _one_f_one_b_programs(p: int, m: int) -> list[_Program]:
    """Schedule1F1B._step_microbatches: p-s warm-up forwards, the last one's send left to go with the first
    backward's receive; then backward, forward in turns, each posted with the other's message; the cool-down."""
    programs = []
    for s in range(p):
        prog, (recv_f, send_f, recv_b, send_b) = _Program(), _messages(p, s)
        warmup = min(m, p - s)
        posted: tuple[Action, ...] = ()  # the send batch the next compute's stream waits for
        fwd_sends: list[Action] = []
        for f in range(warmup):
            prog.wait(prog.post(recv_f(f)))
            prog.compute(act(Op.FORWARD, s, f))
            prog.wait(posted)
            fwd_sends = send_f(f)
            if f != warmup - 1:
                posted = prog.post(fwd_sends)
        f, b = warmup, 0
        while True:
            prog.wait(prog.post(fwd_sends + recv_b(b)))
            prog.compute(act(Op.BACKWARD, s, b))
            bwd_sends, b = send_b(b), b + 1
            if f == m:
                break
            prog.wait(prog.post(bwd_sends + recv_f(f)))
            prog.compute(act(Op.FORWARD, s, f))
            fwd_sends, f = send_f(f), f + 1
        posted = prog.post(bwd_sends)
        while b < m:
            prog.wait(prog.post(recv_b(b)))
            prog.compute(act(Op.BACKWARD, s, b))
            prog.wait(posted)
            posted, b = prog.post(send_b(b)), b + 1
        programs.append(prog)
    return programs


# --- the classes run by _PipelineScheduleRuntime ------------------------------------------------------------

def _compute_slots(name: str, p: int, m: int, v: int) -> tuple[tuple[int, ...], list[list[Slot]]]:
    """Stage owners and each rank's compute order, as torch's class lays it down (an overlapped pair as one slot)."""
    if name in ("interleaved-1f1b", "interleaved-zb"):
        orders = interleaved_orders(p, m, v, zero_bubble=name == "interleaved-zb")
        return tuple(s % p for s in range(p * v)), [[(a,) for a in acts] for acts in orders]
    if name == "dualpipev":
        return v_stage_to_rank(p), [list(order.slots) for order in dualpipev_orders(p, m)]
    generated = looped_bfs(p, m, v) if name == "looped-bfs" else zbv(p, m)
    return generated.stage_to_rank, [[(a,) for a in acts if a.op in COMPUTE_OPS] for acts in generated.actions]


def _runtime_schedule(name: str, m: int, owner: tuple[int, ...], slots: list[list[Slot]]) -> Schedule:
    """The comm-annotated lists torch's runtime executes; each send or receive its own batch, awaited by the
    compute that consumes it (a data dependency already) or at the end of the step (sends)."""
    lists = _add_send_recv([_with_fsdp_turns(rank_slots, m) for rank_slots in slots], owner)
    comm = CommPlan(tuple(tuple((a,) for a in acts if a.op not in COMPUTE_OPS) for acts in lists))
    return Schedule(name, len(owner), m, owner, tuple(tuple(acts) for acts in lists), comm)


def _with_fsdp_turns(slots: list[Slot], m: int) -> list[Slot]:
    """A rank's slots with a turn (None) wherever torch's lowering inserts UNSHARD, RESHARD or REDUCE_GRAD.

    They cost nothing in parsim's model (no FSDP), but they take turns when _add_send_recv lays the lists
    down rank by rank, and so move where receives land.
    """
    out: list[Slot] = []
    active: set[int] = set()
    for slot, upcoming in zip(slots, _next_stages(slots, FSDP_ACTIVE_STAGES)):
        out += [None] * (len(active - upcoming) + len(upcoming - active))  # reshards, unshards
        active = upcoming
        out.append(slot)
    out += [None] * len(active)
    backwards: dict[int, int] = {}
    with_reduce: list[Slot] = []
    for slot in out:
        with_reduce.append(slot)
        for a in slot or ():
            if a.op in (Op.BACKWARD, Op.BACKWARD_WEIGHT):
                backwards[a.stage] = backwards.get(a.stage, 0) + 1
                if backwards[a.stage] == m:
                    with_reduce.append(None)
    return with_reduce


def _next_stages(slots: list[Slot], count: int) -> list[set[int]]:
    """At each slot, the next `count` distinct stages the slots from there on compute on (an overlapped pair
    adds both before counting: all of them where fewer remain).

    One backward pass: the stages that come first from slot i are those whose next slot is among the
    `count` earliest (a pair's two stages share theirs), so no slot is scanned twice.
    """
    next_at: dict[int, int] = {}  # stage -> the first slot from here on that computes on it
    out: list[set[int]] = []
    for i in range(len(slots) - 1, -1, -1):
        for a in slots[i] or ():
            next_at[a.stage] = i
        if len(next_at) <= count:
            out.append(set(next_at))
            continue
        last = sorted(next_at.values())[count - 1]
        out.append({stage for stage, at in next_at.items() if at <= last})
    return out[::-1]


def _add_send_recv(slots: list[list[Slot]], owner: tuple[int, ...]) -> list[list[Action]]:
    """Lay the ranks' slots down in turns, rank 0 first; a slot goes once the data its computes consume is on
    the rank (received, or made by the adjacent stage there); each compute that sends is followed by its send,
    and its receive is appended to the receiver's list then (torch's _add_send_recv)."""
    last = len(owner) - 1
    queues = [deque(rank_slots) for rank_slots in slots]
    out: list[list[Action]] = [[] for _ in slots]
    have: list[set[Action]] = [set() for _ in slots]

    def ready(a: Action, rank: int) -> bool:
        s, i = a.stage, a.microbatch
        if a.op == Op.FORWARD and s > 0:
            return act(Op.RECV_F, s, i) in have[rank] or act(Op.FORWARD, s - 1, i) in have[rank]
        if a.op in (Op.BACKWARD, Op.BACKWARD_INPUT) and s < last:
            return any(x in have[rank] for x in (act(Op.RECV_B, s, i), act(Op.BACKWARD_INPUT, s + 1, i),
                                                 act(Op.BACKWARD, s + 1, i)))
        return True

    while any(queues):
        progress = False
        for rank, queue in enumerate(queues):
            if not queue:
                continue
            slot = queue[0]
            if slot is not None and not all(ready(a, rank) for a in slot):
                continue
            for a in slot or ():
                out[rank].append(a)
                have[rank].add(a)
            for a in slot or ():
                send = _send_of(a, owner)
                if send is not None:
                    recv = _recv_of(send)
                    out[rank].append(send)
                    have[rank].add(send)
                    out[owner[recv.stage]].append(recv)
                    have[owner[recv.stage]].add(recv)
            queue.popleft()
            progress = True
        if not progress:
            raise ScheduleError("torch's runtime cannot place this order's messages: some compute waits for data "
                                "that no rank sends first")
    return out


def _send_of(a: Action, owner: tuple[int, ...]) -> Action | None:
    """The send a compute is followed by: its output to the next stage (F) or its input's gradient back (B, I),
    where that stage is on another rank."""
    s = a.stage
    if a.op == Op.FORWARD and s < len(owner) - 1 and owner[s + 1] != owner[s]:
        return act(Op.SEND_F, s, a.microbatch)
    if a.op in (Op.BACKWARD, Op.BACKWARD_INPUT) and s > 0 and owner[s - 1] != owner[s]:
        return act(Op.SEND_B, s, a.microbatch)
    return None


def _recv_of(send: Action) -> Action:
    op, step = PAIRED_RECV[send.op]
    return act(op, send.stage + step, send.microbatch)
