"""A pipeline step settled by one longest-path pass over its ops, without SimPy's event queue.

Where no two streams share a resource, an op's start and end follow from what it waits for (max-plus), in
whatever order they are worked out. So each rank's program is walked once, in order: its host's clock runs
ahead (a host blocks only in the step's final sync), its compute stream pauses where an op waits for one not
settled yet, and a message is settled, in its channel's order, once both hosts have issued it. The
arithmetic is the event-driven machine's (parsim.sim.machine), the same additions and maxima on the same
numbers, so the times are equal to the bit; tests compare the two on every schedule and runtime. Shared
links (contention) and anything this walk cannot order are left to the machine.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from operator import itemgetter, length_hint
from typing import Any

from parsim.profile import CollectiveSpec, Profile
from parsim.progress import watch as watch_progress
from parsim.schedules import ALL_OPS, COMM_OPS, COMPUTE_OPS, PAIRED_RECV, Action, Op, Schedule
from parsim.sim.dataflow import GRAD, kept, stage_waits
from parsim.sim.grad_allreduce import allreduce_spec
from parsim.sim.lower import (
    GRADIENT_OPS,
    Rebuilt,
    action_extras,
    comm_waits,
    compute_launches,
    last_gradient_actions,
    lengthened,
    link_for,
    message_bytes,
)
from parsim.workload import StageCost, gradient_adds

ALIKE_REPLICAS_ONCE = True  # simulate alike replicas once (replicas_alike); benchmarks/plan_exact.py turns it off
Span = tuple[object, float, float]  # a compute stream's op: its action (or its label), start, end
Row = list[Any]  # one (op, stage)'s micro-batches: an end time, or None / the waiters' tags while not settled
Entry = tuple[Any, ...]  # the walk's entry for an (op, stage): a compute's or a message's (see the tables below)
Blocks = tuple[int, int, dict[str, tuple[Any, ...]]]  # a rank's program in blocks (_built_blocks)


@dataclass(frozen=True)
class Settled:
    """The step as the walk settled it: its time, each GPU's busy time, each host's end, and each op's end."""

    step_time_s: float
    busy_s: tuple[float, ...]  # per GPU: time its compute stream runs kernels
    finished_s: tuple[float, ...]  # per host: when its final sync returned
    ends: list[dict[str, list[Row]]]  # per replica: op -> stage -> micro-batch -> end (a message's, at both ends)
    # observed (settle_step's observe): per rank of the first replica, its compute stream's ops as (action or
    # label, start, end), and when its host let the device start each receive; else empty
    computes: tuple[list[Span], ...] = ()
    posted: tuple[dict[Action, float], ...] = ()


class _OutOfOrder(Exception):
    """A channel's messages are received in another order than they are sent."""


class _Channel:
    """A directed channel's stream: messages run one at a time, in the sender's order."""

    __slots__ = ("free", "queue", "tag", "sent", "received")

    def __init__(self, tag: int) -> None:
        self.free = 0.0  # when its last settled message ends
        self.sent, self.received = [0], [0]  # messages issued so far by its sender, by its receiver
        self.queue: list[list[Any]] = []  # issued by both hosts, waiting for a dependency or the message before
        self.tag = tag  # its waiter tag (negative; walkers' tags are their index)


