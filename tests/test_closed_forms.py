"""The simulator against closed forms: with free communication and dispatch it must be exact."""

from __future__ import annotations

import pytest
from conftest import equal_stages

from parsim.schedules import build
from parsim.sim.lower import peak_held_bytes, peak_stashed_microbatches
from parsim.sim.predict import predict, simulate
from parsim.workload import StageCost, Work, mlp_model

GRID = [(p, m) for p in (1, 2, 3, 4, 8) for m in (1, 2, 3, 5, 8, 16)]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", GRID)
@pytest.mark.parametrize("t_f,t_b", [(1.0, 2.0), (0.003, 0.0045)])
def test_step_matches_closed_form_when_comm_and_dispatch_are_free(name, p, m, t_f, t_b, free_profile):
    sim = simulate(build(name, p, m), equal_stages(p, t_f, t_b), free_profile)
    assert sim.step_time_s == pytest.approx((m + p - 1) * (t_f + t_b), rel=1e-12)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", GRID)
def test_bubble_matches_closed_form_when_comm_and_dispatch_are_free(name, p, m, free_profile):
    layers = 2 * p  # equal stages; the profile's mlp costs are pure FLOPs, so stages are equal too
    prediction, _ = predict(build(name, p, m), mlp_model(layers, 64, 64 * m), free_profile)
    assert prediction.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
    for gpu in prediction.per_gpu:
        assert gpu.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)


@pytest.mark.parametrize("p,m", GRID)
def test_gpipe_holds_all_microbatches_on_every_stage(p, m):
    assert peak_stashed_microbatches(build("gpipe", p, m)) == [m] * p


@pytest.mark.parametrize("p,m", GRID)
def test_1f1b_holds_at_most_p_minus_s_microbatches_on_stage_s(p, m):
    assert peak_stashed_microbatches(build("1f1b", p, m)) == [min(p - s, m) for s in range(p)]


def test_peak_activation_bytes_are_stash_times_held_microbatches(free_profile):
    model = mlp_model(layers=4, hidden=64, tokens=64 * 8)
    prediction, _ = predict(build("1f1b", 4, 8), model, free_profile)
    per_mb = model.layers[0].stash_bytes_per_token * (model.tokens // 8)  # one layer per stage
    assert [g.peak_activation_bytes for g in prediction.per_gpu] == [4 * per_mb, 3 * per_mb, 2 * per_mb, per_mb]


def test_single_gpu_speedup_is_one_when_everything_is_free(free_profile):
    prediction, _ = predict(build("gpipe", 1, 1), mlp_model(4, 64, 256), free_profile)
    assert prediction.speedup == pytest.approx(1.0)


def test_speedup_approaches_p_with_many_microbatches_when_comm_is_free(free_profile):
    p, m = 4, 64
    prediction, _ = predict(build("1f1b", p, m), mlp_model(8, 64, 64 * m), free_profile)
    assert prediction.speedup == pytest.approx(p * m / (m + p - 1), rel=1e-9)


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 8, 4), (3, 9, 3), (4, 16, 2), (1, 3, 2)])
def test_interleaving_divides_the_bubble_by_v(p, m, v, free_profile):
    """Free comm, equal chunks of t/v: the step is m(t_f+t_b) + (p-1)(t_f+t_b)/v."""
    t_f, t_b = 1.0, 2.0
    sim = simulate(build("interleaved-1f1b", p, m, v), equal_stages(p * v, t_f / v, t_b / v), free_profile)
    assert sim.step_time_s == pytest.approx(m * (t_f + t_b) + (p - 1) * (t_f + t_b) / v, rel=1e-12)


