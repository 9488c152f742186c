"""The textbook scenarios, simulated, against their closed forms."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import make_profile

from parsim.errors import ProfileError
from parsim.profile import HostCosts, KernelCost, LinkSpec
from parsim.scenarios import (
    COPY_STREAMS,
    PIPELINED_RESNET,
    async_front_end,
    copy_compute_overlap,
    multi_gpu_matmuls,
    predict_pipeline_scenario,
)
from parsim.scenarios import (
    RESNET_SPLITS as PIPELINED_RESNET_SPLITS,
)

T1, T3 = 8e-6, 20e-6


def _profile(elementwise_s: float = 0.0, matmul_s: float = 1e-3, copy_s: float = 4e-4, pageable_s: float = 1e-3):
    """Costs chosen so each kernel and copy takes a round number of seconds in the scenarios below."""
    base = make_profile()
    size_bytes = 4 * 4000 * 4000
    links = dict(base.links, d2h_pinned=LinkSpec(0.0, size_bytes / copy_s),
                 d2h_pageable=LinkSpec(0.0, size_bytes / pageable_s))
    return dataclasses.replace(
        base, links=links, host=HostCosts(0.0, 0.0, launch_s=T1, sync_s=T3),
        kernels={"elementwise": KernelCost(elementwise_s, 1e30), "matmul": KernelCost(matmul_s, 1e30)})


@pytest.mark.parametrize("t2", [2e-6, 5e-5])
def test_async_front_end_matches_the_textbook_formulas(t2):
    n = 200
    r = async_front_end(_profile(elementwise_s=t2), n=n)
    assert r.figures["sync_each_s"] == pytest.approx(n * (T1 + t2 + T3))
    assert r.figures["sync_once_s"] == pytest.approx(max(n * T1 + t2, T1 + n * t2) + T3)


def test_overlapped_copies_hide_behind_compute_when_pinned():
    n, mm, copy = 50, 1e-3, 4e-4
    r = copy_compute_overlap(_profile(matmul_s=mm, copy_s=copy, pageable_s=1e-3), n=n)
    assert r.figures["pinned_serial_s"] == pytest.approx(T1 + n * mm + n * copy)
    assert r.figures["pinned_overlapped_s"] == pytest.approx(T1 + n * mm + copy)
    assert r.figures["pageable_overlapped_s"] > r.figures["pinned_overlapped_s"]


def test_copies_on_the_compute_stream_overlap_nothing():
    n, mm, copy = 50, 1e-3, 4e-4
    r = copy_compute_overlap(_profile(matmul_s=mm, copy_s=copy, pageable_s=1e-3), n=n)
    assert r.figures["pinned_default_stream_s"] == pytest.approx(T1 + n * (mm + copy))
    assert r.figures["pinned_default_stream_ratio"] == pytest.approx(1.0)


def test_pageable_copies_block_the_host_so_they_hardly_overlap():
    r = copy_compute_overlap(_profile(matmul_s=1e-3, pageable_s=1e-3), n=20)
    assert r.figures["pageable_speedup_ratio"] < r.figures["pinned_speedup_ratio"]


def test_two_gpus_run_twice_the_products_in_the_time_of_one():
    r = multi_gpu_matmuls(_profile(matmul_s=1e-3), n=50, gpus=2)
    assert r.figures["one_gpu_s"] == pytest.approx(T1 + 50e-3)
    assert r.figures["all_over_one_ratio"] == pytest.approx(1.0, abs=1e-3)


def test_scenario_without_its_costs_names_what_to_measure():
    with pytest.raises(ProfileError, match="host.launch_s"):
        async_front_end(make_profile())


def test_measured_op_costs_fill_the_profile_and_figures_pair_up():
    from parsim.scenarios import compare_figures, with_op_costs

    costs = {"host": {"launch_s": 7e-6, "sync_s": 3e-6},
             "kernels": {"elementwise": {"fixed_s": 2e-6, "rate": 5e12}, "matmul": {"fixed_s": 1e-5, "rate": 5e13}}}
    profile = with_op_costs(make_profile(), costs)
    assert profile.host.launch_s == 7e-6 and profile.kernels["matmul"].rate == 5e13
    predicted = async_front_end(profile, n=100)
    rows = compare_figures(predicted, {"sync_once_s": predicted.figures["sync_once_s"] * 2, "other": 1.0})
    assert rows == [("sync_once_s", predicted.figures["sync_once_s"], predicted.figures["sync_once_s"] * 2, -0.5)]


def test_malformed_op_costs_are_a_profile_error():
    from parsim.scenarios import with_op_costs

    with pytest.raises(ProfileError, match="malformed"):
        with_op_costs(make_profile(), {"host": {}})


def test_copy_streams_change_nothing_when_messages_are_free():
    r = predict_pipeline_scenario(COPY_STREAMS, make_profile())
    assert r.figures["speedup_ratio"] == pytest.approx(1.0)


def test_copy_streams_hide_slow_messages_that_stall_the_compute_stream():
    slow = make_profile(latency_s=1e-4, bandwidth_Bps=50e9)
    r = predict_pipeline_scenario(COPY_STREAMS, slow)
    assert r.figures["copy_streams_s"] < r.figures["compute_stream_s"]
    assert r.figures["speedup_ratio"] == pytest.approx(r.figures["compute_stream_s"] / r.figures["copy_streams_s"])


def _conv_profile(action_s: float):
    """Free messages, `action_s` of host time per compute action, conv layers at the unit MLP rate."""
    p = make_profile(action_s=action_s)
    return dataclasses.replace(p, layers={**p.layers, "conv": p.layers["mlp"], "down": p.layers["mlp"]})


def test_naive_model_parallelism_only_takes_turns_and_pipelining_nearly_halves_the_step():
    r = predict_pipeline_scenario(PIPELINED_RESNET, _conv_profile(0.0))
    assert r.figures["model_parallel_over_single_ratio"] == pytest.approx(1.0)
    assert 1.8 < r.figures["best_speedup_ratio"] < 2.0
    assert r.figures["best_microbatches_count"] == max(PIPELINED_RESNET_SPLITS)  # nothing makes splitting cost


def test_a_middle_split_wins_once_each_micro_batch_costs_the_host():
    r = predict_pipeline_scenario(PIPELINED_RESNET, _conv_profile(0.05))
    assert min(PIPELINED_RESNET_SPLITS) < r.figures["best_microbatches_count"] < max(PIPELINED_RESNET_SPLITS)


def test_the_recompute_scenario_trades_a_forward_per_microbatch_for_memory():
    """The seed's question: GPipe at 1-32 micro-batches, kept or recomputed: each recomputed step is longer, and from
    2 micro-batches on it holds less at its peak (m = 1 holds one micro-batch's activations either way)."""
    from parsim.errors import ParsimError
    from parsim.profile import load_profile
    from parsim.runtimes import get_runtime
    from parsim.scenarios import PIPELINE_SCENARIOS, RECOMPUTE, predict_pipeline_scenario
    from parsim.scenarios.pipelines import RECOMPUTE_SPLITS

    figures = predict_pipeline_scenario(RECOMPUTE, load_profile()).figures
    for m in RECOMPUTE_SPLITS:
        assert figures[f"recomputed_m{m}_s"] > figures[f"kept_m{m}_s"]
        peaks = figures[f"recomputed_m{m}_peak_bytes"], figures[f"kept_m{m}_peak_bytes"]
        assert peaks[0] < peaks[1] if m > 1 else peaks[0] <= peaks[1]
    assert figures["best_recomputed_over_best_kept_ratio"] > 1
    assert PIPELINE_SCENARIOS["recompute"] is RECOMPUTE
    with pytest.raises(ParsimError, match="hw runtime only"):
        predict_pipeline_scenario(RECOMPUTE, load_profile(), get_runtime("torch"))