def settle_step(schedule: Schedule, costs: list[StageCost], profile: Profile, copy_streams: bool = False,
                data_parallel: int = 1, buckets: dict[int, int] | None = None,
                slower: Mapping[Action, float] | None = None, observe: bool = False, recompute: str = "never",
                check: bool = False) -> Settled | None:
    """Settle one step as parsim.sim.predict.simulate builds it on the machine (its computes lengthened by
    `slower`, as parsim.sim.sharing asks, and by `recompute`'s forwards run again); None where it needs the machine
    (a link that several channels share, or an order this walk cannot follow) or a channel's messages are received
    out of order. `schedule` must be validated otherwise (check.validate with check_order=False), or `check` asked:
    then the walk vouches for it (each action on its rank, in range, once; every one a valid step has) or gives None,
    where check.validate names what is wrong. `observe`: keep what parsim.sim.sharing reads.

    Replicas whose messages all cost the same are the same walk, to the bit (the same numbers in the same
    order): the first is walked and stands for the others, so the step's cost does not grow with them."""
    pp = schedule.num_ranks
    channels_of = channel_pairs(schedule)
    if _shares_a_link(profile, channels_of, pp, data_parallel):
        return None
    walked = 1 if replicas_alike(profile, schedule, data_parallel) else data_parallel
    launches = compute_launches(costs, profile)
    extras = action_extras(schedule, costs, profile, recompute, copy_streams)
    slower = lengthened(slower, extras.gpu)
    add_s = gradient_adds(profile, costs)
    rules = kept(schedule, "_stage_waits", stage_waits)
    more = comm_waits(schedule)
    last_grad = kept(schedule, "_last_gradient_actions", last_gradient_actions) if buckets else {}
    built = not copy_streams and schedule.__dict__.get("valid_as_built", False)  # parsim.schedules.valid_as_built
    check = check and not built
    work: list[int] = []
    walkers: list[Iterator[None]] = []
    channels: list[_Channel] = []
    tables: list[dict[str, list[Row]]] = []
    hosts: list[_Host] = []
    programs: list[Iterator[Action]] = []
    for replica in range(walked):
        off = replica * pp
        end = {op: [[None] * schedule.num_microbatches for _ in range(schedule.num_stages)]
               for op in (*ALL_OPS, GRAD)}
        chans = {}
        for src, dst in channels_of:
            chans[src, dst] = _Channel(-1 - len(channels))
            channels.append(chans[src, dst])
        table = _compute_table(schedule, launches, rules, end, last_grad, buckets or {}, add_s)
        table |= _message_table(schedule, costs, profile, rules, end, chans, off)
        views = _rank_tables(table, schedule.stage_to_rank, pp)
        blocks = _rank_blocks(views) if built else None
        for rank, acts in enumerate(schedule.actions):
            host = _Host(off + rank)
            host.t = profile.host.begin_s  # the runtime's bookkeeping before its first launch
            if observe and replica == 0:
                host.spans, host.posted = [], {}
            hosts.append(host)
            programs.append(iter(acts))  # where each walk has got to: its iterator's length hint (for progress)
            if slower or extras.host or extras.early or more or host.spans is not None:
                walkers.append(_walk(programs[-1], views[rank], end, more, profile.host.p2p_s, not copy_streams,
                                     len(walkers), work, channels, host, extras.host, slower or None, extras.early))
            elif blocks is not None:
                walkers.append(_walk_built(programs[-1], views[rank], blocks[rank], profile.host.p2p_s, len(walkers),
                                           work, host))
            else:
                walkers.append(_walk_plain(programs[-1], views[rank], profile.host.p2p_s, not copy_streams,
                                           len(walkers), work, host))
        tables.append(end)
    total = sum(map(len, schedule.actions)) * walked
    watch_progress(lambda: (total - sum(map(length_hint, programs)), total))
    work.extend(range(len(walkers) - 1, -1, -1))
    if check and not _microbatches_nonnegative(schedule):
        return None
    try:
        finished = _run(walkers, work, channels)
    except _OutOfOrder:
        return None
    except (LookupError, TypeError, ValueError):  # an action out of range, on another rank, repeated or malformed
        if not check:
            raise
        return None
    if finished < len(walkers) or any(c.queue for c in channels):
        return None  # some op waits in a way the walk does not follow: the machine settles it (or names the deadlock)
    if check and not _complete(schedule, tables[0]):
        return None
    _all_reduce(schedule, costs, profile, hosts, data_parallel)
    for replica in range(walked):
        for (src, dst), ch in zip(channels_of, channels[replica * len(channels_of):]):
            for h in (hosts[replica * pp + src], hosts[replica * pp + dst]):
                h.track_ends.append(ch.free)
    step_s = profile.host.step_s
    finished_s = []
    for h in hosts:
        if step_s > 0:  # the runtime's bookkeeping: an empty op on the host's own stream, after its launches
            h.track_ends.append(h.t + step_s)
            h.t += step_s
        t = h.t
        for e in h.track_ends:
            if e > t:
                t = e
        finished_s.append(t)
    copies = data_parallel // walked  # each walked replica stands for this many (all of them, or itself)
    return Settled(max(finished_s, default=0.0), tuple(h.busy for h in hosts) * copies, tuple(finished_s) * copies,
                   tables * copies, tuple(h.spans for h in hosts[:pp] if h.spans is not None),
                   tuple(h.posted for h in hosts[:pp] if h.posted is not None))


def _run(walkers: list[Iterator[None]], work: list[int], channels: list[_Channel]) -> int:
    """Resume what `work` names (a walker's tag, or a channel's: negative) until nothing is left; how many walkers
    finished. Hot: once per walker's wait (64k times for 1F1B 64 x 1024)."""
    resume = [w.__next__ for w in walkers]
    pop = work.pop
    finished = 0
    while work:
        try:
            while work:
                tag = pop()
                if tag >= 0:
                    resume[tag]()
                else:
                    _drain(channels[-1 - tag], work)
        except StopIteration:
            finished += 1
    return finished


def channel_pairs(schedule: Schedule) -> list[tuple[int, int]]:
    """The directed channels (src rank, dst rank) between neighbouring stages on different ranks, each once."""
    owner = schedule.stage_to_rank
    pairs = sorted({(r, owner[s + 1]) for s, r in enumerate(owner[:-1]) if owner[s + 1] != r})
    return pairs + [(dst, src) for src, dst in pairs]


