"""Data parallelism: each stage's gradients all-reduced across pipeline replicas, in DDP's buckets.

Replica r of a p-stage pipeline runs on GPUs r*p .. r*p+p-1. A stage's gradients are cut into
buckets of DDP's default 25 MiB; bucket k's all-reduce starts once the k-th chunk of the stage's
last backward is done on every replica, so it overlaps the rest of that backward, as DDP's hooks
do. All-reduces of one group of GPUs share one stream, as NCCL runs them on one communicator.
What an all-reduce takes from the compute beside it (the profile's compute_share of its time) is
charged to each of its GPUs' compute streams after the compute queued there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from parsim.errors import ProfileError
from parsim.profile import CollectiveSpec, Profile
from parsim.schedules import Schedule
from parsim.sim.lower import Lowered, compute_track
from parsim.workload import StageCost

if TYPE_CHECKING:
    from parsim.sim.machine import Machine

DDP_BUCKET_BYTES = 25 * 2**20  # torch.nn.parallel.DistributedDataParallel's bucket_cap_mb default


def gradient_buckets(costs: list[StageCost], bucket_bytes: int = DDP_BUCKET_BYTES) -> dict[int, int]:
    """Stage -> how many buckets its gradients fill."""
    return {s: max(1, math.ceil(c.grad_bytes / bucket_bytes)) for s, c in enumerate(costs)}


def allreduce_spec(profile: Profile, gpus: Sequence[int]) -> CollectiveSpec:
    """Within a node, the calibrated NCCL all-reduce; across nodes, a ring bound by the network link."""
    if "allreduce" not in profile.collectives:
        raise ProfileError("this profile has no collectives.allreduce cost, which data parallelism needs: "
                           "re-run `python -m hw calibrate` on several GPUs")
    if min(gpus) // profile.gpus_per_node == max(gpus) // profile.gpus_per_node:  # one node (floor is monotone)
        return profile.collectives["allreduce"]
    network = profile.links["network"]
    return CollectiveSpec(network.latency_s, network.bandwidth_Bps, network.measured)


def add_gradient_allreduce(machine: Machine, schedule: Schedule, costs: list[StageCost], profile: Profile,
                           replicas: list[Lowered], buckets: dict[int, int], data_parallel: int | None = None) -> None:
    """Append each stage's bucketed all-reduce to every replica's host program: the `data_parallel` replicas' (all
    of `replicas` by default), of which those lowered are `replicas` (the first, where it stands for alike ones)."""
    from parsim.sim.machine import Launch  # here: the longest-path walk reads allreduce_spec without the machine

    dp, pp = data_parallel or len(replicas), schedule.num_ranks
    hosts = {h.name: h for h in machine.hosts}
    for stage in reversed(range(schedule.num_stages)):  # backward reaches the last stages first
        group = [r * pp + schedule.stage_to_rank[stage] for r in range(dp)]
        n = buckets[stage]
        spec = allreduce_spec(profile, group)
        seconds = spec.allreduce_s(costs[stage].grad_bytes / n, dp)
        track = "allreduce gpus " + ",".join(map(str, group))
        for k in range(n):
            op = machine.op(track, f"allreduce s{stage} bucket {k + 1}/{n}", seconds, category="comm",
                            issuers=len(replicas))
            for replica, gpu in zip(replicas, group):
                op.deps.append(replica.grad_chunks[stage][k])
                hosts[f"host{gpu}"].steps.append(Launch(op, profile.host.p2p_s, profile.host.p2p_s))
                if spec.compute_share:  # what the all-reduce takes from the compute it could overlap
                    share = machine.op(compute_track(gpu), f"allreduce s{stage} bucket {k + 1}/{n}'s share",
                                       spec.compute_share * seconds)
                    share.deps.append(replica.grad_chunks[stage][k])
                    hosts[f"host{gpu}"].steps.append(Launch(share, 0.0, 0.0))
