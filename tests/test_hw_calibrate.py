"""`python -m hw calibrate`: a small CPU calibration writes a loadable profile; fits; refusals."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hw.calibrate.fit import fit_affine
from hw.calibrate.host import host_costs
from hw.calibrate.layers import fitted_costs, layer_costs, stretched
from hw.calibrate.links import BESIDE_ROUNDS, compute_share
from hw.calibrate.transformer import attention_costs  # noqa: E402
from hw.calibrate.transformer import layer_costs as transformer_costs
from hw.timing import LEAD_MARGIN, duty_lead_s, slowest_issue_s  # noqa: E402
from parsim.profile import load_profile  # noqa: E402
from parsim.schedules import build  # noqa: E402
from parsim.sim.predict import predict  # noqa: E402
from parsim.workload import conv_model, model_from_spec, partitioned  # noqa: E402


def test_compute_share_is_what_compute_loses_beside_an_all_reduce_over_the_all_reduce_alone():
    assert compute_share({"compute": [10.0, 10.2], "allreduce": [4.0, 4.0], "beside": [12.6, 12.8]}) == \
        pytest.approx(0.65)  # medians: (12.7 - 10.1) / 4
    assert compute_share({"compute": [10.0], "allreduce": [4.0], "beside": [9.9]}) == 0.0  # hidden, not negative
    assert compute_share({"compute": [10.0], "allreduce": [4.0], "beside": [15.0]}) == 1.0  # at most the all-reduce


def _calibrate(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hw", "calibrate", *argv], capture_output=True, text=True, timeout=300)


def _hw_here(capsys, *argv: str):
    """`python -m hw ARGV` run in this process (a refusal: no torch start-up of a subprocess); its status, stderr."""
    from clirun import run

    from hw.__main__ import main

    status, _, err = run(main, list(argv), capsys)
    return status, err


def test_cpu_calibration_writes_a_loadable_profile_and_its_samples(tmp_path):
    out = tmp_path / "p.json"
    r = _calibrate("--cpu", "--gpus", "2", "--conv", "--runtimes", "torch", "--out", str(out),
                   "--transformer", "llama:4:16:2:32:4:2:64:128")
    assert r.returncode == 0, r.stderr
    profile = load_profile(out)
    assert profile.links["nvlink"].measured and profile.links["h2d_pinned"].measured
    assert not profile.links["network"].measured and profile.provisional  # nothing measures a network here
    assert "allreduce" in profile.collectives and profile.host.launch_s > 0
    # tensor parallelism's collectives at its sizes too (hw.calibrate.tp_collectives), each measured
    assert all(profile.collectives[f"tp_{k}"].measured for k in ("allreduce", "reduce_scatter", "all_gather"))
    samples = json.loads((tmp_path / "p.samples.json").read_text())
    # the all-reduce beside compute, in turns on every rank: what it takes from the compute, within [0, 1]
    beside = samples["samples"]["gpu_links"]["beside"]
    assert {len(v) for v in beside.values()} == {BESIDE_ROUNDS} and 0 <= profile.collectives["allreduce"].compute_share <= 1
    assert samples["samples"]["layers"] and samples["meta"]["fits"]["forward"]["r2"] <= 1
    assert "R^2" in r.stdout
    # gloo processes measured the posting cost; a CPU says nothing of a GPU node, so its size is carried
    assert "host.p2p_s" not in profile.meta["carried_from_base"] and profile.host.p2p_s > 0
    # the slowest of the 2 ranks' loops, measured on tiny pipelines of both ranks: its excess and provenance
    spread = samples["samples"]["rank_spread"]
    assert {r["schedule"] for r in spread["rows"]} == {"gpipe", "1f1b"} and len(spread["rows"][0]["loops_s"]) == 2
    assert profile.meta["rank_spread"]["ranks"] == 2
    # hw's GPipe stepped with every micro-batch recomputed, beside the same without: its host cost, fitted apart
    assert any(r.get("recomputed") for r in samples["samples"]["host_steps"])
    assert profile.host.recompute_s >= 0 and profile.host.recompute_call_s >= 0
    assert "host hw recompute" in samples["meta"]["fits"]
    # its own probes' steps predicted before it wrote (recorded, not enforced on a CPU); failed fits named
    assert profile.meta["self_check"]["rows"] and "self-check: the profile predicts its" in r.stdout
    assert isinstance(samples["samples"]["fallbacks"], list)
    assert profile.host.rank_spread == pytest.approx(max(spread["excess"], 0) * math.sqrt(math.pi))  # / E[max of 2]
    assert "ranks' host loops" in r.stdout
    assert "gpus_per_node" in profile.meta["carried_from_base"]
    # no GPU to measure compute beside a waiting kernel: the base's rate, carried and named
    assert profile.resident_comm == load_profile().resident_comm
    assert "resident_comm" in profile.meta["carried_from_base"]
    # --conv: each kind and each shape of the (tiny, on the CPU) conv net, with its own host cost per layer
    assert {"conv", "conv@4x8", "conv@8x4", "down", "down@8x4"} <= profile.layers.keys()
    assert profile.layers["conv"].forward.host_s > 0 and "conv@8x4 forward" in samples["meta"]["fits"]
    assert {"conv", "down"} == samples["samples"]["host_by_kind"].keys()
    model = conv_model(images=16, widths=(4, 8), blocks=(1, 2), side=8)
    split = partitioned(model, "time", 2, 4, profile)
    prediction, _ = predict(build("1f1b", 2, 4), split, profile)
    assert sum(split.balance) == 3 and prediction.step_time_s > 0 and prediction.sample == "image"
    # --transformer: attention per head dim, the block's matmuls, embedding and head per shape, each kind overall
    assert {"attention", "attention@d8", "llama", "llama@32x64", "embed@128x32", "head@32x128"} <= profile.layers.keys()
    assert profile.layers["llama"].forward.host_s > 0 and profile.layers["attention"].forward.host_s == 0
    assert "attention@d8 backward_input" in samples["meta"]["fits"] and samples["samples"]["transformer"]["attention"]
    assert profile.gpu_memory_bytes is None  # a CPU run: no GPU memory to record
    model = model_from_spec("llama:4:16:2:32:4:2:64:128")
    prediction, _ = predict(build("gpipe", 2, 2), partitioned(model, "time", 2, 2, profile), profile)
    assert prediction.step_time_s > 0 and prediction.sample == "sequence"
    # --runtimes torch: torch's runtime's host costs, fitted and checked, messages posted through its own path
    torch_costs = profile.runtimes["torch"]
    assert torch_costs.layer_host > 0 and "p2p_s" not in torch_costs.unmeasured and torch_costs.p2p_s > 0
    assert samples["meta"]["runtimes"]["torch"]["checked_on"] == "Interleaved1F1B"
    # its posts: batches of one and of two messages timed apart (1F1B posts both), per batch and per message
    calls = samples["samples"]["runtimes"]["torch"]["p2p_calls"]
    assert {n for n, _ in calls} == {1, 2} and torch_costs.batch_s >= 0 and "per batch posted" in r.stdout
    assert {"host torch", "host hw in turns"} <= samples["meta"]["fits"].keys() and "torch runtime:" in r.stdout
    # hw's own host level: its MLP layer's forward + backward host cost is the whole steps' per layer
    level = samples["samples"]["host_level"]
    mlp = profile.layers["mlp"]
    assert mlp.forward.host_s + mlp.backward_input.host_s + mlp.backward_weight.host_s == pytest.approx(
        level["per_layer_s"], rel=1e-6)
    assert profile.host.action_s == level["action_s"] and profile.host.step_s == level["step_s"]
    rows = samples["samples"]["runtimes"]["torch"]["probes"]
    assert {(row["runtime"], row["schedule"]) for row in rows} == {("hw", "gpipe"), ("hw", "1f1b"), ("torch", "gpipe"),
                                                                   ("torch", "1f1b"), ("torch", "interleaved-1f1b")}
    predicted = subprocess.run([sys.executable, "-m", "parsim", "predict", "--runtime", "torch", "--schedule",
                                "interleaved-1f1b", "--gpus", "2", "--profile", str(out), "--json"],
                               capture_output=True, text=True)
    assert predicted.returncode == 0 and json.loads(predicted.stdout)["step_time_s"] > 0, predicted.stderr


def test_calibrate_never_overwrites_without_force(tmp_path, capsys):
    out = tmp_path / "p.json"
    out.write_text("mine")
    status, err = _hw_here(capsys, "calibrate", "--cpu", "--out", str(out))
    assert status == 2 and "exists; pass --force" in err
    assert out.read_text() == "mine"


def test_calibrate_refuses_a_runtime_it_has_no_calibration_for(tmp_path, capsys):
    status, err = _hw_here(capsys, "calibrate", "--cpu", "--runtimes", "tf", "--out", str(tmp_path / "p.json"))
    assert status == 2 and "no calibration for runtime(s) tf" in err and err.count("\n") == 1


def test_calibrate_without_a_gpu_says_so(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    status, err = _hw_here(capsys, "calibrate", "--out", str(tmp_path / "never-written.json"))
    assert status == 2 and not (tmp_path / "never-written.json").exists()
    assert err.strip().splitlines() == [
        "error: no CUDA GPU is visible; calibrate on a GPU machine, or pass --cpu for a small CPU run"]


def test_fit_recovers_fixed_cost_and_rate_from_noisy_timings():
    rng = np.random.default_rng(0)
    work = np.geomspace(1e6, 1e12, 12)
    seconds = (20e-6 + work / 5e14) * (1 + 0.02 * rng.standard_normal(work.size))
    fit = fit_affine(list(work), list(seconds))
    assert fit.fixed_s == pytest.approx(20e-6, rel=0.05) and fit.rate == pytest.approx(5e14, rel=0.05)
    assert fit.r2 > 0.99 and not fit.poor


def test_a_probe_runs_back_to_back_where_its_gpu_outlasts_its_host_else_behind_a_lead_that_matches_the_duty():
    assert duty_lead_s(gpu_s=5e-3, host_s=4e-3) == 0.0  # the host is ahead: back to back, the GPU always busy
    assert duty_lead_s(gpu_s=5e-3, host_s=5e-3) == 0.0
    lead = duty_lead_s(gpu_s=4e-3, host_s=5e-3)  # the host's pace leaves the GPU idle a fifth of the time
    assert lead == pytest.approx(LEAD_MARGIN * 1e-3) and lead >= 1e-3  # the host stays ahead of the GPU
    duty = 4e-3 / (4e-3 + lead)
    assert 4 / 5 * 0.95 < duty <= 4 / 5  # about the step's duty, never busier
    # continuous across the host-GPU crossing: no size jumps between two timings as the host's speed moves
    assert duty_lead_s(5e-3, 5e-3 * (1 + 1e-9)) == pytest.approx(0.0, abs=1e-11)
    # a GPU idle over half the time runs near its top clock: timed fresh, out of a slow host's reach
    assert duty_lead_s(gpu_s=1e-3, host_s=2.5e-3) is None and duty_lead_s(gpu_s=1e-3, host_s=2e-3) is not None


def test_a_lead_comes_from_the_hosts_slowest_issue_and_leaves_the_setup_untimed():
    import time

    issues = iter([0.001, 0.02, 0.001])
    took = slowest_issue_s(lambda: time.sleep(next(issues)), torch.device("cpu"), repeat=3,
                           setup=lambda: time.sleep(0.05))
    assert 0.02 <= took < 0.05


def test_a_poor_fit_says_so():
    fit = fit_affine([1, 2, 3, 4], [1.0, 5.0, 1.0, 5.0])
    assert fit.poor


def test_host_costs_split_per_layer_slope_from_per_action_intercept():
    # host time of an action = per-action part + layers * per-layer part; input-grad is 40% of a backward
    rows = [{"layers": k, "forward_s": 70e-6 + k * 100e-6, "backward_s": 60e-6 + k * 250e-6,
             "input_grad_call_s": 40e-6 * k, "full_grad_call_s": 100e-6 * k} for k in (1, 2, 4, 8)]
    per_layer, action_s, fits = host_costs(rows)
    assert per_layer["forward_s"] == pytest.approx(100e-6, rel=1e-4)
    assert per_layer["backward_s"] == pytest.approx(250e-6, rel=1e-4)
    assert per_layer["backward_input_s"] == pytest.approx(0.4 * 250e-6, rel=1e-4)
    assert action_s == pytest.approx((70e-6 + 60e-6) / 2, rel=1e-3)
    assert not any(f.poor for f in fits.values())


def test_a_split_backwards_extra_host_cost_per_layer_is_its_slope_beyond_forward_and_backward():
    # a split micro-batch (F + I + W) costs 3 actions' intercepts and 100 + 250 + 80 us per layer
    rows = [{"layers": k, "forward_s": 70e-6 + k * 100e-6, "backward_s": 60e-6 + k * 250e-6,
             "input_grad_call_s": 40e-6 * k, "full_grad_call_s": 100e-6 * k,
             "split_s": 200e-6 + k * 430e-6} for k in (1, 2, 4, 8)]
    per_layer, _, fits = host_costs(rows)
    assert per_layer["split_backward_s"] == pytest.approx(80e-6, rel=1e-4)
    assert "host split" in fits


def test_whole_steps_set_the_host_level_and_the_spans_only_each_ops_share():
    from hw.calibrate.host_steps import hw_level, leveled

    # hw's whole steps follow 300 us a step + 90 us an action + 330 us a layer; the spans said 420 us a layer
    rows = [{"runtime": "hw", "schedule": "gpipe", "stages": 1, "microbatches": m, "layers": k,
             "step_s": 300e-6 + 2 * m * 90e-6 + m * k * 330e-6} for k in (1, 2, 4, 8) for m in (4, 8, 16)]
    level = hw_level(rows, spans_per_layer_s=420e-6)
    assert (level.step_s, level.action_s, level.per_layer_s) == pytest.approx((300e-6, 90e-6, 330e-6), rel=1e-3)
    spans = {"forward_s": 120e-6, "backward_input_s": 100e-6, "backward_s": 300e-6, "split_backward_s": 42e-6}
    host = leveled(spans, level)
    assert host["forward_s"] + host["backward_s"] == pytest.approx(330e-6, rel=1e-3)
    assert host["forward_s"] / host["backward_s"] == pytest.approx(120 / 300)  # the spans' shares kept
    assert host["split_backward_s"] == pytest.approx(42e-6 * 330 / 420, rel=1e-3)


def test_the_host_level_is_an_adding_backwards_cost_where_each_steps_first_backward_saves_the_adds():
    from hw.calibrate.host_steps import hw_level

    # every step's first backward adds no gradients: 40 us a layer less, once a step
    rows = [{"runtime": "hw", "schedule": "gpipe", "stages": 1, "microbatches": m, "layers": k,
             "step_s": 300e-6 + 2 * m * 90e-6 + m * k * 330e-6 - k * 40e-6} for k in (1, 2, 4, 8) for m in (4, 8, 16)]
    told = hw_level(rows, spans_per_layer_s=420e-6, grad_add_s=40e-6)
    assert (told.step_s, told.action_s, told.per_layer_s) == pytest.approx((300e-6, 90e-6, 330e-6), rel=1e-3)
    assert told.fit.max_rel_residual < 1e-6
    blind = hw_level(rows, spans_per_layer_s=420e-6)
    assert blind.fit.max_rel_residual > 1e-3  # without the saving no such line fits them


def test_recomputing_steps_are_fitted_apart_per_checkpointed_microbatch_and_layer():
    from hw.calibrate.host_steps import hw_level

    # the plain steps as above; each recomputing GPipe 700 us a micro-batch and 320 us a layer of it more (+-1%)
    plain = [{"runtime": "hw", "schedule": s, "stages": 1, "microbatches": m, "layers": k,
              "step_s": 300e-6 + 2 * m * 90e-6 + m * k * 330e-6} for k in (1, 2, 4, 8) for m in (4, 8, 16)
             for s in ("gpipe", "1f1b")]
    redone = [{**r, "recomputed": r["microbatches"] * r["layers"],
               "step_s": r["step_s"] + r["microbatches"] * (700e-6 + r["layers"] * 320e-6) * (1 + 0.01 * (-1) ** i)}
              for i, r in enumerate(r for r in plain if r["schedule"] == "gpipe")]
    level = hw_level(plain + redone, spans_per_layer_s=420e-6)
    assert (level.step_s, level.action_s, level.per_layer_s) == pytest.approx((300e-6, 90e-6, 330e-6), rel=1e-3)
    assert level.recompute is not None
    assert (level.recompute.call_s, level.recompute.per_layer_s) == pytest.approx((700e-6, 320e-6), rel=0.03)
    assert 0.005 < level.recompute.fit.max_rel_residual < 0.03
    assert level.recompute_costs() == {"recompute_call_s": level.recompute.call_s,
                                       "recompute_s": level.recompute.per_layer_s}
    assert hw_level(plain, spans_per_layer_s=420e-6).recompute_costs() == {}  # none taken: none written


def test_grad_add_host_is_the_slope_of_an_adding_first_backward_over_a_fresh_one():
    from hw.calibrate.host import grad_add_host

    per_layer, rows = grad_add_host(torch.device("cpu"), torch.float32, rounds=2)
    assert [r["layers"] for r in rows["rows"]] == [1, 2, 4, 8]
    assert all(r["fresh_s"] > 0 and r["adding_s"] > 0 for r in rows["rows"])
    assert per_layer == max(rows["per_layer_s"], 0.0)


def test_in_step_slowdown_stretches_each_familys_gpu_costs_by_its_own_factor():
    samples = [{"flops": f, "forward_s": 1e-5 + f / 5e14, "backward_input_s": 1e-5 + f / 5e14,
                "backward_s": 2e-5 + 2 * f / 5e14} for f in (1e9, 1e10, 1e11, 1e12)]
    host = {"forward_s": 1e-4, "backward_input_s": 1e-4, "backward_s": 3e-4}
    fresh, _ = layer_costs(samples, host)
    costs = {"mlp": fresh, "mlp@2048": fresh, "conv@64x56": fresh, "down": fresh}
    hot = stretched(costs, {"mlp": {"factor": 1.1}, "conv": {"factor": 1.03}})
    for key, f in (("mlp", 1.1), ("mlp@2048", 1.1), ("conv@64x56", 1.03), ("down", 1.03)):
        for a, b in ((fresh.forward, hot[key].forward), (fresh.backward_input, hot[key].backward_input),
                     (fresh.backward_weight, hot[key].backward_weight)):
            assert b.gpu_s(1e11) == pytest.approx(f * a.gpu_s(1e11)) and b.host_s == a.host_s


def test_a_weight_grad_sample_lost_in_noise_cannot_drive_a_shapes_corrections_off_the_scale():
    """One sample whose input-grad timed longer than its whole backward (a loaded CPU): its weight-grad part is noise,
    left out of the shape's weight-grad fit, so every correction stays within 2x; kept at 1e-9 s, the relative fit
    bent to it and corrected the others by ~1e6 (a profile parsim refuses). Its floored value is what stands where
    fewer than two other samples remain."""
    from hw.calibrate.fit import WEIGHT_GRAD_FLOOR, weight_grad_s

    samples = [{"flops": f, "forward_s": 1e-5 + f / 5e11, "backward_input_s": 1e-5 + f / 5e11,
                "backward_s": 2e-5 + 2 * f / 5e11} for f in (1e6, 1e7, 1e8)]
    samples[1]["backward_input_s"] = samples[1]["backward_s"] * 1.2  # noise: input-grad longer than the backward
    host = {"forward_s": 1e-4, "backward_input_s": 1e-4, "backward_s": 3e-4}
    costs, _ = layer_costs(samples, host, corrected=True)
    ratios = [r for _, r in costs.backward_weight.corrections]
    assert all(0.5 < r < 2.0 for r in ratios), ratios
    assert weight_grad_s(1.0, 1.2) == WEIGHT_GRAD_FLOOR and weight_grad_s(1.0, 0.4) == pytest.approx(0.6)


def test_layer_costs_are_fitted_per_kind_and_per_shape():
    """Each shape keeps its own rate (small maps run slower); the kind's fit spans them all."""
    def rows(kind, key, rate):
        return [{"kind": kind, "key": key, "flops": f, "forward_s": 1e-5 + f / rate, "backward_input_s": 1e-5 + f / rate,
                 "backward_s": 2e-5 + 2 * f / rate} for f in (1e9, 1e10, 1e11)]

    host = {"forward_s": 1e-4, "backward_input_s": 1e-4, "backward_s": 3e-4}
    costs, fits = fitted_costs(rows("mlp", "mlp@64", 1e14) + rows("conv", "conv@64x56", 4e14)
                               + rows("conv", "conv@512x7", 1e14), {"mlp": host, "conv": host})
    assert list(costs) == ["mlp", "mlp@64", "conv", "conv@64x56", "conv@512x7"]
    assert costs["conv@64x56"].forward.flops_per_s == pytest.approx(4e14, rel=1e-3)
    assert costs["conv@512x7"].backward_weight.flops_per_s == pytest.approx(1e14, rel=1e-3)
    assert {"forward", "forward@64", "conv forward", "conv@512x7 backward_weight"} <= fits.keys()


