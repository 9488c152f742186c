"""A floor under a step's time, from closed forms: what plan compares before it simulates a configuration.

Every op lasts at least its GPU time (or its link time), starts after what it waits for, and each stream
and each host runs one thing at a time. So on any GPU, the ops of its stages from s on cannot start before
micro-batch 0's forward reaches stage s (the pipeline fill), run one after another, and are followed by the
backwards below s that the last of them leads to (the drain); a gradient all-reduce runs after the last
backward of its stage; and a host launches everything one launch at a time. No schedule is built.
"""

from __future__ import annotations

from parsim.profile import Profile
from parsim.sim.grad_allreduce import allreduce_spec
from parsim.sim.lower import grad_add_saving_s, link_for
from parsim.workload import StageCost, gradient_adds

SLACK = 1 - 1e-9  # the floor's sums run in another order than the simulation's; rounding may differ by ulps


def step_floor_s(stage_to_rank: tuple[int, ...], costs: list[StageCost], microbatches: int, profile: Profile,
                 data_parallel: int = 1, splits_backward: bool = True, buckets: dict[int, int] | None = None) -> float:
    """No step of this shape (stages placed as `stage_to_rank`, each micro-batch costing `costs` on the profile
    its runtime pays) can be shorter; `buckets` (stage -> DDP buckets) where data_parallel > 1."""
    stages_of: list[list[int]] = [[] for _ in range(max(stage_to_rank) + 1)]
    for s, rank in enumerate(stage_to_rank):
        stages_of[rank].append(s)
    chains = _chains(stage_to_rank, costs, profile)
    adds = [(microbatches - 1) * a for a in gradient_adds(profile, costs) or [0.0] * len(costs)]
    compute = _compute_floor_s(stages_of, chains, costs, microbatches, splits_backward, adds)
    host = _host_floor_s(stage_to_rank, stages_of, costs, microbatches, profile, data_parallel, buckets or {})
    reduce = _allreduce_floor_s(stages_of, chains[0], costs, microbatches, profile, data_parallel, buckets or {})
    return SLACK * max(compute, host, reduce)


def _chains(owner: tuple[int, ...], costs: list[StageCost], profile: Profile) -> tuple[list[float], ...]:
    """Per stage s: reach, when a micro-batch's forward can first arrive there (stages 0..s-1 and their messages);
    drain, the whole backwards of stages s-1..0 and their messages; drain_input, the same with input-grads only."""
    stages = len(owner)
    reach, drain, drain_input = [0.0] * stages, [0.0] * stages, [0.0] * stages
    for s in range(1, stages):
        forward_msg = backward_msg = 0.0
        if owner[s - 1] != owner[s]:  # replica 0's GPUs: a floor for one replica is a floor for the step
            forward_msg = link_for(profile, owner[s - 1], owner[s])[1].time_s(costs[s - 1].send_bytes)
            backward_msg = link_for(profile, owner[s], owner[s - 1])[1].time_s(costs[s - 1].send_bytes)
        reach[s] = reach[s - 1] + costs[s - 1].forward.gpu_s + forward_msg
        drain[s] = drain[s - 1] + costs[s - 1].backward.gpu_s + backward_msg
        drain_input[s] = drain_input[s - 1] + costs[s - 1].backward_input.gpu_s + backward_msg
    return reach, drain, drain_input


def _compute_floor_s(stages_of: list[list[int]], chains: tuple[list[float], ...], costs: list[StageCost], m: int,
                     splits_backward: bool, adds: list[float]) -> float:
    """The slowest GPU: for each of its stages s, the fill to s, its ops on stages >= s back to back, the drain.

    After the last of a GPU's ops on stages >= s come the backwards below s: whole ones where every backward
    is whole; where some are split, after its last input-grad (or whole backward) come the input-grads below s,
    and only weight-grads, which nothing waits for, may follow it on the GPU. adds: per stage, the gradient
    adds its gradient actions make after the first (on whichever of B and W: counted only in the whole).
    """
    reach, drain, drain_input = chains
    slowest = 0.0
    for mine in stages_of:
        work = weights = added = 0.0  # of this GPU's stages >= s, all micro-batches
        for s in reversed(mine):
            work += m * (costs[s].forward.gpu_s + costs[s].backward.gpu_s)
            weights += m * costs[s].backward_weight.gpu_s
            added += adds[s]
            if splits_backward:
                after = max(work + added, work - weights + drain_input[s])
            else:
                after = work + added + drain[s]
            slowest = max(slowest, reach[s] + after)
    return slowest


def _allreduce_floor_s(stages_of: list[list[int]], reach: list[float], costs: list[StageCost], m: int,
                       profile: Profile, data_parallel: int, buckets: dict[int, int]) -> float:
    """The busiest all-reduce stream (one per group of GPUs, so per rank): its buckets one after another, none
    before the stage's last gradient action starts (after its m forwards and m-1 backwards, from the fill)."""
    if data_parallel < 2:
        return 0.0
    pp, busiest = len(stages_of), 0.0
    for rank, mine in enumerate(stages_of):
        spec = allreduce_spec(profile, range(rank, pp * data_parallel, pp))  # its group: rank r of every replica
        total = sum(buckets.get(s, 1) * spec.allreduce_s(costs[s].grad_bytes / buckets.get(s, 1), data_parallel)
                    for s in mine)
        start = min(reach[s] + m * costs[s].forward.gpu_s + (m - 1) * costs[s].backward.gpu_s for s in mine)
        busiest = max(busiest, start + total)
    return busiest


def _host_floor_s(owner: tuple[int, ...], stages_of: list[list[int]], costs: list[StageCost], m: int,
                  profile: Profile, data_parallel: int, buckets: dict[int, int]) -> float:
    """The busiest host: a launch per compute action (a backward as one, the cheaper way; a stage's first without
    its gradient adds), one per message it sends or receives, one per gradient bucket it all-reduces, and the
    runtime's per-step bookkeeping."""
    host, last = profile.host, len(owner) - 1
    busiest = 0.0
    for rank, mine in enumerate(stages_of):
        launch_s = sum(m * (2 * host.action_s + costs[s].forward.host_s + costs[s].backward.host_s)
                       - grad_add_saving_s(profile, costs[s].layers, costs[s].backward.host_s) for s in mine)
        messages = sum(2 * m * ((s > 0 and owner[s - 1] != rank) + (s < last and owner[s + 1] != rank))
                       for s in mine)
        reduces = sum(buckets.get(s, 1) for s in mine) if data_parallel > 1 else 0
        busiest = max(busiest, launch_s + (messages + reduces) * host.p2p_s + host.begin_s + host.step_s)
    return busiest