def replicas_alike(profile: Profile, schedule: Schedule, data_parallel: int) -> bool:
    """Whether every replica's channels cross links of the same cost as the first replica's, shared among its own
    channels as the first's are and with no other replica's: then the replicas settle alike, to the bit (the same
    numbers in the same order, on the walk or the machine), and the first can stand for them all. False where
    ALIKE_REPLICAS_ONCE is off."""
    if not ALIKE_REPLICAS_ONCE or data_parallel < 2:
        return False
    pp, n = schedule.num_ranks, profile.gpus_per_node
    if n % pp == 0 or pp % n == 0:  # replicas within a node, or of whole nodes: each laid out as the first
        return True
    mine = channel_pairs(schedule)
    first, taken = _layout(profile, mine, 0)
    for off in range(pp, pp * data_parallel, pp):
        layout, shared = _layout(profile, mine, off)
        if layout != first or shared & taken:
            return False
        taken |= shared
    return True


def _layout(profile: Profile, channels: list[tuple[int, int]], off: int) -> tuple[list[Any], set[str]]:
    """The channels of the replica on GPUs off..: each one's link spec and the first of them it shares its link
    with (-1: unshared); and the shared links' names."""
    first_user: dict[str, int] = {}
    out = []
    for k, (src, dst) in enumerate(channels):
        name, spec, shared = link_for(profile, src + off, dst + off)
        out.append((spec, first_user.setdefault(name, k) if shared else -1))
    return out, set(first_user)


def _shares_a_link(profile: Profile, channels: list[tuple[int, int]], pp: int, data_parallel: int) -> bool:
    """Whether two channels (streams) cross one shared link: then they take it in time order, which needs the clock.
    Replicas within one node each cross only their own links; replicas of whole nodes, only their nodes': then the
    first replica's channels tell."""
    users: dict[str, int] = defaultdict(int)
    n = profile.gpus_per_node
    for off in range(0, pp if n % pp == 0 or pp % n == 0 else pp * data_parallel, pp):
        for src, dst in channels:
            name, _, shared = link_for(profile, src + off, dst + off)
            if shared:
                users[name] += 1
    return any(n > 1 for n in users.values())


def _rank_tables(table: dict[str, list[Entry | None]], owner: tuple[int, ...], pp: int,
                 ) -> list[dict[str, dict[int, Entry | None]]]:
    """Per rank, the walk's table with only its own stages' entries: another rank's stage (or one out of range) is
    not there, which stops the walk (check.validate names the action)."""
    views: list[dict[str, dict[int, Entry | None]]] = [{op: {} for op in table} for _ in range(pp)]
    for op, entries in table.items():
        for s, entry in enumerate(entries):
            views[owner[s]][op][s] = entry
    return views


def _microbatches_nonnegative(schedule: Schedule) -> bool:
    """No action names a negative micro-batch (a row would read it from its end); too large ones raise IndexError."""
    try:
        return all(min(map(itemgetter(2), acts)) >= 0 for acts in schedule.actions if acts)
    except (LookupError, TypeError, ValueError):
        return False


def _full(row: Row) -> bool:
    """Whether every slot of `row` is settled (a float): None or a waiters' list makes the sum raise."""
    try:
        sum(row)
    except TypeError:
        return False
    return True


def _backwards(whole: Row, inputs: Row, weights: Row) -> int | None:
    """How many backward actions a stage's rows say it ran, where each micro-batch ran B, or I and W; else None."""
    if _full(whole):
        return len(whole)
    if _full(inputs) and _full(weights):
        return 2 * len(whole)
    n = 0
    for b, i, w in zip(whole, inputs, weights):  # some of each (DualPipeV's cool-down)
        if b.__class__ is float:
            n += 1
        elif i.__class__ is float and w.__class__ is float:
            n += 2
        else:
            return None
    return n


def _complete(schedule: Schedule, end: dict[str, list[Row]]) -> bool:
    """Whether the walk settled every action a valid schedule has (each stage's forwards, its backwards whole or
    split, each message between ranks) and the schedule has no more actions than those: with each action settling
    one slot and a repeated one stopping the walk, it then has each once."""
    m, owner = schedule.num_microbatches, schedule.stage_to_rank
    required = 0
    for s in range(schedule.num_stages):
        backwards = _backwards(end[Op.BACKWARD][s], end[Op.BACKWARD_INPUT][s], end[Op.BACKWARD_WEIGHT][s])
        if backwards is None or not _full(end[Op.FORWARD][s]):
            return False
        required += m + backwards
        if s + 1 < schedule.num_stages and owner[s] != owner[s + 1]:
            if not (_full(end[Op.SEND_F][s]) and _full(end[Op.SEND_B][s + 1])):
                return False
            required += 4 * m  # two messages, each sent and received
    return required == sum(map(len, schedule.actions))


