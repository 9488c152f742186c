"""`hw calibrate --runtimes graphs`: the graphs runtimes' costs from host spans over depth and GPU times against the
profile's layer costs (closed forms), and the probes running end to end on the CPU through the eager stand-in."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import make_profile

torch = pytest.importorskip("torch")

from hw.calibrate.graphs_runtime import (
    accumulate_samples,
    fit_scales,
    gpu_fits,
    gpu_ratios,
    host_samples,
    profile_parts,
    runtime_costs,
)
from hw.calibrate.stage_probe import stage_samples  # noqa: E402
from parsim.profile import from_json  # noqa: E402

CPU = torch.device("cpu")


@pytest.mark.parametrize("fixed_scale,flops_scale", [(0.7, 1.0), (0.85, 1.03), (1.0, 0.95)])
def test_the_scale_fit_recovers_the_fixed_and_matmul_scales(fixed_scale, flops_scale):
    points = [(fixed, flops, fixed_scale * fixed + flops_scale * flops)
              for fixed, flops in [(3e-4, 1e-6), (3e-4, 1e-4), (5e-4, 3e-3), (6e-4, 4e-2)]]
    fit = fit_scales(points)
    assert fit.fixed_scale == pytest.approx(fixed_scale, rel=1e-6)
    assert fit.flops_scale == pytest.approx(flops_scale, rel=1e-6)
    assert fit.max_rel_residual < 1e-6


def test_host_spans_give_one_launch_per_action_and_layer_host_against_hws_per_layer_cost():
    """forward 12 us + 0.1 us/layer, backward 14 + 0.3: action 13 us, 0.4 us per layer of hw's 400 us."""
    rows = [{"layers": k, "forward_s": (12 + 0.1 * k) * 1e-6, "backward_s": (14 + 0.3 * k) * 1e-6,
             "step_outside_s": (30 + 2 * k) * 1e-6, "step_before_s": (12 + 0.5 * k) * 1e-6,
             "whole_step_s": (50 + 3 * k) * 1e-6} for k in (1, 2, 4, 8)]
    scales = {name: fit_scales([(1.0, 1.0, 0.8 + 1.1), (1.0, 2.0, 0.8 + 2.2)]) for name in ("graphs", "graphs-step")}
    adds = [{"bytes": n, "seconds": 2e-6 + n / 4e12} for n in (1e6, 1e8, 1e10)]
    costs, fits, add = runtime_costs(rows, scales, adds, 400e-6, p2p_s=9e-6, p2p_carried=True)
    graphs, step = costs["graphs"], costs["graphs-step"]
    assert graphs.action_s == pytest.approx(13e-6, rel=1e-4)
    assert graphs.layer_host == pytest.approx(0.4 / 400, rel=1e-3)
    # 12 us of the step's 30 us outside its actions precede the first one; graphs-step's batch copy alike
    assert graphs.begin_s == pytest.approx(12e-6, rel=1e-4) and graphs.step_s == pytest.approx(18e-6, rel=1e-4)
    assert step.begin_s == pytest.approx(12e-6, rel=1e-4) and step.step_s == pytest.approx(38e-6, rel=1e-4)
    assert graphs.gpu_scale == pytest.approx(1.1) and graphs.gpu_fixed_scale == pytest.approx(0.8 / 1.1)
    assert graphs.p2p_s == 9e-6 and graphs.unmeasured == ("p2p_s",)
    assert step.action_s == 0.0 and step.layer_host == 0.0
    assert graphs.accumulate_s == pytest.approx(2e-6, rel=1e-3) and graphs.accumulate_Bps == pytest.approx(4e12, rel=1e-4)
    assert step.accumulate_Bps == graphs.accumulate_Bps
    assert set(fits) == {"host graphs forward", "host graphs backward", "host graphs step_outside",
                         "host graphs step_before", "host graphs whole_step"}


@pytest.mark.parametrize("probe_speed", [0.8, 1.0, 1.3])
def test_graphs_timed_like_eager_scale_to_one_whatever_the_probes_speed_against_the_profile(probe_speed):
    """The scales say what graphing saves against eager timed in the same turns: graphed 10% faster in the
    fixed part, equal in the matmuls, at any probe speed against the profile (the profile's fixed part is 0)."""
    from dataclasses import replace

    from parsim.profile import LayerCosts, OpCost

    cost = OpCost(0.0, 2e-5, 1e12)
    profile = replace(make_profile(), layers={"mlp": LayerCosts(cost, cost, cost)})
    rows = []
    for n in (128, 1024, 8192):
        row = {"hidden": 64, "tokens": n, "layers": 8}
        parts = profile_parts(row, profile)
        for op in ("forward", "backward"):
            fixed, mm = parts[op]
            row[f"eager_{op}_s"] = probe_speed * (fixed + mm)
            row[f"graphs_{op}_s"] = probe_speed * (0.9 * fixed + mm)
        row["graphs-step_s"] = probe_speed * (0.9 * parts["step"][0] + parts["step"][1])
        rows.append(row)
    for fit in gpu_fits(rows, profile).values():
        assert fit.flops_scale == pytest.approx(1.0, rel=1e-3) and fit.fixed_scale == pytest.approx(0.9, rel=1e-3)


