"""Lowers a pipeline schedule onto the machine model: host programs, GPU ops, messages on links; and what each action
costs, which the longest-path walk reads too (without the machine model, which loads where a step is lowered)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING

from parsim.profile import LinkSpec, Profile
from parsim.schedules import ALL_OPS, COMPUTE_OPS, Action, CommPlan, Schedule
from parsim.schedules import Op as ActionOp
from parsim.sim.dataflow import iter_wait_keys, kept, transfers
from parsim.workload import StageCost, Work, gradient_adds
from parsim.workload.layers import KINDS
from parsim.workload.recompute import (
    RECOMPUTING_OPS,
    core_recomputing_actions,
    early_recomputing_actions,
    recomputes,
    recomputes_cores,
    recomputing_actions,
)

if TYPE_CHECKING:
    from parsim.sim.machine import Machine, Task

GRADIENT_OPS = frozenset({ActionOp.BACKWARD, ActionOp.BACKWARD_WEIGHT})  # those that make weight gradients
BACKWARD_OPS = frozenset({ActionOp.BACKWARD, ActionOp.BACKWARD_INPUT, ActionOp.BACKWARD_WEIGHT})


def compute_track(rank: int) -> str:
    return f"gpu{rank} compute"


def link_for(profile: Profile, src: int, dst: int) -> tuple[str, LinkSpec, bool]:
    """The link a message from GPU src to GPU dst crosses: (resource name, spec, shared?).

    GPUs of one node (profile.gpus_per_node of them) talk over their own NVLink pair;
    GPUs of different nodes share their nodes' network link.
    """
    n = profile.gpus_per_node
    if src // n == dst // n:
        return f"nvlink {src}->{dst}", profile.links["nvlink"], False
    return f"network node{src // n}->node{dst // n}", profile.links["network"], True


def _work_of(action: Action, cost: StageCost) -> Work:
    return {
        ActionOp.FORWARD: cost.forward,
        ActionOp.BACKWARD: cost.backward,
        ActionOp.BACKWARD_INPUT: cost.backward_input,
        ActionOp.BACKWARD_WEIGHT: cost.backward_weight,
    }[action.op]


def message_bytes(action: Action, costs: list[StageCost]) -> int:
    """A forward message is stage s's output; a backward one, the gradient of stage s's input."""
    return costs[action.stage].send_bytes if action.op == ActionOp.SEND_F else costs[action.stage - 1].send_bytes


@dataclass(frozen=True)
class Chunk:
    """Part k of n of an action's GPU work: where a gradient bucket becomes ready."""

    action: Action
    k: int
    n: int

    def __str__(self) -> str:
        return f"{self.action}[{self.k + 1}/{self.n}]"


@dataclass(frozen=True)
class Rebuild:
    """The forward a recomputing backward runs again before its gradient arrives (under copy streams): its own op on
    the compute stream, just before the backward's."""

    action: Action

    @property
    def microbatch(self) -> int:
        return self.action.microbatch

    def __str__(self) -> str:
        return f"R(s{self.action.stage},m{self.action.microbatch})"


Rebuilt = tuple[float, float, float, float]  # an early recompute's (gpu_s, tail_s, host_s, first_s), as a launch's
OpTable = dict[str, list[list["Task | None"]]]  # table[op][stage][microbatch]: an action's op


def op_table(schedule: Schedule) -> OpTable:
    """An empty table with a slot for every action a valid schedule can hold.

    Actions are looked up by position rather than hashed: lowering looks one up for each
    dependency, and indexing small lists is about twice as fast as a dict of 400k tuples.
    """
    s, m = schedule.num_stages, schedule.num_microbatches
    return {op: [[None] * m for _ in range(s)] for op in ALL_OPS}


@dataclass
class Lowered:
    ops: OpTable  # each action's op (for a split action, its last chunk)
    grad_chunks: dict[int, list[Task]]  # stage -> chunks of its last gradient-producing action


def first_gradient_actions(schedule: Schedule) -> frozenset[Action]:
    """Per stage, the action that makes its first weight gradients of the step (its first B or W): .grad is None
    until then, so it adds nothing in (no gradient add on the GPU, host.grad_add_s less on the host)."""
    first: dict[int, Action] = {}
    for acts in schedule.actions:
        for a in acts:
            if a.op in GRADIENT_OPS:
                first.setdefault(a.stage, a)
    return frozenset(first.values())