class _Host:
    """A rank's host thread and compute stream as the walk leaves them."""

    __slots__ = ("gpu", "t", "busy", "free", "track_ends", "chunk_ends", "spans", "posted")

    def __init__(self, gpu: int) -> None:
        self.gpu = gpu
        self.t = 0.0  # the host's clock after its last launch
        self.busy = 0.0
        self.free = 0.0  # when its compute stream's last op ends
        self.track_ends: list[float] = []  # ends of the last op it launched on each stream, for its final sync
        self.chunk_ends: dict[int, list[float]] = {}  # stage -> ends of its last gradient action's bucket chunks
        self.spans: list[Span] | None = None  # observed: its compute stream's ops (action or label, start, end)
        self.posted: dict[Action, float] | None = None  # observed: when it let the device start each receive


def _compute_table(schedule: Schedule, launches: dict[str, list[tuple[float, ...]]],
                   rules: dict[str, list[tuple[tuple[str, int], ...]]], end: dict[str, list[Row]],
                   last_grad: dict[int, Action], buckets: dict[int, int],
                   add_s: list[float] | None = None) -> dict[str, list[Entry | None]]:
    """op -> per stage, the walk's entry for its computes: (True, gpu_s, tail_s, host_s, first_s, its row, the GRAD
    row it also fills or None, the rows it waits for, None or (the (op, entry) pairs the stage's gradient actions
    take after this one, the micro-batch whose action is split into gradient-bucket chunks or -1, the chunk count)).
    As lowering has it, a stage's first gradient action (B or W) pays the fresh host costs and each later one adds
    its gradients on the GPU (gpu_s + add)."""
    table: dict[str, list[Entry | None]] = {}
    later: list[list[tuple[str, Entry]]] = [[] for _ in range(schedule.num_stages)]  # per stage: after its first
    for op in COMPUTE_OPS:
        table[op] = []
        for s in range(schedule.num_stages):
            split = last_grad.get(s)
            split_mb = split.microbatch if split is not None and split.op == op else -1
            n = buckets.get(s, 1)
            grad_row = end[GRAD][s] if op in (Op.BACKWARD, Op.BACKWARD_INPUT) else None
            deps = tuple(end[k][t] for k, t in rules[op][s])
            gpu_s, tail_s, host_s, first_s, fresh_host_s, fresh_first_s = launches[op][s]
            chunked = (None, split_mb, n) if split_mb >= 0 else None
            if op not in GRADIENT_OPS:
                table[op].append((True, gpu_s, tail_s, host_s, first_s, end[op][s], grad_row, deps, chunked))
                continue
            add = add_s[s] if add_s is not None else 0.0
            later[s].append((op, (True, gpu_s + add, tail_s, host_s, first_s, end[op][s], grad_row, deps, chunked)))
            table[op].append((True, gpu_s, tail_s, fresh_host_s, fresh_first_s, end[op][s], grad_row, deps,
                              (later[s], split_mb, n)))
    return table


def _message_table(schedule: Schedule, costs: list[StageCost], profile: Profile,
                   rules: dict[str, list[tuple[tuple[str, int], ...]]], end: dict[str, list[Row]],
                   chans: dict[tuple[int, int], _Channel], off: int) -> dict[str, list[Entry | None]]:
    """send or receive op -> per stage, the walk's entry for its messages: (False, the send's row of first issues,
    the send's row, the receive's row, the channel, the message's seconds, the rows this end waits for, this end's
    count of the channel's messages issued so far, the send's row of first issuers' stream ends: _walk_built's,
    which keeps a first issue's host clock in the row of first issues); None where a stage has no such message."""
    owner, last = schedule.stage_to_rank, schedule.num_stages - 1
    first = {op: [[None] * schedule.num_microbatches for _ in range(last + 1)] for op in PAIRED_RECV}
    table: dict[str, list[Entry | None]] = {op: [None] * (last + 1) for op in COMM_OPS}
    for send, (recv, step) in PAIRED_RECV.items():
        for s in range(last + 1):
            r = s + step
            if not 0 <= r <= last or owner[s] == owner[r]:
                continue
            src, dst = owner[s], owner[r]
            _, spec, _ = link_for(profile, src + off, dst + off)
            seconds = spec.time_s(message_bytes(Action(send, s, 0), costs))
            channel = chans[src, dst]
            common = (False, first[send][s], end[send][s], end[recv][r], channel, seconds)
            readies = [None] * schedule.num_microbatches
            table[send][s] = common + (tuple(end[k][t] for k, t in rules[send][s]), channel.sent, readies)
            table[recv][r] = common + (tuple(end[k][t] for k, t in rules[recv][r]), channel.received, readies)
    return table


