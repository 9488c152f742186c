"""Lowers a pipeline schedule onto the machine model: host programs, GPU ops, messages on links."""

from __future__ import annotations

from dataclasses import dataclass

from parsim.dataflow import iter_waits, transfers
from parsim.machine import Launch, Machine, Op, Sync
from parsim.profile import LinkSpec, Profile
from parsim.schedules import COMPUTE_OPS, Action, Op as ActionOp, Schedule
from parsim.workload import StageCost, Work


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


def _message_bytes(action: Action, costs: list[StageCost]) -> int:
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


@dataclass
class Lowered:
    ops: dict[Action, Op]  # each action's op (for a split action, its last chunk)
    grad_chunks: dict[int, list[Op]]  # stage -> chunks of its last gradient-producing action


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
          ) -> Lowered:
    """Build one training step of `schedule` on GPUs gpu_offset.. of `machine`.

    A compute action is one op on its GPU's compute stream, its kernels launched layer by
    layer; a send and its receive are one message op on the channel src->dst, issued by both
    hosts. With grad_buckets (stage -> n), a stage's last gradient-producing action is split
    into n equal chunks, one per gradient bucket, as DDP's hooks see them. No host syncs yet:
    `finish_step` adds them once every op is in place.
    """
    ops: dict[Action, Op] = {}
    parts_of: dict[Action, list[Op]] = {}  # the last gradient-producing actions, in chunks
    split = {a: grad_buckets.get(a.stage, 1) for a in last_gradient_actions(schedule).values()} if grad_buckets else {}
    launches = _compute_launches(costs, profile)
    env = machine.env
    for rank, acts in enumerate(schedule.actions):
        track = compute_track(gpu_offset + rank)
        stream = machine.stream(track).ops
        for a in acts:
            if a.op in COMPUTE_OPS:
                gpu_s, tail_s, _, _ = launches[a.op][a.stage]
                if not split or a not in split:
                    op = Op(env, a, track, gpu_s, tail_s=tail_s)
                    stream.append(op)
                    ops[a] = op
                    continue
                n = split[a]
                parts = [Op(env, Chunk(a, k, n) if n > 1 else a, track, gpu_s / n, tail_s=tail_s / n)
                         for k in range(n)]
                stream += parts
                parts_of[a], ops[a] = parts, parts[-1]  # consumers wait for the whole action
    for (src, dst), msgs in transfers(schedule).items():
        src, dst = src + gpu_offset, dst + gpu_offset
        name, spec, shared = link_for(profile, src, dst)
        resources = (machine.resource(name),) if shared else ()
        track = f"link {src}->{dst}"
        stream = machine.stream(track).ops
        seconds_of = {}  # (op, stage) -> seconds: every micro-batch's message is the same size
        for t in msgs:
            key = t.send.op, t.send.stage
            seconds = seconds_of.get(key)
            if seconds is None:
                seconds = seconds_of[key] = spec.time_s(_message_bytes(t.send, costs))
            op = Op(env, t, track, seconds, category="comm", issuers=2, resources=resources)
            stream.append(op)
            ops[t.send] = ops[t.recv] = op
    p2p_s = profile.host.p2p_s
    new_tuple = tuple.__new__  # Launch(...) without the Python-level constructor: 400k of them
    waits = iter_waits(schedule, copy_streams)  # in the same order as the loop below
    for rank, acts in enumerate(schedule.actions):
        append = machine.host(f"host{gpu_offset + rank}").steps.append
        for a in acts:
            _, deps = next(waits)
            op = ops[a]
            parts = parts_of.get(a) if parts_of else None
            waiter = parts[0] if parts else op
            waiter_deps = waiter.deps
            for d in deps:
                dep = ops[d]
                if dep is not waiter and dep not in waiter_deps:
                    waiter_deps.append(dep)
            if a.op not in COMPUTE_OPS:
                append(new_tuple(Launch, (op, p2p_s, p2p_s)))
                continue
            _, _, host_s, first_s = launches[a.op][a.stage]
            if parts is None:
                append(new_tuple(Launch, (op, host_s, first_s)))
                continue
            n = len(parts)
            for part in parts:
                append(new_tuple(Launch, (part, host_s / n, min(first_s, host_s / n))))
    return Lowered(ops, {a.stage: parts for a, parts in parts_of.items()})


def finish_step(machine: Machine) -> None:
    """Each host synchronises once at the end of the step, on everything it launched.

    A stream ends its ops in order, so waiting for the last one launched on each stream is the same.
    """
    for host in machine.hosts:
        last = {step.op.track: step.op for step in host.steps if isinstance(step, Launch)}
        host.steps.append(Sync(tuple(last.values())))


def _compute_launches(costs: list[StageCost], profile: Profile) -> dict[str, list[tuple[float, ...]]]:
    """op -> per stage (gpu_s, tail_s, host_s, first_s): the host launches a stage's layers one by one."""
    table: dict[str, list[tuple[float, ...]]] = {}
    for op in (ActionOp.FORWARD, ActionOp.BACKWARD, ActionOp.BACKWARD_INPUT, ActionOp.BACKWARD_WEIGHT):
        table[op] = []
        for stage, cost in enumerate(costs):
            work = _work_of(Action(op, stage, 0), cost)
            chunks = max(work.chunks, 1)
            table[op].append((work.gpu_s, work.gpu_s / chunks, profile.host.action_s + work.host_s,
                              profile.host.action_s + work.host_s / chunks))
    return table


def peak_stashed_microbatches(schedule: Schedule) -> list[int]:
    """Per stage, the most micro-batches whose activations are held at once (forward to backward).

    Read from each rank's program order, which is the order its compute stream runs them.
    """
    held = [0] * schedule.num_stages
    peak = [0] * schedule.num_stages
    for acts in schedule.actions:
        for a in acts:
            if a.op == ActionOp.FORWARD:
                held[a.stage] += 1
                peak[a.stage] = max(peak[a.stage], held[a.stage])
            elif a.op in (ActionOp.BACKWARD, ActionOp.BACKWARD_WEIGHT):
                held[a.stage] -= 1
    return peak



def peak_held_bytes(schedule: Schedule, stash_bytes: list[int]) -> list[int]:
    """Per rank, the most activation bytes its stages hold at once, read off its program order.

    A rank with several stages holds less than the sum of their peaks where those do not coincide
    (ZB-V's two stages peak at 2p+1 chunk-micro-batches together, but hold at most 2p at once).
    """
    peaks = []
    for acts in schedule.actions:
        held = peak = 0
        for a in acts:
            if a.op == ActionOp.FORWARD:
                held += stash_bytes[a.stage]
                peak = max(peak, held)
            elif a.op in (ActionOp.BACKWARD, ActionOp.BACKWARD_WEIGHT):
                held -= stash_bytes[a.stage]
        peaks.append(peak)
    return peaks