@pytest.mark.parametrize("p,m", [(p, m) for p in (1, 2, 3, 4, 8) for m in (p, p + 1, 2 * p, 16) if m >= p])
@pytest.mark.parametrize("t_f,t_i,t_w", [(1.0, 1.0, 1.0), (1.0, 1.2, 0.8), (2.0, 1.0, 0.5)])
def test_zb_h1_bubble_is_p_minus_1_times_tf_plus_ti_minus_tw(p, m, t_f, t_i, t_w, free_profile):
    """Qi et al.: ZB-H1's step is m(T_F+T_I+T_W) + (p-1)(T_F+T_I-T_W) when T_W <= T_I and m >= p."""
    stages = [StageCost(Work(t_f, 0, 1), Work(t_i, 0, 1), Work(t_w, 0, 1), 1, 1) for _ in range(p)]
    sim = simulate(build("zb-h1", p, m), stages, free_profile)
    assert sim.step_time_s == pytest.approx(m * (t_f + t_i + t_w) + (p - 1) * (t_f + t_i - t_w), rel=1e-12)


@pytest.mark.parametrize("p,m", [(4, 8), (8, 16), (4, 4)])
def test_zb_h1_has_a_third_of_1f1b_bubble_at_1f1b_peak_memory(p, m, free_profile):
    t = 1.0
    stages = [StageCost(Work(t, 0, 1), Work(t, 0, 1), Work(t, 0, 1), 1, 1) for _ in range(p)]
    zb = simulate(build("zb-h1", p, m), stages, free_profile).step_time_s - 3 * m * t
    ofob = simulate(build("1f1b", p, m), stages, free_profile).step_time_s - 3 * m * t
    assert zb == pytest.approx(ofob / 3)
    assert max(peak_stashed_microbatches(build("zb-h1", p, m))) == max(peak_stashed_microbatches(build("1f1b", p, m)))