def last_gradient_actions(schedule: Schedule) -> dict[int, Action]:
    """Per stage, the action after which its weight gradients are complete (its last B or W)."""
    last = {}
    for acts in schedule.actions:
        for a in acts:
            if a.op in (ActionOp.BACKWARD, ActionOp.BACKWARD_WEIGHT):
                last[a.stage] = a
    return last


def lower(machine: Machine, schedule: Schedule, costs: list[StageCost], profile: Profile,
          copy_streams: bool = False, gpu_offset: int = 0, grad_buckets: dict[int, int] | None = None,
          slower: Mapping[Action, float] | None = None, recompute: str = "never") -> Lowered:
    """Build one training step of a validated `schedule` on GPUs gpu_offset.. of `machine`.

    A compute action is one op on its GPU's compute stream, its kernels launched layer by
    layer; a send and its receive are one message op on the channel src->dst, issued by both
    hosts. With grad_buckets (stage -> n), a stage's last gradient-producing action is split
    into n equal chunks, one per gradient bucket, as DDP's hooks see them. `slower` (action -> seconds) lengthens
    compute actions (parsim.sim.sharing), as does `recompute` (parsim.workload.recompute). No host syncs yet:
    `finish_step` adds them once every op is in place.
    """
    launches = compute_launches(costs, profile)
    ops = op_table(schedule)
    add_s = gradient_adds(profile, costs)
    firsts = first_gradient_actions(schedule)
    extras = action_extras(schedule, costs, profile, recompute, copy_streams)
    slower = lengthened(slower, extras.gpu)
    rebuilds = rebuild_ops(machine, extras.early, gpu_offset, schedule.stage_to_rank)
    parts_of = _compute_ops(machine, schedule, launches, gpu_offset, grad_buckets, ops, firsts, add_s, slower,
                            rebuilds)
    _message_ops(machine, schedule, costs, profile, gpu_offset, ops)
    _host_programs(machine, schedule, launches, profile.host.p2p_s, copy_streams, gpu_offset, ops, parts_of, firsts,
                   extras.host, extras.early, rebuilds)
    return Lowered(ops, {a.stage: parts for a, parts in parts_of.items()})


def _compute_ops(machine: Machine, schedule: Schedule, launches: dict[str, list[tuple[float, ...]]],
                 gpu_offset: int, grad_buckets: dict[int, int] | None, ops: OpTable, firsts: frozenset[Action],
                 add_s: list[float] | None = None, slower: Mapping[Action, float] | None = None,
                 rebuilds: dict[Action, Task] | None = None) -> dict[Action, list[Task]]:
    """Put each compute action's op on its GPU's compute stream, in program order, and in `ops` (a backward's
    `rebuilds` op just before its own); return the split actions' chunks (action -> ops; `ops` holds the last
    chunk). With add_s (per stage), each gradient action but its stage's first (`firsts`) also adds its gradients
    into the step's."""
    from parsim.sim.machine import Task

    parts_of: dict[Action, list[Task]] = {}
    split = {a: grad_buckets.get(a.stage, 1) for a in last_gradient_actions(schedule).values()} if grad_buckets else {}
    env = machine.env
    for rank, acts in enumerate(schedule.actions):
        track = compute_track(gpu_offset + rank)
        stream = machine.stream(track).ops
        for a in acts:
            kind, stage, mb = a  # unpacked, not read by name: this loop runs once per action
            if kind not in COMPUTE_OPS:
                continue
            gpu_s, tail_s, *_ = launches[kind][stage]
            if add_s is not None and kind in GRADIENT_OPS and a not in firsts:
                gpu_s += add_s[stage]
            if slower:
                gpu_s += slower.get(a, 0.0)
            if rebuilds is not None and a in rebuilds:
                stream.append(rebuilds[a])
            if not split or a not in split:
                op = ops[kind][stage][mb] = Task(env, a, track, gpu_s, tail_s=tail_s)
                stream.append(op)
                continue
            n = split[a]
            parts = [Task(env, Chunk(a, k, n) if n > 1 else a, track, gpu_s / n, tail_s=tail_s / n) for k in range(n)]
            stream += parts
            parts_of[a] = parts
            ops[kind][stage][mb] = parts[-1]  # consumers wait for the whole action
    return parts_of