def _walk(acts: Iterator[Action], table: dict[str, dict[int, Entry | None]], end: dict[str, list[Row]],
          more: dict[Action, list[Action]] | None, p2p_s: float, on_compute_stream: bool, me: int,
          work: list[int], channels: list[_Channel], host: _Host,
          extras: dict[Action, float] | None = None, slower: Mapping[Action, float] | None = None,
          early: dict[Action, Rebuilt] | None = None) -> Iterator[None]:
    """One rank's program in order: its host's clock, its compute ops settled, its messages issued (and settled
    where this host is the second to issue them). Yields while an op waits for one not settled, its tag left
    in that op's slot; `work` gets the tags of what a settled op wakes. Hot: once per action, so what few actions
    need (`slower`, `extras`, `more`, `early`: the actions in `odd`) is looked up for those only. An `early`
    backward's forward run again is settled first, as lowering's op of its own: after its stream and its forward."""
    t, free, busy = host.t, 0.0, 0.0  # the host starts after its runtime's bookkeeping (begin_s)
    odd = {*(slower or ()), *(extras or ()), *(more or ()), *(early or ())} or None
    spans, posted = host.spans, host.posted
    for a in acts:
        kind, s, i = a
        entry: Entry = table[kind][s]  # type: ignore[assignment]  # None (not this rank's stage) stops the walk
        if entry[0]:
            _, gpu_s, tail_s, host_s, first_s, row, grad_row, deps, special = entry
            if special is not None and special[0] is not None:  # a stage's first gradient action: later ones add
                for op, entry in special[0]:
                    table[op][s] = entry
            ready = free
            if odd is not None and a in odd:
                if early is not None and a in early:  # its forward run again, before it waits for its gradient
                    gpu_r, tail_r, host_r, first_r = early[a]
                    dep = deps[0]  # its forward's row (dataflow.stage_waits: a backward's first wait)
                    e = dep[i]
                    while e.__class__ is not float:
                        if e is None:
                            dep[i] = [me]
                        else:
                            e.append(me)
                        yield
                        e = dep[i]
                    if e > ready:
                        ready = e
                    if t + first_r > ready:
                        ready = t + first_r
                    e = ready + gpu_r
                    last_issue = t + host_r
                    if last_issue + tail_r > e:
                        e = last_issue + tail_r
                    busy += e - ready
                    free = e
                    t = last_issue
                    if spans is not None:
                        spans.append((a, ready, e))
                    ready = free
                if slower:  # lengthened as lowering lengthens it, after its gradient add
                    gpu_s += slower.get(a, 0.0)
                if extras and a in extras:  # lowering's action_extras, as lowering adds them
                    host_s, first_s = host_s + extras[a], first_s + extras[a]
                if more is not None and a in more:
                    for k, ks, ki in more[a]:
                        dep = end[k][ks]
                        e = dep[ki]
                        while e.__class__ is not float:
                            if e is None:
                                dep[ki] = [me]
                            else:
                                e.append(me)
                            yield
                            e = dep[ki]
                        if e > ready:
                            ready = e
            for dep in deps:
                e = dep[i]
                while e.__class__ is not float:
                    if e is None:
                        dep[i] = [me]
                    else:
                        e.append(me)
                    yield
                    e = dep[i]
                if e > ready:
                    ready = e
            if special is not None and i == special[1]:  # a stage's last gradient action: one chunk per bucket
                t, free, busy, e = _chunks(t, busy, ready, gpu_s, tail_s, host_s, first_s, special[2],
                                           host.chunk_ends.setdefault(s, []), spans, a)
            else:
                if t + first_s > ready:
                    ready = t + first_s
                e = ready + gpu_s
                last_issue = t + host_s
                if last_issue + tail_s > e:
                    e = last_issue + tail_s
                busy += e - ready
                free = e
                t = last_issue
                if spans is not None:
                    spans.append((a, ready, e))
            waiters = row[i]
            row[i] = e
            if waiters is not None:
                work.extend(waiters)
            if grad_row is not None:
                waiters = grad_row[i]
                grad_row[i] = e
                if waiters is not None:
                    work.extend(waiters)
            continue
        _, first, send_row, recv_row, channel, seconds, deps, issued, _ = entry
        if odd is not None and a in odd and extras:
            t += p2p_s + extras.get(a, 0.0)
        else:
            t += p2p_s
        avail = t
        if posted is not None:
            posted[a] = avail
        ready = free if on_compute_stream else 0.0  # on the compute stream: after every compute issued before it
        place = issued[0]  # its place on the channel, at this end: both ends must agree (NCCL matches in order)
        issued[0] = place + 1
        waits = None
        for dep in deps:
            e = dep[i]
            if e.__class__ is not float:
                waits = [(dep, i)] if waits is None else waits + [(dep, i)]
            elif e > ready:
                ready = e
        if more is not None and a in more:
            for k, ks, ki in more[a]:
                dep = end[k][ks]
                if ki == i and (dep is send_row or dep is recv_row):
                    continue  # the message itself
                e = dep[ki]
                if e.__class__ is not float:
                    waits = [(dep, ki)] if waits is None else waits + [(dep, ki)]
                elif e > ready:
                    ready = e
        other = first[i]
        if other is None:  # the first of its two hosts to issue it
            first[i] = (avail, ready, waits, place)
            continue
        avail0, ready0, waits0, place0 = other
        if place0 != place:
            raise _OutOfOrder  # validate names the channel
        if avail0 > avail:
            avail = avail0
        if ready0 > ready:
            ready = ready0
        if waits0 is not None:
            waits = waits0 if waits is None else waits0 + waits
        if waits is None and not channel.queue:  # nothing to wait for: settled here (the common case)
            if channel.free > ready:
                ready = channel.free
            if avail > ready:
                ready = avail
            e = ready + seconds
            if avail > e:  # last issue plus a tail of 0, as the machine has it
                e = avail
            channel.free = e
            waiters = send_row[i]
            send_row[i] = e
            if waiters is not None:
                work.extend(waiters)
            waiters = recv_row[i]
            recv_row[i] = e
            if waiters is not None:
                work.extend(waiters)
            continue
        channel.queue.append([avail, ready, waits, seconds, send_row, recv_row, i])
        _drain(channel, work)
    host.t, host.busy, host.free = t, busy, free
    host.track_ends.append(free)


