"""Recomputation (parsim.workload.recompute): the step and memory against closed forms, both engines alike, the
calibrated host cost, the commands' flags (the engines with recomputation on random steps: tests/test_shortcuts.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from clirun import one_error_line, run
from conftest import equal_stages, make_profile

from parsim.cli import main
from parsim.schedules import build
from parsim.sim.lower import peak_held_bytes
from parsim.sim.predict import simulate
from parsim.workload import mlp_model, rank_peak_bytes
from parsim.workload.recompute import MODES, recomputes, recomputing_actions

T_F, T_B = 0.003, 0.0045


@pytest.mark.parametrize("mode,m", [(mode, m) for mode in MODES for m in (1, 2, 5, 8)])
def test_one_gpu_step_grows_by_one_forward_per_recomputed_microbatch(mode, m, free_profile):
    """GPU-bound on one GPU: m (t_f + t_b), plus t_f for each recomputed micro-batch (all, all but the last, none)."""
    sim = simulate(build("gpipe", 1, m), equal_stages(1, T_F, T_B), free_profile, recompute=mode)
    redone = {"never": 0, "except-last": m - 1, "always": m}[mode]
    assert sim.step_time_s == pytest.approx(m * (T_F + T_B) + redone * T_F, rel=1e-12)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (3, 5)])
def test_recomputing_every_microbatch_is_a_backward_one_forward_longer(name, p, m, free_profile):
    """With free messages and host, GPipe and 1F1B take (m + p - 1)(t_f + t_b); recomputing all, t_b + t_f for t_b."""
    sim = simulate(build(name, p, m), equal_stages(p, T_F, T_B), free_profile, recompute="always")
    assert sim.step_time_s == pytest.approx((m + p - 1) * (2 * T_F + T_B), rel=1e-12)


@pytest.mark.parametrize("name,p,m", [("gpipe", 2, 4), ("1f1b", 4, 8), ("zb-h1", 2, 4), ("interleaved-1f1b", 2, 4)])
@pytest.mark.parametrize("mode", ["except-last", "always"])
def test_both_engines_agree_to_the_bit_with_recomputation(name, p, m, mode):
    profile = replace(make_profile(latency_s=20e-6, bandwidth_Bps=1e11, action_s=30e-6, p2p_s=10e-6),
                      host=replace(make_profile().host, action_s=30e-6, p2p_s=10e-6, recompute_s=40e-6,
                                   recompute_call_s=300e-6))
    schedule = build(name, p, m)
    costs = [replace(c, layers=3) for c in equal_stages(schedule.num_stages, T_F, T_B, host_s=1e-3)]
    walked = simulate(schedule, costs, profile, recompute=mode, engine="longest-path")
    machine = simulate(schedule, costs, profile, recompute=mode, engine="events")
    assert walked.step_time_s == machine.step_time_s
    assert walked.busy_s == machine.busy_s


@pytest.mark.parametrize("call_s,per_layer_s", [(0.0, 0.0), (300e-6, 0.0), (500e-6, 40e-6)])
def test_a_host_bound_step_grows_by_each_recomputed_microbatchs_host_cost(call_s, per_layer_s):
    """GPU free, host slow: one GPU's step grows by m x (call_s + layers x per-layer), or by m forwards' launches
    where the profile has no calibrated cost."""
    m, layers, host_s = 6, 3, 2e-3
    host = replace(make_profile().host, action_s=50e-6, recompute_s=per_layer_s, recompute_call_s=call_s)
    profile = replace(make_profile(), host=host)
    costs = [replace(c, layers=layers) for c in equal_stages(1, 0.0, 0.0, host_s=host_s)]
    never = simulate(build("gpipe", 1, m), costs, profile).step_time_s
    always = simulate(build("gpipe", 1, m), costs, profile, recompute="always").step_time_s
    each = call_s + layers * per_layer_s if call_s or per_layer_s else host_s
    assert always - never == pytest.approx(m * each, rel=1e-9)


def test_except_last_spares_only_the_last_microbatch():
    assert [recomputes("except-last", i, 4) for i in range(4)] == [True, True, True, False]
    schedule = build("zb-h1", 2, 4)
    assert {a.op for a in recomputing_actions(schedule, "always")} == {"I"}  # a split backward recomputes at I
    assert recomputing_actions(schedule, "never") == []


@pytest.mark.parametrize("m", [2, 4, 8])
def test_gpipe_holds_inputs_and_one_stash_when_recomputing(m):
    """GPipe: m stashes without recomputation; recomputing all, m - 1 inputs and the one stash its first backward
    rebuilds; except-last also keeps the last micro-batch's stash, still held when that first backward (of
    micro-batch 0: parsim's GPipe runs its backwards in forward order) rebuilds another."""
    schedule, stash, given = build("gpipe", 2, m), [1000, 1000], [0, 300]
    assert peak_held_bytes(schedule, stash) == [m * 1000, m * 1000]
    assert peak_held_bytes(schedule, stash, "always", given) == [1000, (m - 1) * 300 + 1000]
    assert peak_held_bytes(schedule, stash, "except-last", given) == [2000, (m - 2) * 300 + 2000]


@pytest.mark.parametrize("m", [2, 4, 16])
def test_recomputing_on_one_gpu_holds_what_one_microbatch_holds(m):
    """One stage (its input the batch, not counted), Adam's state held all step: every micro-batch recomputed holds
    at its peak what a one-micro-batch step of the same size holds (without Adam, the gradients the first backward
    made are held through the later ones: more)."""
    model, samples = mlp_model(4, 256, 64 * m), 64
    one = rank_peak_bytes(model, build("gpipe", 1, 1), samples)
    assert rank_peak_bytes(model, build("gpipe", 1, m), samples, "adam", "always") == one
    assert rank_peak_bytes(model, build("gpipe", 1, m), samples, "adam", "never") > one


def test_predict_says_what_it_recomputes_and_keeps_its_default_output(capsys):
    def predicted(*flags: str) -> dict:
        status, out, err = run(main, ["predict", "--gpus", "2", "--json", *flags], capsys)
        assert status == 0, err
        return json.loads(out)

    plain, again, redone = predicted(), predicted("--recompute", "never"), predicted("--recompute", "always")
    assert "recompute" not in plain and plain == again
    assert redone["recompute"] == "always"
    assert redone["step_time_s"] > plain["step_time_s"]
    assert max(g["peak_activation_bytes"] for g in redone["per_gpu"]) < \
        max(g["peak_activation_bytes"] for g in plain["per_gpu"])
    status, out, _ = run(main, ["predict", "--recompute", "always"], capsys)
    assert status == 0 and "recomputing every micro-batch's forward" in out


def test_an_unknown_recompute_mode_is_one_line_and_exit_2(capsys):
    one_error_line(*run(main, ["predict", "--recompute", "sometimes"], capsys), "sometimes")