def _message_ops(machine: Machine, schedule: Schedule, costs: list[StageCost], profile: Profile,
                 gpu_offset: int, ops: OpTable) -> None:
    """Put each message's op on its channel's stream, in the sender's order; in `ops`, its send
    and its receive map to it."""
    from parsim.sim.machine import Task

    env = machine.env
    for (src, dst), msgs in transfers(schedule).items():
        src, dst = src + gpu_offset, dst + gpu_offset
        name, spec, shared = link_for(profile, src, dst)
        resources = (machine.resource(name),) if shared else ()
        track = f"link {src}->{dst}"
        stream = machine.stream(track).ops
        # (op, stage) -> seconds: every micro-batch's message is the same size
        seconds_of: dict[tuple[str, int], float] = {}
        for t in msgs:
            send, recv = t[0], t[1]  # t.send, t.recv, read by index: this loop runs once per message
            key = send[0], send[1]
            seconds = seconds_of.get(key)
            if seconds is None:
                seconds = seconds_of[key] = spec.time_s(message_bytes(send, costs))
            op = Task(env, t, track, seconds, category="comm", issuers=2, resources=resources)
            stream.append(op)
            ops[send[0]][send[1]][send[2]] = ops[recv[0]][recv[1]][recv[2]] = op


def _host_programs(machine: Machine, schedule: Schedule, launches: dict[str, list[tuple[float, ...]]],
                   p2p_s: float, copy_streams: bool, gpu_offset: int, ops: OpTable,
                   parts_of: dict[Action, list[Task]], firsts: frozenset[Action],
                   extras: dict[Action, float] | None = None, early: dict[Action, Rebuilt] | None = None,
                   rebuilds: dict[Action, Task] | None = None) -> None:
    """Each rank's host program (a launch per op, in program order; `firsts` at their fresh host costs, `extras`
    beside; a backward's `rebuilds` op launched first, at its `early` costs), and each op's dependencies: what its
    action waits for (dataflow's rules); a split action's first chunk waits for them; a rebuild, for its forward."""
    from parsim.sim.machine import Launch

    waits = iter_wait_keys(schedule, copy_streams)  # rank by rank, in program order
    more = comm_waits(schedule)
    new_tuple = tuple.__new__  # Launch(...) without the Python-level constructor: 400k of them
    # every action of a validated schedule has its op: no None is read here
    ops_of: dict[str, list[list[Task]]] = ops  # type: ignore[assignment]
    for rank, acts in enumerate(schedule.actions):
        append = machine.host(f"host{gpu_offset + rank}").steps.append
        for a, deps in islice(waits, len(acts)):  # this rank's actions; the body runs once per action
            if more is not None and a in more:
                deps = [*deps, *more[a]]
            kind, stage, mb = a
            op = ops_of[kind][stage][mb]
            parts = parts_of.get(a) if parts_of else None
            waiter = parts[0] if parts else op
            waiter_deps = waiter.deps
            for d_kind, d_stage, d_mb in deps:  # a message op gathers its send's and its receive's
                dep = ops_of[d_kind][d_stage][d_mb]
                if dep is not waiter and dep not in waiter_deps:
                    waiter_deps.append(dep)
            extra = extras.get(a, 0.0) if extras else 0.0
            if rebuilds is not None and early is not None and a in rebuilds:
                rebuild = rebuilds[a]
                rebuild.deps.append(ops_of[ActionOp.FORWARD][stage][mb])
                _, _, host_r, first_r = early[a]
                append(new_tuple(Launch, (rebuild, host_r, first_r)))
            if kind not in COMPUTE_OPS:
                append(new_tuple(Launch, (op, p2p_s + extra, p2p_s + extra)))
                continue
            _, _, host_s, first_s, fresh_host_s, fresh_first_s = launches[kind][stage]
            if kind in GRADIENT_OPS and a in firsts:
                host_s, first_s = fresh_host_s, fresh_first_s
            host_s, first_s = host_s + extra, first_s + extra
            if parts is None:
                append(new_tuple(Launch, (op, host_s, first_s)))
                continue
            n = len(parts)
            for part in parts:
                append(new_tuple(Launch, (part, host_s / n, min(first_s, host_s / n))))


@dataclass(frozen=True)
class Extras:
    """Seconds some actions pay beyond their stage's costs (action -> seconds; None where none do), which both
    engines add as they are: on the GPU before the action's op is split, on the host before its first launch; and
    the backwards whose forward runs again as an op of its own before them (`early`; None where none does)."""

    gpu: dict[Action, float] | None
    host: dict[Action, float] | None
    early: dict[Action, Rebuilt] | None = None


