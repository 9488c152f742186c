"""`parsim plan`: candidates ranked by predicted step time, filtered by memory."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import make_profile

from parsim.plan import OPTIMIZER_BYTES_PER_PARAM, candidates, params_per_gpu, plan
from parsim.sim.predict import predict
from parsim.schedules import VIRTUAL, build
from parsim.workload import mlp_model

MODEL = mlp_model(layers=8, hidden=64, tokens=256)


def test_plan_ranks_every_runnable_configuration_by_step_time():
    profile = make_profile(latency_s=1e-5, bandwidth_Bps=1e10, action_s=1e-6)
    fits, too_big = plan(MODEL, 4, profile)
    assert not too_big
    times = [c.prediction.step_time_s for c in fits]
    assert times == sorted(times)
    best = fits[0]
    again, _ = predict(build(best.schedule, 4 // best.data_parallel, best.microbatches,
                             best.virtual_stages if best.schedule in VIRTUAL else None), MODEL, profile,
                       data_parallel=best.data_parallel)
    assert again.step_time_s == pytest.approx(best.prediction.step_time_s)


def test_memory_limit_drops_configurations_that_need_more():
    profile = make_profile()
    everything = candidates(MODEL, 4, profile)
    limit = sorted(c.memory_bytes for c in everything)[len(everything) // 2]
    fits, too_big = plan(MODEL, 4, profile, memory_limit_bytes=limit)
    assert fits and too_big
    assert all(c.memory_bytes <= limit for c in fits) and all(c.memory_bytes > limit for c in too_big)


def test_memory_counts_optimizer_state_activations_and_the_outputs_kept_for_the_backward():
    profile = make_profile()
    c = next(c for c in candidates(MODEL, 2, profile, ["gpipe"]) if c.microbatches == 4 and c.data_parallel == 1)
    params = params_per_gpu(MODEL, 2, 2, (0, 1))
    assert sum(params) == 8 * (8 * 64**2 + 7 * 64)
    kept = [4 * (256 // 4) * 64 * 2, 0]  # GPipe: stage 0 keeps its 4 micro-batches' outputs; the last, its loss
    assert c.memory_bytes == max(g.peak_activation_bytes + OPTIMIZER_BYTES_PER_PARAM * n + k
                                 for g, n, k in zip(c.prediction.per_gpu, params, kept))


def test_plan_cli_says_when_nothing_fits():
    result = subprocess.run([sys.executable, "-m", "parsim", "plan", "--gpus", "2", "--layers", "4", "--hidden", "256",
                             "--tokens", "1024", "--memory-limit", "0.000001"], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.startswith("error: no configuration fits in 1e-06 GB per GPU; the smallest")


def test_plan_tries_data_parallel_degrees_when_the_profile_costs_an_allreduce():
    import dataclasses

    from parsim.profile import CollectiveSpec

    profile = dataclasses.replace(make_profile(), collectives={"allreduce": CollectiveSpec(1e-5, 1e11)})
    degrees = {c.data_parallel for c in candidates(MODEL, 4, profile)}
    assert degrees == {1, 2, 4}
    assert {c.data_parallel for c in candidates(MODEL, 4, make_profile())} == {1}


def test_plan_searches_the_v_shaped_and_breadth_first_schedules_where_their_sizes_allow():
    found = candidates(MODEL, 4, make_profile(), ["zbv", "dualpipev", "looped-bfs"], max_microbatches=16)
    labels = {c.label for c in found}
    assert {"zbv m=1", "zbv m=16", "dualpipev m=8", "dualpipev m=16", "looped-bfs m=4, v=2"} <= labels
    assert "dualpipev m=4" not in labels  # DualPipeV needs m >= 2p
    assert not any(c.label.startswith("looped-bfs") and c.virtual_stages == 4 for c in found)  # 16 stages > 8 layers
    assert {c.prediction.gpus for c in found} == {4}