def test_attention_is_fitted_per_head_dim_and_a_blocks_matmul_part_is_the_block_less_its_attention():
    """Timings made from known costs come back: the attention core alone (no weights, no host), then blocks
    whose forward and input-grad hold that core: their matmul part is what remains."""
    attention_rows = [{"key": "attention@d128", "forward_flops": f, "backward_flops": 2.5 * f,
                       "forward_s": 3e-6 + f / 4e14, "backward_s": 5e-6 + 2.5 * f / 3e14} for f in (1e9, 1e10, 1e11)]
    attention, fits = attention_costs(attention_rows)
    assert attention["attention@d128"].forward.flops_per_s == pytest.approx(4e14, rel=1e-3)
    assert attention["attention"].backward_input.fixed_s == pytest.approx(5e-6, rel=1e-2)
    assert attention["attention@d128"].forward.host_s == 0 and "attention@d128 backward_input" in fits
    core = attention["attention@d128"]
    rows = [{"kind": "llama", "key": "llama@2048x8192", "attention_key": "attention@d128",
             "work": [mm, mm, mm], "attention_work": [a, 2.5 * a, 0.0],
             "forward_s": 1e-5 + mm / 6e14 + core.forward.gpu_s(a),
             "backward_input_s": 2e-5 + mm / 5e14 + core.backward_input.gpu_s(2.5 * a),
             "backward_s": 2e-5 + mm / 5e14 + core.backward_input.gpu_s(2.5 * a) + 3e-5 + mm / 7e14}
            for mm, a in ((1e11, 1e10), (4e11, 8e10), (1.6e12, 6.4e11))]
    host = {"llama": {"forward": 1e-4, "backward_input": 2e-4, "backward_weight": 5e-5}}
    costs, _ = transformer_costs(rows, attention, host)
    block = costs["llama@2048x8192"]
    assert block.forward.flops_per_s == pytest.approx(6e14, rel=1e-3)
    assert block.forward.fixed_s == pytest.approx(1e-5, rel=1e-2)
    assert block.backward_input.flops_per_s == pytest.approx(5e14, rel=1e-3)
    assert block.backward_weight.flops_per_s == pytest.approx(7e14, rel=1e-3)
    assert (block.forward.host_s, block.backward_weight.host_s) == (1e-4, 5e-5) and costs["llama"] == block


