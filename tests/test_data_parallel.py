"""Data parallelism: replicas of the pipeline, with DDP's bucketed gradient all-reduce."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import make_profile

from parsim.errors import ProfileError
from parsim.profile import CollectiveSpec, LinkSpec
from parsim.schedules import build
from parsim.sim.grad_allreduce import DDP_BUCKET_BYTES
from parsim.sim.predict import predict, simulate
from parsim.workload import StageCost, Work, mlp_model


def _with_allreduce(latency_s: float = 0.0, busbw_Bps: float = float("inf"), **kw):
    return dataclasses.replace(make_profile(**kw), collectives={"allreduce": CollectiveSpec(latency_s, busbw_Bps)})


def _stage(t_f: float, t_b: float, grad_bytes: int) -> StageCost:
    return StageCost(Work(t_f, 0, 1), Work(t_b / 2, 0, 1), Work(t_b / 2, 0, 1), 1 << 20, 0, grad_bytes)


def test_free_allreduce_makes_replicas_as_fast_as_one_pipeline():
    costs = [_stage(1.0, 2.0, 10 * DDP_BUCKET_BYTES) for _ in range(4)]
    one = simulate(build("1f1b", 4, 8), costs, _with_allreduce()).step_time_s
    two = simulate(build("1f1b", 4, 8), costs, _with_allreduce(), data_parallel=2).step_time_s
    assert two == pytest.approx(one)


@pytest.mark.parametrize("buckets", [1, 4, 10])
def test_ddp_exposes_only_the_last_bucket_when_each_hides_behind_its_chunk(buckets):
    """Pure data parallelism: bucket k all-reduces while chunks k+1.. of the backward run."""
    t_f, t_b = 1.0, 2.0
    per_bucket = 0.5 * t_b / buckets  # each bucket's all-reduce is shorter than a backward chunk
    spec = CollectiveSpec(per_bucket, float("inf"))  # latency only: the same for any bucket size
    profile = dataclasses.replace(make_profile(), collectives={"allreduce": spec})
    costs = [_stage(t_f, t_b, buckets * DDP_BUCKET_BYTES)]
    step = simulate(build("gpipe", 1, 1), costs, profile, data_parallel=4).step_time_s
    assert step == pytest.approx(t_f + t_b + per_bucket)


@pytest.mark.parametrize("buckets", [1, 4, 10])
def test_an_allreduce_hidden_behind_the_backward_still_takes_its_share_of_the_compute(buckets):
    """Each bucket's all-reduce (shorter than a backward chunk) overlaps the next chunk, and what it takes from the
    compute beside it (compute_share of its time) comes after the backward on each GPU: the step ends at the later
    of the compute's end and the last bucket's."""
    t_f, t_b, share = 1.0, 2.0, 0.5
    per_bucket = 0.5 * t_b / buckets
    spec = CollectiveSpec(per_bucket, float("inf"), compute_share=share)
    profile = dataclasses.replace(make_profile(), collectives={"allreduce": spec})
    costs = [_stage(t_f, t_b, buckets * DDP_BUCKET_BYTES)]
    step = simulate(build("gpipe", 1, 1), costs, profile, data_parallel=4).step_time_s
    assert step == pytest.approx(t_f + t_b + max(share * buckets * per_bucket, per_bucket))


def test_one_bucket_waits_for_the_whole_backward():
    profile = _with_allreduce(latency_s=0.0, busbw_Bps=1e9)
    grad = DDP_BUCKET_BYTES // 2
    step = simulate(build("gpipe", 1, 2), [_stage(1.0, 2.0, grad)], profile, data_parallel=2).step_time_s
    assert step == pytest.approx(2 * 3.0 + 2 * (2 - 1) / 2 * grad / 1e9)


def test_slower_allreduce_never_makes_a_step_faster():
    costs = [_stage(1e-3, 2e-3, 200 << 20) for _ in range(2)]
    times = [simulate(build("1f1b", 2, 4), costs, _with_allreduce(lat, bw), data_parallel=2).step_time_s
             for lat, bw in [(0.0, float("inf")), (1e-5, 1e12), (1e-4, 1e11), (1e-3, 1e10)]]
    assert times == sorted(times) and times[-1] > times[0]


def test_replicas_across_nodes_use_the_network():
    costs = [_stage(1e-3, 2e-3, 100 << 20) for _ in range(2)]
    schedule = build("1f1b", 2, 4)
    in_node = simulate(schedule, costs, _with_allreduce(0.0, 3e11, gpus_per_node=4), data_parallel=2)
    slow_network = _with_allreduce(0.0, 3e11, gpus_per_node=2, network=LinkSpec(1e-5, 1e9))
    spread = simulate(schedule, costs, slow_network, data_parallel=2)
    assert spread.step_time_s > in_node.step_time_s + (100 << 20) / 1e9 * 0.9


def test_prediction_reports_every_gpu_of_the_grid_and_splits_the_batch():
    model = mlp_model(layers=4, hidden=64, tokens=512)
    prediction, _ = predict(build("1f1b", 2, 4), model, _with_allreduce(), data_parallel=2)
    assert prediction.gpus == 4 and [g.rank for g in prediction.per_gpu] == [0, 1, 2, 3]
    assert [g.stages for g in prediction.per_gpu] == [(0,), (1,), (0,), (1,)]
    alone, _ = predict(build("1f1b", 2, 4), mlp_model(layers=4, hidden=64, tokens=256), _with_allreduce())
    assert prediction.step_time_s == pytest.approx(alone.step_time_s)  # free all-reduce: half the batch each


def test_data_parallel_needs_an_allreduce_cost():
    with pytest.raises(ProfileError, match="collectives.allreduce"):
        simulate(build("gpipe", 1, 1), [_stage(1.0, 1.0, 1)], make_profile(), data_parallel=2)
