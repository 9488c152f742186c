"""Checks that a schedule is complete, well-formed and free of deadlock, with a clear reason if not."""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from operator import itemgetter

from parsim.errors import ScheduleError
from parsim.schedules import ALL_OPS, COMPUTE_OPS, NEIGHBOUR, Action, Op, Schedule, act, check_layout
from parsim.sim.dataflow import issue_waits, transfers


def validate(schedule: Schedule, copy_streams: bool = False, check_deadlock: bool = True,
             check_order: bool = True) -> None:
    """Raise ScheduleError naming the first problem; return None for a runnable schedule.

    The deadlock check walks the whole wait graph; the simulator, which finds deadlocks as it
    runs, skips it (check_deadlock=False) to stay fast on large schedules. Its longest-path pass
    also checks that each channel's messages are received in the order they are sent, as it goes,
    and skips that check here (check_order=False) until it finds them out of order.
    """
    counts = _check_shape(schedule)
    _check_each_action_once(schedule)
    _check_compute_complete(schedule, counts)
    _check_messages_pair_up(schedule, counts)
    if check_order:
        check_channel_order(schedule)
    if check_deadlock:
        _check_no_deadlock(schedule, copy_streams)


_OP_STAGE, _MICROBATCH, _RECV = itemgetter(0, 1), itemgetter(2), itemgetter(1)  # of an Action; _RECV of a Transfer


def _check_shape(schedule: Schedule) -> Counter[tuple[str, int]]:
    """Sizes, and every action's op, stage, rank and micro-batch in range; return how many actions
    each (op, stage) has, which the completeness checks read instead of counting again."""
    check_layout(schedule)
    s, m = schedule.num_stages, schedule.num_microbatches
    counts: Counter[tuple[str, int]] = Counter()
    for rank, acts in enumerate(schedule.actions):
        # Checked per distinct (op, stage) and over column extremes: large schedules repeat them.
        kinds = Counter(map(_OP_STAGE, acts))  # counted in C: this sees every action
        for op, stage in sorted(kinds):
            a = next(x for x in acts if x.op == op and x.stage == stage)
            if op not in ALL_OPS:
                raise ScheduleError(f"rank {rank}: unknown op {op!r} in {a}")
            if not 0 <= stage < s:
                raise ScheduleError(f"rank {rank}: {a} is outside {s} stages x {m} micro-batches")
            if schedule.stage_to_rank[stage] != rank:
                raise ScheduleError(f"rank {rank}: {a} belongs to rank "
                                    f"{schedule.stage_to_rank[stage]}, which hosts stage {stage}")
            if op not in COMPUTE_OPS:
                _check_comm_endpoint(schedule, rank, a)
        if acts and not (0 <= min(map(_MICROBATCH, acts)) and max(map(_MICROBATCH, acts)) < m):
            a = next(x for x in acts if not 0 <= x.microbatch < m)
            raise ScheduleError(f"rank {rank}: {a} is outside {s} stages x {m} micro-batches")
        counts.update(kinds)
    return counts


def _check_comm_endpoint(schedule: Schedule, rank: int, a: Action) -> None:
    step = NEIGHBOUR[a.op]
    if not 0 <= a.stage + step < schedule.num_stages:
        raise ScheduleError(f"rank {rank}: {a} has no neighbouring stage to talk to")
    if schedule.peer(a) == rank:
        raise ScheduleError(f"rank {rank}: {a} talks to its own rank; stages on one rank "
                            "hand data over without a send")


def _check_each_action_once(schedule: Schedule) -> None:
    # An action's stage names its rank (checked before), so one action cannot be on two ranks.
    if all(len(set(acts)) == len(acts) for acts in schedule.actions):
        return
    everything = [a for acts in schedule.actions for a in acts]
    if len(set(everything)) != len(everything):
        counts = Counter(everything)
        first = min(a for a, n in counts.items() if n > 1)
        raise ScheduleError(f"{schedule.name}: {first} appears {counts[first]} times")


def _check_compute_complete(schedule: Schedule, counts: Counter[tuple[str, int]]) -> None:
    """Every stage runs each micro-batch's forward once and its backward once (as B, or as I+W);
    `counts` has each (op, stage)'s number of actions."""
    m = schedule.num_microbatches
    if all(counts[Op.FORWARD, s] == m and (counts[Op.BACKWARD, s], counts[Op.BACKWARD_INPUT, s],
                                           counts[Op.BACKWARD_WEIGHT, s]) in ((m, 0, 0), (0, m, m))
           for s in range(schedule.num_stages)):
        return  # actions are unique and in range (checked before), so every one is there: the common case
    present = {a for acts in schedule.actions for a in acts if a.is_compute}
    for s in range(schedule.num_stages):
        for i in range(schedule.num_microbatches):
            if act(Op.FORWARD, s, i) not in present:
                raise ScheduleError(f"{schedule.name}: forward of stage {s}, micro-batch {i} is missing")
            full = act(Op.BACKWARD, s, i) in present
            split = [act(op, s, i) in present for op in (Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT)]
            if full and any(split):
                raise ScheduleError(f"{schedule.name}: stage {s}, micro-batch {i} runs both B and I/W")
            if not full and not all(split):
                raise ScheduleError(f"{schedule.name}: backward of stage {s}, micro-batch {i} "
                                    "is missing or incomplete")