def test_the_host_level_prices_a_forward_after_a_backward_from_gpipe_and_1f1b_order_apart():
    from hw.calibrate.host_steps import hw_level

    # 1F1B order on one rank: m - 1 forwards right after a backward, each 60 us dearer; GPipe order none
    rows = [{"runtime": "hw", "schedule": s, "stages": 1, "microbatches": m, "layers": k, "after_backward": after,
             "step_s": 300e-6 + 2 * m * 90e-6 + m * k * 330e-6 + after * 60e-6}
            for k in (1, 2, 4, 8) for m in (4, 8, 16) for s, after in (("gpipe", 0), ("1f1b", m - 1))]
    level = hw_level(rows, spans_per_layer_s=420e-6)
    assert (level.step_s, level.action_s, level.per_layer_s, level.after_backward_s) == pytest.approx(
        (300e-6, 90e-6, 330e-6, 60e-6), rel=1e-3)
    old = hw_level([r for r in rows if r["schedule"] == "gpipe"], spans_per_layer_s=420e-6)
    assert old.after_backward_s == 0.0  # GPipe order alone (samples before 2026-11-28) cannot tell it: none


def test_the_slowest_ranks_excess_is_the_mean_longest_loop_over_the_longest_mean_loop():
    from hw.calibrate.rank_spread import excess

    # two ranks, each slow at alternate steps: every step's longest loop is 12, each rank's mean 11
    assert excess([[10.0, 12.0] * 4, [12.0, 10.0] * 4]) == pytest.approx(12 / 11 - 1)
    assert excess([[10.0] * 8, [12.0] * 8]) == pytest.approx(0.0)  # one rank always the slowest: nothing beyond it


