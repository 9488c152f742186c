"""The GPU-cost model's pieces: per-shape corrections, widths blended between calibrated ones, autograd's gradient
adds, the graphed runtimes' measured ratios, and the ranking of equally fast configurations."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from conftest import make_profile

from parsim.errors import ProfileError
from parsim.profile import AUTOGRAD_ACCUMULATE, KernelCost, LayerCosts, OpCost, RuntimeCosts, from_json
from parsim.runtimes.base import run_by
from parsim.schedules import gpipe
from parsim.sim.predict import predict
from parsim.workload import Layer, mlp_model, part_costs, stage_costs

POINTS = ((1e9, 1.2), (4e9, 0.9), (1.6e10, 1.0))  # (flops, measured over the fit), rising


def test_corrections_follow_the_samples_and_hold_beyond_them():
    cost = OpCost(0.0, 1e-5, 1e14, POINTS)
    fit = lambda w: 1e-5 + w / 1e14  # noqa: E731
    for w, ratio in POINTS:
        assert cost.gpu_s(w) == pytest.approx(fit(w) * ratio)
    assert cost.gpu_s(2e9) == pytest.approx(fit(2e9) * (1.2 + 0.5 * (0.9 - 1.2)))  # halfway in log flops
    assert cost.gpu_s(1e8) == pytest.approx(fit(1e8) * 1.2)
    assert cost.gpu_s(1e12) == pytest.approx(fit(1e12) * 1.0)


def test_corrections_round_trip_and_must_rise():
    profile = make_profile(bandwidth_Bps=1e11)
    mlp = profile.layers["mlp"]
    corrected = dataclasses.replace(profile, layers={"mlp": LayerCosts(dataclasses.replace(mlp.forward, corrections=POINTS),
                                                                       mlp.backward_input, mlp.backward_weight)})
    doc = json.loads(json.dumps(corrected.to_json()))
    assert from_json(doc).layers["mlp"].forward.corrections == POINTS
    doc["layers"]["mlp"]["forward"]["corrections"] = [[4e9, 1.0], [1e9, 1.0]]
    with pytest.raises(ProfileError, match="rising"):
        from_json(doc)


def _with_widths(*widths: int, rate=lambda h: 1e12 * h) -> object:
    """A profile costing MLP blocks at these widths only, a width's matmul rate growing with it."""
    layers = {f"mlp@{h}": LayerCosts(*(OpCost(0.0, 1e-5, rate(h)),) * 3) for h in widths}
    return dataclasses.replace(make_profile(), layers={**make_profile().layers, **layers})


def test_a_width_between_two_calibrated_ones_blends_their_times_at_the_same_tokens():
    profile = _with_widths(256, 1024)
    blended = part_costs(profile, Layer("mlp", 512).parts[0]).forward
    tokens = 2048
    low = profile.layers["mlp@256"].forward.gpu_s(Layer("mlp", 256).flops_per_token * tokens)
    high = profile.layers["mlp@1024"].forward.gpu_s(Layer("mlp", 1024).flops_per_token * tokens)
    assert blended.gpu_s(Layer("mlp", 512).flops_per_token * tokens) == pytest.approx(math.sqrt(low * high))


def test_a_width_outside_the_calibrated_ones_takes_the_kinds_fit():
    profile = _with_widths(256, 1024)
    assert part_costs(profile, Layer("mlp", 4096).parts[0]) is profile.layers["mlp"]
    assert part_costs(profile, Layer("mlp", 1024).parts[0]) is profile.layers["mlp@1024"]


def test_autograd_adds_each_later_micro_batch_into_a_stage():
    """One GPU, GPU-bound (no host cost): m micro-batches add m-1 times layers x fixed + 3 x gradient bytes / rate."""
    model, m = mlp_model(4, 64, 64), 4
    bare = make_profile()
    add = KernelCost(2e-6, 1e9)
    priced = dataclasses.replace(bare, kernels={AUTOGRAD_ACCUMULATE: add})
    schedule = gpipe(1, m)
    (cost,) = stage_costs(model, 1, m, bare)
    grown = predict(schedule, model, priced)[0].step_time_s - predict(schedule, model, bare)[0].step_time_s
    assert grown == pytest.approx((m - 1) * (cost.layers * add.fixed_s + 3 * cost.grad_bytes / add.rate))


def test_a_runtime_prices_its_measured_shapes_by_their_ratios_and_the_others_by_its_scales():
    profile = _with_widths(256)
    ratios = {"mlp@256": {"forward": ((1e6, 0.5), (1e9, 0.5)), "backward": ((1e6, 0.8), (1e9, 0.8))}}
    spec = RuntimeCosts(0.0, 0.0, gpu_scale=2.0, gpu_ratios=ratios)
    run = run_by(profile, "graphs", spec)
    w = 1e7
    assert run.layers["mlp@256"].forward.gpu_s(w) == pytest.approx(0.5 * profile.layers["mlp@256"].forward.gpu_s(w))
    assert run.layers["mlp@256"].backward_weight.gpu_s(w) == pytest.approx(
        0.8 * profile.layers["mlp@256"].backward_weight.gpu_s(w))
    assert run.layers["mlp"].forward.gpu_s(w) == pytest.approx(2.0 * profile.layers["mlp"].forward.gpu_s(w))