def action_extras(schedule: Schedule, costs: list[StageCost], profile: Profile, recompute: str = "never",
                  copy_streams: bool = False) -> Extras:
    """host_extras, and each recomputing backward's forward run again (parsim.workload.recompute): its stage's
    forward on the GPU (selective: its attention cores'); on the host, the forward's launches (not a second
    action's cost) and, where calibrated, checkpointing's own cost: host.recompute_call_s per checkpoint, and its
    hooks per tensor the forward saves, at what host.recompute_s, timed on MLP blocks, costs beyond an MLP block's
    forward launches over an MLP block's saved tensors (selective: each core its own checkpoint). Under copy
    streams, a backward whose gradient arrives by a message runs that forward first, as its own op that waits for
    its forward but not for the gradient (`early`): its stage's forward on the GPU, and on the host that forward's
    launches, layer by layer (hw runs it as a plain forward, no checkpoint and none of its hooks)."""
    host = host_extras(schedule, profile) or {}
    redo = []  # (action, the work run again, checkpoints, tensors their forwards save)
    for a in recomputing_actions(schedule, recompute):
        c = costs[a.stage]
        redo.append((a, c.forward, 1, saved_or_mlp(c.saved_tensors, c.layers)))
    for a in core_recomputing_actions(schedule, recompute):
        c = costs[a.stage]
        if c.core_forward.chunks:  # a stage without a core recomputes nothing
            cores = c.core_forward.chunks
            redo.append((a, c.core_forward, cores, saved_or_mlp(c.core_saved_tensors, cores)))
    call_s = profile.host.recompute_call_s
    per_tensor = max(profile.host.recompute_s - probe_forward_host_s(profile), 0.0) / KINDS["mlp"].saved
    first = frozenset(early_recomputing_actions(schedule, recompute, copy_streams))
    early: dict[Action, Rebuilt] = {}
    for a, again, calls, tensors in redo:
        if a in first:
            chunks = max(again.chunks, 1)
            early[a] = (again.gpu_s, again.gpu_s / chunks, again.host_s, again.host_s / chunks)
            continue
        host[a] = host.get(a, 0.0) + again.host_s + calls * call_s + tensors * per_tensor
    gpu = {a: again.gpu_s for a, again, _, _ in redo if a not in first}
    return Extras(gpu or None, host or None, early or None)


def rebuild_ops(machine: Machine, early: dict[Action, Rebuilt] | None, gpu_offset: int,
                stage_to_rank: tuple[int, ...]) -> dict[Action, Task] | None:
    """The op of each early recompute (action_extras' `early`), on its backward's compute stream; its place in the
    stream and its launch are _compute_ops' and _host_programs'."""
    if not early:
        return None
    from parsim.sim.machine import Task

    return {a: Task(machine.env, Rebuild(a), compute_track(gpu_offset + stage_to_rank[a.stage]), gpu_s, tail_s=tail_s)
            for a, (gpu_s, tail_s, _, _) in early.items()}


def saved_or_mlp(saved: int | None, layers: int) -> int:
    """Tensors saved, or where unknown each layer's as an MLP block's (the blocks host.recompute_s was timed on)."""
    return layers * KINDS["mlp"].saved if saved is None else saved


def probe_forward_host_s(profile: Profile) -> float:
    """An MLP block's forward launches: part of host.recompute_s, which calibrate times on MLP blocks
    (hw.calibrate.host_steps); 0 where the profile prices no MLP block or recompute_s is uncalibrated."""
    mlp = profile.layers.get("mlp")
    return mlp.forward.host_s if mlp is not None and profile.host.recompute_s > 0 else 0.0


def lengthened(slower: Mapping[Action, float] | None, gpu: dict[Action, float] | None,
               ) -> Mapping[Action, float] | None:
    """`slower` (parsim.sim.sharing's) with action_extras' GPU seconds added, one sum per action, as both engines
    lengthen a compute by one number."""
    if not gpu:
        return slower
    slower = slower or {}
    return {a: gpu.get(a, 0.0) + slower.get(a, 0.0) for a in {*gpu, *slower}}