def test_torchs_posts_split_into_a_batch_cost_and_a_message_cost():
    from hw.calibrate.torch_runtime import posting

    calls = [(1, 150e-6), (1, 160e-6), (1, 155e-6), (2, 215e-6), (2, 205e-6)]
    p = posting(calls)
    assert (p.op_s, p.batch_s, p.measured) == pytest.approx((55e-6, 100e-6, True))
    assert posting([(2, 200e-6), (2, 180e-6)]).op_s == pytest.approx(95e-6)  # one size only: all per message
    assert posting([(1, 100e-6), (2, 90e-6)]).op_s == 0.0  # a second message never costs less than none


def test_the_in_step_model_is_the_one_with_the_most_work_per_block_whatever_the_order():
    from hw.calibrate.transformer import in_step_model, parse_models

    small, large = "llama:4:1024:16:1024:8:8:2816:32000", "llama:16:1024:8:2048:32:8:8192:32000"  # issue 50's
    for listed in (f"{small},{large}", f"{large},{small}"):
        chosen = in_step_model(parse_models(listed))
        assert chosen.transformer.hidden == 2048 and len(chosen.layers) == 8 + 2 and chosen.tokens == 2


def test_a_host_bound_in_step_probe_is_refused_led_or_not():
    """The fresh 4 x H100 of 2026-11-27 read x2.094 from a host-bound --transformer model: its spans held the GPU's
    waits for the host. A 2 x H200 of 2026-11-28 read x1.139 from the same model led past its host, and that factor
    put GPU-bound steps 13% slow. Synthetic timings: a probe whose host issues slower than its GPU runs is refused
    (1, with the reason) however far it was led; a GPU-bound probe's factor is kept."""
    from hw.calibrate.layers import in_step_factor

    fitted, host = 10e-3, 22e-3  # the host issues the step in over twice the GPU's fitted time
    factor, why = in_step_factor(fitted, 20.9e-3, host, 1e-3)  # led 1 ms: the spans are the host's pace
    assert factor == 1.0 and why.startswith("refused, host-bound") and "22.00 ms" in why
    factor, why = in_step_factor(fitted, 11.4e-3, host, 1e-3 + 1.2 * host)  # led past the host: still refused
    assert factor == 1.0 and why.startswith("refused, host-bound")
    factor, why = in_step_factor(fitted, 11e-3, 4e-3, 1e-3)  # GPU-bound: the host keeps ahead unled
    assert factor == pytest.approx(1.1) and not why.startswith("refused")
    assert in_step_factor(fitted, 9e-3, 4e-3, 1e-3)[0] == 1.0  # never a speed-up