def _walk_plain(acts: Iterator[Action], table: dict[str, dict[int, Entry | None]], p2p_s: float,
                on_compute_stream: bool, me: int, work: list[int], host: _Host) -> Iterator[None]:
    """_walk where no action is odd (no slowdowns, extras or comm waits) and nothing is observed: the same
    arithmetic on the same numbers in the same order, with fewer checks per action (the hot loop of a large step)."""
    t, free, busy = host.t, 0.0, 0.0
    extend, flt = work.extend, float
    for a in acts:
        kind, s, i = a
        entry: Entry = table[kind][s]  # type: ignore[assignment]  # None (not this rank's stage) stops the walk
        if entry[0]:
            _, gpu_s, tail_s, host_s, first_s, row, grad_row, deps, special = entry
            ready = free
            for dep in deps:
                e = dep[i]
                while e.__class__ is not flt:
                    if e is None:
                        dep[i] = [me]
                    else:
                        e.append(me)
                    yield
                    e = dep[i]
                if e > ready:
                    ready = e
            if special is not None:
                if special[0] is not None:  # a stage's first gradient action: later ones add
                    for op, later in special[0]:
                        table[op][s] = later
                if i == special[1]:  # a stage's last gradient action: one chunk per bucket
                    t, free, busy, e = _chunks(t, busy, ready, gpu_s, tail_s, host_s, first_s, special[2],
                                               host.chunk_ends.setdefault(s, []))
                    special = True
                else:
                    special = None
            if special is None:
                if t + first_s > ready:
                    ready = t + first_s
                e = ready + gpu_s
                t += host_s
                if t + tail_s > e:
                    e = t + tail_s
                busy += e - ready
                free = e
            waiters = row[i]
            row[i] = e
            if waiters is not None:
                extend(waiters)
            if grad_row is not None:
                waiters = grad_row[i]
                grad_row[i] = e
                if waiters is not None:
                    extend(waiters)
            continue
        _, first, send_row, recv_row, channel, seconds, deps, issued, _ = entry
        t += p2p_s
        ready = free if on_compute_stream else 0.0
        place = issued[0]
        issued[0] = place + 1
        waits = None
        for dep in deps:
            e = dep[i]
            if e.__class__ is not flt:
                waits = [(dep, i)] if waits is None else waits + [(dep, i)]
            elif e > ready:
                ready = e
        other = first[i]
        if other is None:
            first[i] = (t, ready, waits, place)
            continue
        avail0, ready0, waits0, place0 = other
        if place0 != place:
            raise _OutOfOrder
        avail = avail0 if avail0 > t else t
        if ready0 > ready:
            ready = ready0
        if waits0 is not None:
            waits = waits0 if waits is None else waits0 + waits
        if waits is None and not channel.queue:
            if channel.free > ready:
                ready = channel.free
            if avail > ready:
                ready = avail
            e = ready + seconds
            if avail > e:
                e = avail
            channel.free = e
            waiters = send_row[i]
            send_row[i] = e
            if waiters is not None:
                extend(waiters)
            waiters = recv_row[i]
            recv_row[i] = e
            if waiters is not None:
                extend(waiters)
            continue
        channel.queue.append([avail, ready, waits, seconds, send_row, recv_row, i])
        _drain(channel, work)
    host.t, host.busy, host.free = t, busy, free
    host.track_ends.append(free)


def _rank_blocks(views: list[dict[str, dict[int, Entry | None]]]) -> list[Blocks] | None:
    """_built_blocks of every rank, or None where some rank is not in blocks: every rank of a step is walked in
    blocks or none is (_walk_built keeps a message's first issue its own way)."""
    blocks = []
    for view in views:
        rank = _built_blocks(view)
        if rank is None:
            return None
        blocks.append(rank)
    return blocks