def host_extras(schedule: Schedule, profile: Profile) -> dict[Action, float] | None:
    """Host seconds some actions pay beyond their own costs, by where they sit in their rank's program: a forward
    right after a backward (host.after_backward_s), the first message of each batch posted together (host.batch_s).
    None where there are none."""
    after, batch = profile.host.after_backward_s, profile.host.batch_s
    extras: dict[Action, float] = dict.fromkeys(forwards_after_backward(schedule), after) if after > 0 else {}
    if batch > 0 and schedule.comm is not None:
        for batches in schedule.comm.batches:
            for posted in batches:
                if posted:
                    extras[posted[0]] = extras.get(posted[0], 0.0) + batch
    return extras or None


def forwards_after_backward(schedule: Schedule) -> list[Action]:
    """The forwards that come right after a backward (B, I or W) among their rank's computes."""
    found = []
    for acts in schedule.actions:
        previous = None
        for a in acts:
            if a.op in COMPUTE_OPS:
                if a.op == ActionOp.FORWARD and previous in BACKWARD_OPS:
                    found.append(a)
                previous = a.op
    return found


def runtime_waits(comm: CommPlan) -> dict[Action, list[Action]]:
    """What each action waits for under its runtime's comm plan, beyond its data and its stream: a compute,
    the messages its stream is made to wait for; a send or receive, every message of the batch its rank
    posted before it (one communication stream per rank runs its batches in order)."""
    more: dict[Action, list[Action]] = {a: list(msgs) for a, msgs in comm.waits.items()}
    for batches in comm.batches:
        for before, batch in zip(batches, batches[1:]):
            for a in batch:
                more.setdefault(a, []).extend(before)
    return more


def comm_waits(schedule: Schedule) -> dict[Action, list[Action]] | None:
    """runtime_waits of the schedule's comm plan (None without one), kept on the schedule: read by every settlement."""
    if schedule.comm is None:
        return None
    comm = schedule.comm
    return kept(schedule, "_comm_waits", lambda _: runtime_waits(comm))


def finish_step(machine: Machine, step_s: float = 0.0, begin_s: float = 0.0) -> None:
    """Each host spends begin_s on its runtime's per-step bookkeeping before its first launch and step_s after its
    last, then synchronises once at the end of the step, on everything it launched.

    A stream ends its ops in order, so waiting for the last one launched on each stream is the same.
    """
    from parsim.sim.machine import Launch, Sync

    for host in machine.hosts:
        if begin_s > 0:
            host.steps.insert(0, Launch(machine.op(f"{host.name} bookkeeping", "begin", 0.0), begin_s, begin_s))
        if step_s > 0:
            host.steps.append(Launch(machine.op(f"{host.name} bookkeeping", "step", 0.0), step_s, step_s))
        last: dict[str, Task] = {}
        for step in host.steps:  # a plain loop, by index: this sees every launch (260k)
            if type(step) is Launch:
                op = step[0]
                last[op.track] = op
        host.steps.append(Sync(tuple(last.values())))


def grad_add_saving_s(profile: Profile, layers: int, host_s: float) -> float:
    """What a stage's first gradient action of a step does not pay on the host (it adds nothing into .grad):
    host.grad_add_s per layer, at most the action's own host cost."""
    return min(profile.host.grad_add_s * layers, host_s)


def compute_launches(costs: list[StageCost], profile: Profile) -> dict[str, list[tuple[float, ...]]]:
    """op -> per stage (gpu_s, tail_s, host_s, first_s, fresh_host_s, fresh_first_s): the host launches a stage's
    layers one by one; a stage's first gradient action of a step pays the fresh pair instead (.grad is None then:
    autograd takes the gradients as they are, where each later action adds them in, host.grad_add_s per layer)."""
    table: dict[str, list[tuple[float, ...]]] = {}
    action_s = profile.host.action_s
    for op in (ActionOp.FORWARD, ActionOp.BACKWARD, ActionOp.BACKWARD_INPUT, ActionOp.BACKWARD_WEIGHT):
        table[op] = []
        for stage, cost in enumerate(costs):
            work = _work_of(Action(op, stage, 0), cost)
            chunks = max(work.chunks, 1)
            host_s = work.host_s + (profile.host.split_backward_s * work.chunks
                                    if op == ActionOp.BACKWARD_WEIGHT else 0.0)
            fresh_s = host_s - grad_add_saving_s(profile, cost.layers, host_s) if op in GRADIENT_OPS else host_s
            table[op].append((work.gpu_s, work.gpu_s / chunks, action_s + host_s, action_s + host_s / chunks,
                              action_s + fresh_s, action_s + fresh_s / chunks))
    return table