def test_a_gpus_peak_is_what_its_stages_hold_together_not_the_sum_of_their_peaks(free_profile):
    """ZB-V's stages r and 2p-1-r peak at 2p-r and r+1 chunk-micro-batches, but never at once."""
    p, m = 4, 8
    model = mlp_model(layers=2 * p, hidden=64, tokens=64 * m)
    schedule = build("zbv", p, m)
    prediction, _ = predict(schedule, model, free_profile)
    per_mb = model.layers[0].stash_bytes_per_token * (model.tokens // m)  # one layer per stage
    stage_peaks = peak_stashed_microbatches(schedule)
    assert [stage_peaks[r] + stage_peaks[2 * p - 1 - r] for r in range(p)] == [2 * p + 1] * p
    assert [g.peak_activation_bytes for g in prediction.per_gpu] == [2 * p * per_mb] * p


def _split_stages(n: int, t_f: float, t_i: float, t_w: float) -> list[StageCost]:
    return [StageCost(Work(t_f, 0, 1), Work(t_i, 0, 1), Work(t_w, 0, 1), 1, 1) for _ in range(n)]


@pytest.mark.parametrize("p", range(1, 9))
@pytest.mark.parametrize("t", [1.0, 0.003])
def test_zbv_step_is_its_lower_bound_when_forward_input_and_weight_grad_take_alike(p, t, free_profile):
    """Per chunk T_F = T_I = T_W = t: rank p-1 cannot start before the first micro-batch has crossed
    p-1 chunks ((p-1)t), then has 2m chunk passes of 3t to run; ZB-V idles no more, once
    m >= (3p-1)/2. (The paper's zero bubble counts across steps, where the next step's forwards
    would fill that first wait; parsim simulates one step, ended by a sync.)"""
    for m in range((3 * p) // 2, 3 * p + 2):
        sim = simulate(build("zbv", p, m), _split_stages(2 * p, t, t, t), free_profile)
        assert sim.step_time_s == pytest.approx(6 * m * t + (p - 1) * t, rel=1e-12), f"m={m}"


@pytest.mark.parametrize("p,m", [(4, 8), (8, 16), (4, 16)])
def test_zbv_idles_half_as_long_as_zb_h1_at_1f1b_peak_memory(p, m, free_profile):
    """Stages of 2t per pass on ZB-H1 (chunks of t on ZB-V): ZB-H1 idles (p-1)(T_F+T_I-T_W) = 2(p-1)t,
    ZB-V (p-1)t; each GPU holds 2p half-stage micro-batches at most, 1F1B's p whole ones."""
    t = 1.0
    zbv = simulate(build("zbv", p, m), _split_stages(2 * p, t, t, t), free_profile).step_time_s - 6 * m * t
    zb = simulate(build("zb-h1", p, m), _split_stages(p, 2 * t, 2 * t, 2 * t), free_profile).step_time_s - 6 * m * t
    assert zbv == pytest.approx((p - 1) * t) and zb == pytest.approx(2 * (p - 1) * t)
    half_stages = peak_held_bytes(build("zbv", p, m), [1] * (2 * p))
    assert half_stages == [2 * p] * p and max(peak_stashed_microbatches(build("1f1b", p, m))) == p


@pytest.mark.parametrize("p", range(1, 9))
def test_dualpipev_step_is_its_lower_bound_when_forward_input_and_weight_grad_take_alike(p, free_profile):
    """The same bound as ZB-V's, from m = 2p on: its whole backwards (2t) pair with forwards
    and the split ones' weight-grads fill the tail."""
    t = 1.0
    for m in range(2 * p, 4 * p + 1):
        sim = simulate(build("dualpipev", p, m), _split_stages(2 * p, t, t, t), free_profile)
        assert sim.step_time_s == pytest.approx(6 * m * t + (p - 1) * t, rel=1e-12), f"m={m}"


@pytest.mark.parametrize("p,v", [(2, 2), (4, 2), (4, 4), (3, 3), (1, 2), (4, 1)])
def test_looped_bfs_has_interleavings_step_once_there_are_p_microbatches(p, v, free_profile):
    """Breadth first, rank 0 is busy with its first chunk until the first micro-batch comes back round
    (m >= p), so forwards never stall; the backwards run the same way back: m(t_f+t_b) + (p-1)(t_f+t_b)/v."""
    t_f, t_b = 1.0, 2.0
    for m in range(p, 3 * p + 1):
        sim = simulate(build("looped-bfs", p, m, v), equal_stages(p * v, t_f / v, t_b / v), free_profile)
        assert sim.step_time_s == pytest.approx(m * (t_f + t_b) + (p - 1) * (t_f + t_b) / v, rel=1e-12)


@pytest.mark.parametrize("name", ["zb-h1", "zbv", "1f1b"])
def test_a_split_backwards_extra_host_cost_lengthens_a_host_bound_step_by_layers_times_microbatches(name):
    """GPU work free, the host sets the pace: every split micro-batch adds its layers' extra once, a fused one
    nothing."""
    from dataclasses import replace

    from conftest import make_profile

    layers, m, split_s = 8, 4, 1e-3
    model = mlp_model(layers=layers, hidden=8, tokens=16)
    base = make_profile(action_s=1e-4, layer_host_s=1e-4)
    split = replace(base, host=replace(base.host, split_backward_s=split_s))
    schedule = build(name, 1 if name == "zb-h1" else 2, m)
    gpus = schedule.num_ranks
    extra = (predict(schedule, model, split)[0].step_time_s - predict(schedule, model, base)[0].step_time_s)
    expected = 0.0 if name == "1f1b" else m * layers / gpus * split_s
    assert extra == pytest.approx(expected, rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("name,gpus", [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 1), ("zb-h1", 1),
                                       ("gpipe", 2)])
@pytest.mark.parametrize("m", [1, 4])
def test_a_stages_first_backward_of_a_step_saves_its_gradient_adds_once(name, gpus, m):
    """GPU work free, the host sets the pace: .grad is None until a stage's first gradient action, which adds
    nothing in, so a step is shorter by grad_add_s for each layer of the busiest rank, whatever the micro-batches."""
    from dataclasses import replace

    from conftest import make_profile

    layers, grad_add_s = 8, 2e-5
    model = mlp_model(layers=layers, hidden=8, tokens=16)
    base = make_profile(action_s=1e-4, layer_host_s=1e-4)
    adding = replace(base, host=replace(base.host, grad_add_s=grad_add_s))
    schedule = build(name, gpus, m)
    saved = predict(schedule, model, base)[0].step_time_s - predict(schedule, model, adding)[0].step_time_s
    assert saved == pytest.approx(layers / gpus * grad_add_s, rel=1e-6)
