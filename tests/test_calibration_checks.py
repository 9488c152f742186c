"""A calibration that holds (issue 50): failed layer fits are not used as fitted, predictions say when they lean on
one kept, and calibrate predicts its own probes' steps before it writes, refusing past a bound."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("torch")

from hw.calibrate.fallback import (  # noqa: E402
    GPU_RATE_MAX,
    Fallback,
    carry_failed,
    describe,
    failure,
    fall_back,
    layer_fit,
)
from hw.calibrate.fit import Fit, fit_affine  # noqa: E402
from hw.calibrate.self_check import BOUND, self_check, verdict  # noqa: E402
from parsim.configuration import Configuration, predict  # noqa: E402
from parsim.errors import ParsimError  # noqa: E402
from parsim.profile import LayerCosts, OpCost, load_profile  # noqa: E402
from parsim.workload import mlp_model  # noqa: E402

GOOD = Fit(10e-6, 5e14, 0.999, 0.05)


def _costs(rate: float) -> LayerCosts:
    return LayerCosts(*[OpCost(50e-6, 10e-6, rate)] * 3)


@pytest.mark.parametrize("fit,why", [
    (Fit(300e-6, 9.88e21, -0.3185, 0.465), "R^2"),  # the llama weight-grad fit of issue 50
    (Fit(10e-6, 5e14, 0.99, 1.5), "worst residual"),
    (Fit(10e-6, 2 * GPU_RATE_MAX, 0.999, 0.05), "past any GPU"),
])
def test_a_fit_fails_by_its_r2_its_worst_residual_or_a_rate_past_any_gpu(fit, why):
    assert why in failure(fit, gpu=True)
    assert failure(GOOD, gpu=True) is None
    assert failure(dataclasses.replace(GOOD, rate=2 * GPU_RATE_MAX), gpu=False) is None  # a CPU's rates: no bound


def test_fit_names_map_to_the_layer_key_and_op_they_price():
    layers = {k: _costs(1e14) for k in ("mlp", "mlp@256", "conv@64x56", "llama")}
    assert layer_fit("forward", layers) == ("mlp", "forward")
    assert layer_fit("backward_weight@256", layers) == ("mlp@256", "backward_weight")
    assert layer_fit("conv@64x56 backward_input", layers) == ("conv@64x56", "backward_input")
    assert layer_fit("llama backward_weight", layers) == ("llama", "backward_weight")
    assert layer_fit("host hw whole steps", layers) is None and layer_fit("link nvlink", layers) is None
    assert layer_fit("forward@512", layers) is None  # no such key: nothing it prices


def test_a_failed_fit_falls_back_to_its_kind_then_the_base_then_is_kept_and_named():
    layers = {"mlp": _costs(4e14), "mlp@256": _costs(1e14), "llama": _costs(3e14), "gpt": _costs(2e14)}
    base = dataclasses.replace(load_profile(None), layers={"llama": _costs(6e14)})
    bad = Fit(300e-6, 9.88e21, -0.3, 0.5)
    fits = {"forward": GOOD, "backward_weight@256": bad, "llama backward_weight": bad, "gpt forward": bad}
    out, done = fall_back(layers, fits, base, gpu=True)
    by = {(f.key, f.op): f.used for f in done}
    assert by == {("mlp@256", "backward_weight"): "kind", ("llama", "backward_weight"): "base",
                  ("gpt", "forward"): "kept"}
    assert out["mlp@256"].backward_weight == layers["mlp"].backward_weight
    assert out["mlp@256"].forward == layers["mlp@256"].forward  # only the failed op is replaced
    assert out["llama"].backward_weight == base.layers["llama"].backward_weight
    assert out["gpt"] == layers["gpt"] and layers["llama"].backward_weight.flops_per_s == 3e14  # the input is untouched
    assert any("carried from the base" in describe(f) for f in done)
    # without a base (a CPU calibration) nothing is carried
    _, cpu = fall_back(layers, fits, None, gpu=False)
    assert {(f.key, f.used) for f in cpu} >= {("llama", "kept")}


def test_a_failed_fit_with_samples_is_priced_by_them_first_exact_at_each_and_linear_beyond():
    # the embedding weight-grad of data/calibration/h200-2026-11-28-hostbound-first (R^2 0.930): time grows slower
    # than work at small sizes, so no affine law holds; tokens as work, seconds
    work = [1048576.0, 2097152.0, 4194304.0, 8388608.0]
    seconds = [118.2e-6, 163.7e-6, 223.9e-6, 282.9e-6]
    fit = fit_affine(work, seconds)
    assert failure(fit, gpu=True) is not None
    slow = 1.25  # an in-step slowdown applied after the fit (layers.stretched) stays applied
    stretched = OpCost(7e-6, fit.fixed_s * slow, fit.rate / slow)
    layers = {"embed@32000x1024": LayerCosts(stretched, stretched, stretched), "embed": _costs(1e12)}
    out, done = fall_back(layers, {"embed@32000x1024 backward_weight": fit}, None, gpu=True)
    assert [(f.key, f.op, f.used) for f in done] == [("embed@32000x1024", "backward_weight", "points")]
    cost = out["embed@32000x1024"].backward_weight
    assert cost.host_s == 7e-6 and out["embed@32000x1024"].forward == stretched
    for w, t in zip(work, seconds):
        assert cost.gpu_s(w) == pytest.approx(slow * t, rel=1e-12)
    per_work = slow * (seconds[3] - seconds[2]) / (work[3] - work[2])  # beyond: the two largest samples' line
    assert cost.gpu_s(4 * work[3]) == pytest.approx(slow * seconds[3] + per_work * 3 * work[3], rel=1e-12)
    assert "priced by its samples" in describe(done[0])


def test_a_failed_fit_whose_cost_follows_its_shape_keeps_those_values_and_a_falling_top_goes_through_zero():
    fit = Fit(1e-6, 1e15, 0.5, 0.6, ((1e9, 2e-3), (2e9, 1e-3)))
    followed = OpCost(0.0, 1e-4, 1e13, ((1e9, 0.5), (4e9, 1.5)))  # stage corrections; priced 0.055 s and 0.6 s at them
    out, _ = fall_back({"mlp@256": LayerCosts(followed, followed, followed)}, {"forward@256": fit}, None, gpu=True)
    cost = out["mlp@256"].forward
    for w, _ in followed.corrections:
        assert cost.gpu_s(w) == pytest.approx(followed.gpu_s(w), rel=1e-12)
    falling = Fit(1e-6, 1e15, 0.5, 0.6, ((1e9, 2e-3), (2e9, 1e-3)))  # noise: the larger size timed faster
    out, _ = fall_back({"mlp@256": _costs(falling.rate)}, {"forward@256": falling}, None, gpu=True)
    assert out["mlp@256"].forward.fixed_s == 0 and out["mlp@256"].forward.gpu_s(4e9) == pytest.approx(2e-3)


def test_a_failed_link_or_recompute_host_fit_is_carried_from_the_base_and_said():
    # data/calibration/nvidia-h200-x2-2026-11-28: pageable host-to-device copies fitted with R^2 0.750
    shipped = load_profile(None)
    base = dataclasses.replace(shipped, host=dataclasses.replace(shipped.host, recompute_s=4e-4, recompute_call_s=6e-3))
    mine = dataclasses.replace(base, links={**base.links, "h2d_pageable": dataclasses.replace(
        base.links["h2d_pageable"], bandwidth_Bps=1e9)}, host=dataclasses.replace(base.host, recompute_s=1.0))
    fits = {"link h2d_pageable": Fit(17e-6, 1e10, 0.750, 0.455), "link nvlink": GOOD,
            "host hw recompute": Fit(1e-3, 1e3, 0.5, 0.3), "forward": Fit(1e-6, 1e14, 0.5, 0.3)}
    out, done = carry_failed(mine, fits, base)
    assert out.links["h2d_pageable"] == dataclasses.replace(base.links["h2d_pageable"], measured=False)
    assert out.links["nvlink"] == mine.links["nvlink"]
    assert (out.host.recompute_s, out.host.recompute_call_s) == (base.host.recompute_s, base.host.recompute_call_s)
    assert [(f.key, f.used) for f in done] == [("link h2d_pageable", "base"), ("host.recompute_s", "base")]
    _, cpu = carry_failed(mine, fits, None)
    assert {f.used for f in cpu} == {"kept"}


def test_a_prediction_says_when_it_leans_on_a_kept_poor_fit():
    profile = load_profile(None)
    kept = Fallback("forward@2048", "mlp@2048", "forward", "R^2 0.512 < 0.97", "kept")
    leaning = dataclasses.replace(profile, meta={**profile.meta, "fallbacks": [dataclasses.asdict(kept)]})
    model = mlp_model(8, 2048, 4096)
    noted = predict(Configuration(model, "gpipe", 2, 4), leaning)[0].profile
    assert "mlp@2048 forward: a poor fit (R^2 0.512 < 0.97)" in noted
    assert "poor fit" not in predict(Configuration(mlp_model(8, 1024, 4096), "gpipe", 2, 4), leaning)[0].profile
    assert "poor fit" not in predict(Configuration(model, "gpipe", 2, 4), profile)[0].profile
    carried = dataclasses.replace(kept, used="base")
    leaning = dataclasses.replace(profile, meta={**profile.meta, "fallbacks": [dataclasses.asdict(carried)]})
    assert "mlp@2048 forward: carried from another calibration" in predict(Configuration(model, "gpipe", 2, 4),
                                                                            leaning)[0].profile


def _rows(profile, scale: float = 1.0) -> list[dict]:
    """hw's probe rows as host_steps.probe_rows writes them, each step the profile's own prediction times scale."""
    from hw.calibrate.host import host_stage

    rows = []
    for k in (1, 4):
        for m in (4, 8):
            for schedule in ("gpipe", "1f1b"):
                config = Configuration(host_stage("mlp", k, 8 * m), schedule, 1, m)
                rows.append({"runtime": "hw", "schedule": schedule, "stages": 1, "microbatches": m, "layers": k,
                             "step_s": scale * predict(config, profile)[0].step_time_s})
    return rows


def test_calibrate_predicts_its_own_probes_and_refuses_a_profile_past_the_bound_unless_forced():
    profile = load_profile(None)
    held = self_check(profile, _rows(profile))
    assert held is not None and held.passed and held.worst < 1e-9
    assert verdict(held, "p.json", force=False) == held.meta()
    off = self_check(profile, _rows(profile, scale=2.0))  # steps twice what the profile says: a broken level
    assert off is not None and not off.passed and off.worst == pytest.approx(0.5) and off.worst > BOUND
    with pytest.raises(ParsimError, match="not written; pass --force"):
        verdict(off, "p.json", force=False)
    assert verdict(off, "p.json", force=True)["forced"] is True
    assert verdict(off, "p.json", force=False, enforced=False)["passed"] is False  # the CPU's: recorded only
    assert self_check(profile, [{**r, "runtime": "torch"} for r in _rows(profile)]) is None