def test_profile_parts_split_a_stages_gpu_time_into_fixed_and_matmul():
    row = {"hidden": 64, "tokens": 128, "layers": 8}
    parts = profile_parts(row, make_profile())  # every op: no fixed time, 1e12 FLOP/s
    flops = 16 * 64**2 * 128
    assert parts["forward"] == (0.0, pytest.approx(8 * flops / 1e12))
    assert parts["backward"] == (0.0, pytest.approx(16 * flops / 1e12))
    assert parts["step"][1] == pytest.approx(24 * flops / 1e12)


def test_the_probes_run_end_to_end_on_the_cpu_and_make_loadable_costs():
    host = host_samples(CPU, torch.float32, microbatches=2, rounds=2)
    gpu = stage_samples(CPU, torch.float32, [16], graphed=True, steps=1)
    assert [r["layers"] for r in host] == [1, 2, 4, 8]
    assert all(0 < r["step_before_s"] < r["step_outside_s"] for r in host)  # the batch copy, then the rest
    assert all(r[k] > 0 for r in gpu for k in ("eager_forward_s", "graphs_backward_s", "graphs-step_s"))
    assert all(set(r["lead_s"]) == {"eager", "graphs", "graphs-step"} for r in gpu)
    adds = accumulate_samples(CPU, torch.float32, [16, 32], layers=1)
    assert [r["bytes"] for r in adds] == [3 * 4 * (8 * h * h + 7 * h) for h in (16, 32)]
    costs, _, _ = runtime_costs(host, gpu_fits(gpu, make_profile()), adds, 1e-4, p2p_s=1e-5, p2p_carried=False,
                                ratios=gpu_ratios(gpu, make_profile()))
    assert set(costs["graphs"].gpu_ratios) == {"mlp@16"}
    profile = dataclasses.replace(make_profile(bandwidth_Bps=1e10), runtimes=costs)
    assert from_json(profile.to_json()).runtimes == costs


def test_calibrate_names_the_runtimes_it_measures(tmp_path, capsys):
    from clirun import run

    from hw.__main__ import main

    status, _, err = run(main, ["calibrate", "--cpu", "--runtimes", "nonsense", "--out", str(tmp_path / "p.json")],
                         capsys)  # in this process: refused before anything is measured
    assert status == 2 and err.startswith("error: no calibration for runtime(s) nonsense") and "graphs" in err


def test_stage_corrections_make_the_costs_reproduce_the_stages_and_keep_the_backward_split():
    """A stage of n blocks measured 1.3x the layer costs' forward and 0.8x their backward: the corrected costs give
    those times per block at the sampled sizes, input-grad and weight-grad in the layer probes' proportion."""
    from hw.calibrate.stage_probe import stage_corrections
    from parsim.profile import LayerCosts, OpCost
    from parsim.workload import Layer

    h, n = 64, 8
    costs = {"mlp@64": LayerCosts(OpCost(0.0, 1e-5, 1e12), OpCost(0.0, 2e-5, 1e12), OpCost(0.0, 1e-5, 5e11))}
    layer = Layer("mlp", h)
    rows = []
    for tokens in (16, 64, 256):
        w = layer.flops_per_token * tokens
        c = costs["mlp@64"]
        rows.append({"hidden": h, "tokens": tokens, "layers": n, "eager_forward_s": 1.3 * n * c.forward.gpu_s(w),
                     "eager_backward_s": 0.8 * n * (c.backward_input.gpu_s(w) + c.backward_weight.gpu_s(w))})
    fixed = stage_corrections(costs, rows)["mlp@64"]
    for r in rows:
        w = layer.flops_per_token * r["tokens"]
        assert fixed.forward.gpu_s(w) * n == pytest.approx(r["eager_forward_s"])
        assert (fixed.backward_input.gpu_s(w) + fixed.backward_weight.gpu_s(w)) * n == pytest.approx(r["eager_backward_s"])
        assert fixed.backward_input.gpu_s(w) / fixed.backward_weight.gpu_s(w) == pytest.approx(
            costs["mlp@64"].backward_input.gpu_s(w) / costs["mlp@64"].backward_weight.gpu_s(w))