def _built_blocks(table: dict[str, dict[int, Entry | None]]) -> Blocks | None:
    """A rank's program under a schedule valid as built, as blocks: its one stage, the block length (a compute with
    the receive before it and the send after it, where its neighbour is on another rank; alike for forwards and
    backwards) and, by a block's first op, its (receive or None, computes' entries, send or None), each message as
    _walked_fields has it; None where the rank does not have one stage or its blocks differ in length."""
    if len(table[Op.FORWARD]) != 1:
        return None
    (s,) = table[Op.FORWARD]
    recv_f, send_f = table[Op.RECV_F].get(s), table[Op.SEND_F].get(s)
    recv_b, send_b = table[Op.RECV_B].get(s), table[Op.SEND_B].get(s)
    if (recv_f is None) != (send_b is None) or (send_f is None) != (recv_b is None):
        return None
    forwards, backwards = table[Op.FORWARD], table[Op.BACKWARD]
    recv_f, send_f, recv_b, send_b = map(_walked_fields, (recv_f, send_f, recv_b, send_b))
    heads: dict[str, tuple[Any, ...]] = {Op.FORWARD: (None, forwards, send_f), Op.BACKWARD: (None, backwards, send_b)}
    if recv_f is not None:
        heads[Op.RECV_F] = (recv_f, forwards, send_f)
    if recv_b is not None:
        heads[Op.RECV_B] = (recv_b, backwards, send_b)
    return s, 1 + (recv_f is not None) + (send_f is not None), heads


def _walked_fields(entry: Entry | None) -> tuple[Any, ...] | None:
    """A message's entry (_message_table) as _walk_built reads it: the send's row of first issues, the send's row,
    the receive's row, the channel, the message's seconds and the row of first issuers' stream ends."""
    return None if entry is None else (entry[1], entry[2], entry[3], entry[4], entry[5], entry[8])


def _walk_built(acts: Iterator[Action], table: dict[str, dict[int, Entry | None]],
                blocks: Blocks, p2p_s: float, me: int, work: list[int], host: _Host) -> Iterator[None]:
    """_walk_plain for a schedule valid as built (parsim.schedules.valid_as_built) on the compute stream, a block
    (receive, compute, send: _built_blocks) at a time: each message is in its channel's order at both ends, and
    sent right after the compute it sends, whose end is then its stream's (the send's own wait, a no-op in the
    max); the same arithmetic on the same numbers, in order. Every rank of the step is walked so or none: a
    message's first issue is kept as a host clock and a stream end, in two rows (the other walks keep a tuple)."""
    s, length, heads = blocks
    t, free, busy = host.t, 0.0, 0.0
    extend, flt = work.extend, float
    if length_hint(acts) % length:  # `acts` is a program's iterator, which knows what is left of it
        raise ValueError("the program is not in whole blocks")
    for kind, _, i in islice(acts, 0, None, length):  # each block's first action names it (the rest are as built)
        recv, computes, send = heads[kind]
        if recv is not None:  # the receive: issued; settled here where the sender issued it first
            first, send_row, recv_row, channel, seconds, readies = recv
            t += p2p_s
            avail = first[i]
            if avail is None:
                first[i], readies[i] = t, free
            else:
                ready = readies[i]
                if t > avail:
                    avail = t
                if free > ready:
                    ready = free
                if channel.free > ready:
                    ready = channel.free
                if avail > ready:
                    ready = avail
                e = ready + seconds
                if avail > e:
                    e = avail
                channel.free = e
                waiters = send_row[i]
                send_row[i] = e
                if waiters is not None:
                    extend(waiters)
                waiters = recv_row[i]
                recv_row[i] = e
                if waiters is not None:
                    extend(waiters)
        _, gpu_s, tail_s, host_s, first_s, row, grad_row, deps, special = computes[s]
        ready = free
        for dep in deps:
            e = dep[i]
            while e.__class__ is not flt:
                if e is None:
                    dep[i] = [me]
                else:
                    e.append(me)
                yield
                e = dep[i]
            if e > ready:
                ready = e
        if special is not None:
            if special[0] is not None:  # a stage's first gradient action: later ones add
                for op, later in special[0]:
                    table[op][s] = later
            if i == special[1]:  # a stage's last gradient action: one chunk per bucket
                t, free, busy, e = _chunks(t, busy, ready, gpu_s, tail_s, host_s, first_s, special[2],
                                           host.chunk_ends.setdefault(s, []))
                special = True
            else:
                special = None
        if special is None:
            if t + first_s > ready:
                ready = t + first_s
            e = ready + gpu_s
            t += host_s
            if t + tail_s > e:
                e = t + tail_s
            busy += e - ready
            free = e
        waiters = row[i]
        row[i] = e
        if waiters is not None:
            extend(waiters)
        if grad_row is not None:
            waiters = grad_row[i]
            grad_row[i] = e
            if waiters is not None:
                extend(waiters)
        if send is not None:  # the send: as the receive, its stream's end being the compute's
            first, send_row, recv_row, channel, seconds, readies = send
            t += p2p_s
            avail = first[i]
            if avail is None:
                first[i], readies[i] = t, free
            else:
                ready = readies[i]
                if t > avail:
                    avail = t
                if free > ready:
                    ready = free
                if channel.free > ready:
                    ready = channel.free
                if avail > ready:
                    ready = avail
                e = ready + seconds
                if avail > e:
                    e = avail
                channel.free = e
                waiters = send_row[i]
                send_row[i] = e
                if waiters is not None:
                    extend(waiters)
                waiters = recv_row[i]
                recv_row[i] = e
                if waiters is not None:
                    extend(waiters)
    host.t, host.busy, host.free = t, busy, free
    host.track_ends.append(free)