def peak_stashed_microbatches(schedule: Schedule) -> list[int]:
    """Per stage, the most micro-batches whose activations are held at once (forward to backward).

    Read from each rank's program order, which is the order its compute stream runs them.
    """
    held = [0] * schedule.num_stages
    peak = [0] * schedule.num_stages
    forward, backward, weight = ActionOp.FORWARD, ActionOp.BACKWARD, ActionOp.BACKWARD_WEIGHT
    for acts in schedule.actions:
        for kind, stage, _ in acts:  # unpacked, not read by name: this sees every action
            if kind == forward:
                n = held[stage] = held[stage] + 1
                if n > peak[stage]:
                    peak[stage] = n
            elif kind == backward or kind == weight:
                held[stage] -= 1
    return peak


def kept_stash_bytes(cost: StageCost, recompute: str = "never") -> int:
    """What a stage's forward keeps for its backward: its stash, less what its attention cores alone keep where
    selective recomputation frees it (parsim.workload.recompute)."""
    return cost.stash_bytes - (cost.core_freed_bytes if recomputes_cores(recompute) else 0)


def peak_held_bytes(schedule: Schedule, stash_bytes: list[int], recompute: str = "never",
                    input_bytes: list[int] | None = None, kept_output_bytes: int = 0) -> list[int]:
    """Per rank, the most activation bytes its stages hold at once, read off its program order; a recomputed
    micro-batch holds its stage's input (`input_bytes`) until its backward rebuilds the stash; each forward of the
    last stage keeps `kept_output_bytes` to the step's end, where they are merged into one more copy (a runtime that
    returns the outputs: torch's).

    A rank with several stages holds less than the sum of their peaks where those do not coincide
    (ZB-V's two stages peak at 2p+1 chunk-micro-batches together, but hold at most 2p at once).
    """
    forward, weight, m = ActionOp.FORWARD, ActionOp.BACKWARD_WEIGHT, schedule.num_microbatches
    inputs = input_bytes or [0] * len(stash_bytes)
    redone = [recomputes(recompute, mb, m) for mb in range(m)]  # by micro-batch
    if not any(redone) and not kept_output_bytes:
        return _peaks_as_built(schedule, stash_bytes) or [_peak_kept(acts, stash_bytes) for acts in schedule.actions]
    last = schedule.num_stages - 1
    peaks = []
    for acts in schedule.actions:
        held = peak = 0
        for kind, stage, mb in acts:  # unpacked, not read by name: this sees every action
            stash = stash_bytes[stage]
            if kind == forward:
                held += (inputs[stage] if redone[mb] else stash) + (kept_output_bytes if stage == last else 0)
            elif redone[mb] and kind in RECOMPUTING_OPS:
                held += stash - inputs[stage]  # rebuilt for the backward
            if held > peak:
                peak = held
            if kind == ActionOp.BACKWARD or kind == weight:
                held -= stash
        kept = kept_output_bytes * sum(kind == forward and stage == last for kind, stage, _ in acts)
        peaks.append(max(peak, held + kept))  # the kept outputs merged into one more copy at the end
    return peaks


def _peaks_as_built(schedule: Schedule, stash_bytes: list[int]) -> list[int] | None:
    """_peak_kept of every rank where its builder noted its peak (parsim.schedules.valid_as_built): that many of its
    one stage's stashes (exact: whole bytes); else None."""
    peaks = schedule.__dict__.get("peaks_as_built")
    if peaks is None or not all(b.__class__ is int and b >= 0 for b in stash_bytes):
        return None
    held = [0] * schedule.num_ranks
    for stage, rank in enumerate(schedule.stage_to_rank):
        held[rank] = stash_bytes[stage] * peaks[rank]
    return held


def _peak_kept(acts: tuple[Action, ...], stash_bytes: list[int]) -> int:
    """peak_held_bytes of one rank's program where nothing is recomputed: only a forward adds, so only it can peak."""
    forward, backward, weight = ActionOp.FORWARD, ActionOp.BACKWARD, ActionOp.BACKWARD_WEIGHT
    held = peak = 0
    for kind, stage, _ in acts:  # unpacked, not read by name: this sees every action
        if kind == forward:
            held += stash_bytes[stage]
            if held > peak:
                peak = held
        elif kind == backward or kind == weight:
            held -= stash_bytes[stage]
    return peak