def _check_messages_pair_up(schedule: Schedule, counts: Counter[tuple[str, int]]) -> None:
    """Each needed message is sent and received once; `counts` has each (op, stage)'s number of actions."""
    stage_to_rank, m = schedule.stage_to_rank, schedule.num_microbatches
    for s in range(schedule.num_stages - 1):
        if stage_to_rank[s] == stage_to_rank[s + 1]:
            continue
        ends = ((Op.SEND_F, s), (Op.RECV_F, s + 1), (Op.SEND_B, s + 1), (Op.RECV_B, s))
        if all(counts[end] == m for end in ends):
            continue  # unique and in range (checked before), so all there
        present = {a for acts in schedule.actions for a in acts if not a.is_compute}
        missing = {act(op, stage, i) for i in range(m) for op, stage in ends} - present
        if missing:
            a = min(missing)
            raise ScheduleError(f"{schedule.name}: {a} is missing on rank {stage_to_rank[a.stage]}")


def check_channel_order(schedule: Schedule) -> None:
    """Each channel's messages are received in the order they are sent (NCCL matches them in order)."""
    recvs = _receives_by_channel(schedule)
    for (src, dst), msgs in transfers(schedule).items():
        expected = list(map(_RECV, msgs))
        got = recvs.get((src, dst), [])
        if expected == got:
            continue
        for k, (want, r) in enumerate(zip(expected, got)):
            if want != r:
                raise ScheduleError(f"channel rank {src} -> rank {dst}: message {k} is sent as "
                                    f"{msgs[k].send} but rank {dst} expects {r}; NCCL matches messages "
                                    "in order, so this would deadlock or corrupt data")


def _receives_by_channel(schedule: Schedule) -> dict[tuple[int, int], list[Action]]:
    """(src, dst) -> the receives rank dst runs from rank src, in its program order."""
    recv_f, recv_b, owner = Op.RECV_F, Op.RECV_B, schedule.stage_to_rank
    recvs: dict[tuple[int, int], list[Action]] = {}
    for rank, acts in enumerate(schedule.actions):
        by_src: dict[int, list[Action]] = defaultdict(list)
        for a in [a for a in acts if a[0] == recv_f or a[0] == recv_b]:  # by index: this sees every action
            by_src[owner[a[1] - 1] if a[0] == recv_f else owner[a[1] + 1]].append(a)
        recvs.update(((src, rank), got) for src, got in by_src.items())
    return recvs


def _check_no_deadlock(schedule: Schedule, copy_streams: bool) -> None:
    """Kahn's algorithm over compute ops and messages; what is left over is a wait cycle."""
    node = {}  # action -> graph node (a receive is one node with its send)
    for msgs in transfers(schedule).values():
        for t in msgs:
            node[t.send] = node[t.recv] = t.send
    succ: dict[Action, list[Action]] = defaultdict(list)
    indeg: Counter[Action] = Counter()
    nodes: set[Action] = set()

    def edge(a: Action, b: Action) -> None:
        u, v = node.get(a, a), node.get(b, b)
        if u != v:
            succ[u].append(v)
            indeg[v] += 1

    for acts in schedule.actions:
        prev_compute = None
        for a in acts:
            nodes.add(node.get(a, a))
            if a.is_compute:
                if prev_compute is not None:
                    edge(prev_compute, a)
                prev_compute = a
    for msgs in transfers(schedule).values():
        for t0, t1 in zip(msgs, msgs[1:]):
            edge(t0.send, t1.send)
    for a, deps in issue_waits(schedule, copy_streams).items():
        for d in deps:
            edge(d, a)
    ready = deque(n for n in nodes if indeg[n] == 0)
    done = 0
    while ready:
        n = ready.popleft()
        done += 1
        for v in succ[n]:
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    if done < len(nodes):
        stuck = sorted(n for n in nodes if indeg[n] > 0)[:4]
        raise ScheduleError(f"{schedule.name}: deadlock: these actions wait on each other in a cycle "
                            f"(first few): {', '.join(map(str, stuck))}")