def _chunks(t: float, busy: float, ready: float, gpu_s: float, tail_s: float, host_s: float, first_s: float,
            n: int, ends: list[float], spans: list[Span] | None = None, action: Action | None = None,
            ) -> tuple[float, float, float, float]:
    """An action split into n equal chunks, launched one after another; `ready` is the latest of its stream's
    last end and its dependencies. Returns the host's clock, the stream's end, the busy time, the last chunk's end;
    each chunk's (action, start, end) in `spans` where given."""
    gpu_c, tail_c, host_c = gpu_s / n, tail_s / n, host_s / n
    first_c = min(first_s, host_c)
    e = free = ready
    for k in range(n):
        ready = free if k else ready
        if t + first_c > ready:
            ready = t + first_c
        e = ready + gpu_c
        last_issue = t + host_c
        if last_issue + tail_c > e:
            e = last_issue + tail_c
        busy += e - ready
        free = e
        ends.append(e)
        if spans is not None:
            spans.append((action, ready, e))
        t += host_c
    return t, free, busy, e


def _drain(channel: _Channel, work: list[int]) -> None:
    """Settle a channel's queued messages in order, stopping at one that waits for an op not settled (its tag left
    there)."""
    queue = channel.queue
    while queue:
        avail, ready, waits, seconds, send_row, recv_row, i = queue[0]
        if waits is not None:
            for k, (row, j) in enumerate(waits):
                e = row[j]
                if e.__class__ is not float:
                    if e is None:
                        row[j] = [channel.tag]
                    elif channel.tag not in e:
                        e.append(channel.tag)
                    queue[0][1:3] = ready, waits[k:]
                    return
                if e > ready:
                    ready = e
        if channel.free > ready:
            ready = channel.free
        if avail > ready:
            ready = avail
        e = ready + seconds
        if avail > e:
            e = avail
        channel.free = e
        for r in (send_row, recv_row):
            waiters = r[i]
            r[i] = e
            if waiters is not None:
                work.extend(waiters)
        queue.pop(0)


def _all_reduce(schedule: Schedule, costs: list[StageCost], profile: Profile, hosts: list[_Host],
                data_parallel: int) -> None:
    """Each stage's bucketed all-reduce, launched by every replica's host after its program (as
    parsim.sim.grad_allreduce adds it): one stream per group of GPUs, each bucket after its chunk on every replica.
    `hosts`: those walked (every replica's, or the first's where it stands for all: then the group's are alike)."""
    if data_parallel < 2:
        return
    pp, p2p_s = schedule.num_ranks, profile.host.p2p_s
    free: dict[tuple[int, ...], float] = {}
    specs: dict[int, CollectiveSpec] = {}  # per rank: its group's (a rank's stages share one group)
    for stage in reversed(range(schedule.num_stages)):
        rank = schedule.stage_to_rank[stage]
        group = tuple(range(rank, len(hosts), pp))  # rank `rank` of each walked replica
        chunk_ends = [hosts[g].chunk_ends[stage] for g in group]
        n = len(chunk_ends[0])
        if rank not in specs:
            specs[rank] = allreduce_spec(profile, range(rank, pp * data_parallel, pp))
        spec = specs[rank]
        seconds = spec.allreduce_s(costs[stage].grad_bytes / n, data_parallel)
        for k in range(n):
            avail = 0.0
            for g, ends in zip(group, chunk_ends):
                if hosts[g].t + p2p_s > avail:
                    avail = hosts[g].t + p2p_s
                hosts[g].t += p2p_s
                if spec.compute_share:  # its share of the compute, after what that stream has queued
                    h = hosts[g]
                    start = max(h.free, h.t, ends[k])
                    h.free = start + spec.compute_share * seconds
                    h.busy += h.free - start  # as the machine counts it: end less start
                    if h.spans is not None:  # as the machine labels it
                        h.spans.append((f"allreduce s{stage} bucket {k + 1}/{n}'s share", start, h.free))
            ready = free.get(group, 0.0)
            if avail > ready:
                ready = avail
            for ends in chunk_ends:
                if ends[k] > ready:
                    ready = ends[k]
            e = ready + seconds
            if avail > e:
                e = avail
            free[group] = e
    for group, e in free.items():
        for g in group:
            hosts[g].track_ends += (e, hosts[g].free)  # the all-reduces' stream; compute with their shares
