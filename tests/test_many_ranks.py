"""Costs of a multi-rank eager step (issue 43): a forward after a backward, torch's batches of posts, the slowest of
the ranks' host loops. Each checked against a closed form on host-bound steps, and the two engines against each
other."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from conftest import make_profile

from parsim.configuration import Configuration, predict
from parsim.runtimes.torch_pipelining import TORCH
from parsim.schedules import build
from parsim.sim.lower import forwards_after_backward
from parsim.sim.predict import predict as predict_schedule
from parsim.sim.predict import simulate
from parsim.sim.slowest import expected_max, slowest_factor, spread_of
from parsim.workload import mlp_model, stage_costs

MODEL = mlp_model(layers=8, hidden=8, tokens=64)  # unit-rate layers of a few FLOPs: the GPU idles


def _host_bound(**host: float):
    """GPU work and links free; the host pays per action, per layer, per message and the given costs."""
    base = make_profile(action_s=1e-4, layer_host_s=1e-4, p2p_s=3e-5)
    return replace(base, host=replace(base.host, **host))


@pytest.mark.parametrize("name,m,forwards", [("gpipe", 4, 0), ("1f1b", 4, 3), ("1f1b", 8, 7),
                                             ("interleaved-1f1b", 4, None)])
def test_a_forward_after_a_backward_lengthens_a_one_rank_host_bound_step_by_its_count(name, m, forwards):
    schedule = build(name, 1, m, 2 if name == "interleaved-1f1b" else None)
    count = len(forwards_after_backward(schedule))
    if forwards is not None:
        assert count == forwards  # 1F1B order on one rank: F B F B ..., every forward but the first after a B
    after_s = 7e-5
    grown = (predict_schedule(schedule, MODEL, _host_bound(after_backward_s=after_s))[0].step_time_s
             - predict_schedule(schedule, MODEL, _host_bound())[0].step_time_s)
    assert grown == pytest.approx(count * after_s, rel=1e-9, abs=1e-15)


def test_on_many_ranks_only_the_forwards_after_a_backward_pay_it():
    schedule = build("1f1b", 4, 8)
    found = forwards_after_backward(schedule)
    for rank, acts in enumerate(schedule.actions):
        computes = [a for a in acts if a.op in ("F", "B")]
        expected = [b for a, b in zip(computes, computes[1:]) if a.op == "B" and b.op == "F"]
        assert [a for a in found if schedule.stage_to_rank[a.stage] == rank] == expected
    assert found  # the steady state has them on every rank but the last's warm-up


def _host_seconds(sim) -> list[float]:
    """Per host, what its launches cost it (the events machine's program)."""
    return [sum(step[1] for step in host.steps if isinstance(step, tuple) and len(step) == 3) for host in sim.hosts]


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved-1f1b"])
def test_torchs_batches_cost_each_rank_batch_s_once_a_batch(name):
    schedule = TORCH.build(name, 2, 8)
    batch_s = 5e-5
    base, batched = _host_bound(), _host_bound(batch_s=batch_s)
    before = _host_seconds(predict_schedule(schedule, MODEL, base)[1])
    after = _host_seconds(predict_schedule(schedule, MODEL, batched)[1])
    batches = [len(b) for b in schedule.comm.batches]
    assert [a - b for a, b in zip(after, before)] == pytest.approx([n * batch_s for n in batches], rel=1e-9)
    assert min(batches) > 0


@pytest.mark.parametrize("name,ranks", [("gpipe", 2), ("1f1b", 2), ("interleaved-1f1b", 2), ("1f1b", 4)])
def test_the_two_engines_agree_to_the_bit_with_the_new_costs(name, ranks):
    profile = _host_bound(after_backward_s=7e-5, batch_s=5e-5)
    for schedule in (build(name, ranks, 8), TORCH.build(name, ranks, 8)):
        costs = stage_costs(MODEL, schedule.num_stages, schedule.num_microbatches, profile)
        walked = simulate(schedule, costs, profile, engine="longest-path").step_time_s
        assert walked == simulate(schedule, costs, profile, engine="events").step_time_s


def test_expected_max_of_normals_has_its_closed_forms():
    assert expected_max(1) == 0.0
    assert expected_max(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-9)
    assert expected_max(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), rel=1e-9)
    assert expected_max(2) < expected_max(4) < expected_max(8)
    assert spread_of(0.05, 2) * expected_max(2) == pytest.approx(0.05) and spread_of(0.05, 1) == 0.0


def test_the_slowest_of_n_ranks_slows_a_host_bound_step_by_its_factor_and_leaves_one_gpu_alone():
    spread = 0.08
    plain, spreading = _host_bound(), _host_bound(rank_spread=spread)
    for gpus in (2, 4):
        config = Configuration(MODEL, "gpipe", gpus, 8)
        ratio = predict(config, spreading)[0].step_time_s / predict(config, plain)[0].step_time_s
        # every cost but a few FLOPs' worth of GPU time is the host's
        assert ratio == pytest.approx(slowest_factor(spread, gpus), rel=1e-6)
        assert ratio == pytest.approx(1 + expected_max(gpus) * spread, rel=1e-6)
    built = build("gpipe", 2, 8)  # a built schedule predicted as it is: the same pace
    ratio = predict_schedule(built, MODEL, spreading)[0].step_time_s / predict_schedule(built, MODEL, plain)[0].step_time_s
    assert ratio == pytest.approx(slowest_factor(spread, 2), rel=1e-6)
    one = Configuration(MODEL, "gpipe", 1, 8)
    assert predict(one, spreading)[0].step_time_s == predict(one, plain)[0].step_time_s
    pair = predict(Configuration(MODEL, "gpipe", 2, 8), spreading)[0]
    assert pair.single_gpu_step_s == predict(one, plain)[0].single_gpu_step_s  # the speedup's denominator: one rank


def test_a_gpu_bound_step_does_not_feel_the_slowest_host():
    heavy = replace(MODEL, tokens=1 << 22)  # unit-rate layers: seconds of GPU work against 1e-4 s of host
    plain, spreading = _host_bound(), _host_bound(rank_spread=0.2)
    config = Configuration(heavy, "1f1b", 2, 8)
    ratio = predict(config, spreading)[0].step_time_s / predict(config, plain)[0].step_time_s
    # only the host's first launches and its last, before the GPU has work queued and after, are on the path
    assert 1.0 <= ratio < 1 + 0.01 * (slowest_factor(0.2, 2) - 1)
