"""Recomputation (parsim.workload.recompute): the step and memory against closed forms, both engines alike, the
calibrated host cost, the commands' flags (the engines with recomputation on random steps: tests/test_shortcuts.py);
selective recomputation of decoder blocks' attention cores likewise (hw runs it: tests/test_hw_transformer.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from clirun import one_error_line, run
from conftest import equal_stages, make_profile, transformer_profile

from parsim.cli import main
from parsim.configuration import Configuration, predict
from parsim.profile import CollectiveSpec
from parsim.schedules import SCHEDULES, Action, build
from parsim.sim.lower import action_extras, peak_held_bytes
from parsim.sim.predict import simulate
from parsim.workload import (
    Decoder,
    TransformerShape,
    Work,
    mlp_model,
    model_from_spec,
    rank_peak_bytes,
    stage_costs,
    transformer_model,
)
from parsim.workload.costs import saved_tensors
from parsim.workload.layers import KINDS
from parsim.workload.recompute import (
    MODES,
    core_recomputing_actions,
    early_recomputing_actions,
    recomputes,
    recomputing_actions,
)
from parsim.workload.tensor_parallel import Split, TensorParallel

T_F, T_B = 0.003, 0.0045
MLP_SAVED = KINDS["mlp"].saved  # the tensors an MLP block's forward saves


@pytest.mark.parametrize("mode,m", [(mode, m) for mode in MODES for m in (1, 2, 5, 8)])
def test_one_gpu_step_grows_by_one_forward_per_recomputed_microbatch(mode, m, free_profile):
    """GPU-bound on one GPU: m (t_f + t_b), plus t_f for each recomputed micro-batch (all, all but the last, none;
    selective recomputes no whole forward, and these stages have no attention core)."""
    sim = simulate(build("gpipe", 1, m), equal_stages(1, T_F, T_B), free_profile, recompute=mode)
    redone = {"never": 0, "except-last": m - 1, "always": m, "selective": 0}[mode]
    assert sim.step_time_s == pytest.approx(m * (T_F + T_B) + redone * T_F, rel=1e-12)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (3, 5)])
def test_recomputing_every_microbatch_is_a_backward_one_forward_longer(name, p, m, free_profile):
    """With free messages and host, GPipe and 1F1B take (m + p - 1)(t_f + t_b); recomputing all, t_b + t_f for t_b."""
    sim = simulate(build(name, p, m), equal_stages(p, T_F, T_B), free_profile, recompute="always")
    assert sim.step_time_s == pytest.approx((m + p - 1) * (2 * T_F + T_B), rel=1e-12)


@pytest.mark.parametrize("name,p,m", [("gpipe", 2, 4), ("1f1b", 4, 8), ("zb-h1", 2, 4), ("interleaved-1f1b", 2, 4),
                                      ("zbv", 2, 4)])
@pytest.mark.parametrize("mode", ["except-last", "always", "selective"])
@pytest.mark.parametrize("copy_streams,data_parallel", [(False, 1), (True, 1), (True, 2)])
def test_both_engines_agree_to_the_bit_with_recomputation(name, p, m, mode, copy_streams, data_parallel):
    profile = replace(make_profile(latency_s=20e-6, bandwidth_Bps=1e11, action_s=30e-6, p2p_s=10e-6),
                      host=replace(make_profile().host, action_s=30e-6, p2p_s=10e-6, recompute_s=40e-6,
                                   recompute_call_s=300e-6))
    schedule = build(name, p, m)
    costs = [replace(c, layers=3, core_forward=Work(T_F / 4, 2e-4, 2), grad_bytes=60 << 20)  # 3 DDP buckets
             for c in equal_stages(schedule.num_stages, T_F, T_B, host_s=1e-3)]
    profile = replace(profile, collectives={"allreduce": CollectiveSpec(30e-6, 1e11)})
    walked = simulate(schedule, costs, profile, copy_streams, data_parallel, recompute=mode, engine="longest-path")
    machine = simulate(schedule, costs, profile, copy_streams, data_parallel, recompute=mode, engine="events")
    assert walked.step_time_s == machine.step_time_s
    assert walked.busy_s == machine.busy_s


# the early recompute on copy streams (torchgpipe's Checkpoint/Recompute split): the forward run again before the
# gradient arrives, as an op of its own

def _recomputing_in_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every recomputing backward runs its forward after its gradient, copy streams or not (as before them)."""
    monkeypatch.setattr("parsim.sim.lower.early_recomputing_actions", lambda *_: [])


@pytest.mark.parametrize("m", [1, 2, 3, 8])
@pytest.mark.parametrize("c", [0.0, T_F / 3, T_F])
def test_gpipe_on_copy_streams_recomputes_the_last_backwards_forward_before_its_gradient(m, c, monkeypatch):
    """2 stages, GPU-bound (free host), each message c <= t_f, every micro-batch recomputed. Stage 1's backwards
    (t_f + t_b each: its gradient is its loss's, none to wait for) pace stage 0's, whose gradients arrive t_f + t_b
    apart. Recomputing inside the backward: (m + 1)(2 t_f + t_b) + 2c, the last gradient's arrival plus t_f + t_b.
    Early: stage 0's forward of micro-batch k runs again in the idle time before its gradient arrives (micro-batch 0's
    right after the forwards, each later one right after the backward before, ending as its gradient arrives), so the
    step ends t_b after the last arrival: exactly one t_f shorter, whatever c."""
    schedule, costs, profile = build("gpipe", 2, m), equal_stages(2, T_F, T_B), make_profile(latency_s=c)
    early = simulate(schedule, costs, profile, copy_streams=True, recompute="always")
    assert early.step_time_s == pytest.approx((m + 1) * (2 * T_F + T_B) + 2 * c - T_F, rel=1e-12)
    ops = early.machine.streams["gpu0 compute"].ops
    assert [op.name for op in ops[m:m + 2]] == ["R(s0,m0)", "B(s0,m0)"]  # its own op, just before the backward
    assert ops[m].end_s <= ops[m + 1].start_s and ops[m].start_s == pytest.approx(m * T_F, rel=1e-12)
    _recomputing_in_backward(monkeypatch)
    inside = simulate(schedule, costs, profile, copy_streams=True, recompute="always")
    assert inside.step_time_s == pytest.approx((m + 1) * (2 * T_F + T_B) + 2 * c, rel=1e-12)
    assert inside.busy_s == pytest.approx(early.busy_s, rel=1e-12)  # the same work, only placed earlier


@pytest.mark.parametrize("m", [1, 2, 3, 4, 7, 10])
@pytest.mark.parametrize("c", [0.0, T_F / 6, T_F / 2, 2 * T_F / 3, 2 * T_F])
def test_1f1b_on_copy_streams_overlaps_each_round_trip_with_a_recompute(m, c, monkeypatch):
    """2 stages, GPU-bound (free host), each message c, every micro-batch recomputed; h = (m - 1) // 2.

    Stage 0 runs F(0) F(1) B(0) F(2) B(1) .. F(m-1) B(m-2) B(m-1), stage 1 F(0) B(0) F(1) B(1) .., its B t_f + t_b
    (its gradient is its loss's). With x_k, v_k, y_k the ends of stage 0's F(k), stage 1's B(k), stage 0's B(k):
      v_k = max(v_(k-1), x_k + c) + 2 t_f + t_b,   x_(k+2) = y_k + t_f,   x_0 = t_f, x_1 = 2 t_f,
      inside the backward  y_k = max(x_(k+1), v_k + c) + t_f + t_b,
      early                y_k = max(x_(k+1) + t_f, v_k + c) + t_b   (R(k) after F(k+1), B(k) after the gradient);
    the step is y_(m-1) (B(m-1) follows B(m-2)). Solved: inside, (m + 1)(2 t_f + t_b) + 2c (h + 1), for micro-batch
    k + 2's forward waits for micro-batch k's gradient, a round trip 2c on the critical path every two micro-batches.
    Early, each of those round trips but the last overlaps stage 0's recompute, which fills min(2c, t_f) of it, and
    the last backward's recompute runs before its gradient arrives: the step is t_f + h min(2c, t_f) shorter."""
    schedule, costs, profile = build("1f1b", 2, m), equal_stages(2, T_F, T_B), make_profile(latency_s=c)
    h = (m - 1) // 2
    inside_s = (m + 1) * (2 * T_F + T_B) + 2 * c * (h + 1)
    early = simulate(schedule, costs, profile, copy_streams=True, recompute="always")
    assert early.step_time_s == pytest.approx(inside_s - T_F - h * min(2 * c, T_F), rel=1e-12)
    _recomputing_in_backward(monkeypatch)
    inside = simulate(schedule, costs, profile, copy_streams=True, recompute="always")
    assert inside.step_time_s == pytest.approx(inside_s, rel=1e-12)


@pytest.mark.parametrize("name,m", [("gpipe", 4), ("1f1b", 6)])
def test_without_copy_streams_the_forward_runs_again_after_the_gradient(name, m, monkeypatch):
    """Without copy streams nothing is recomputed early: the step is the one recomputing inside every backward."""
    schedule, costs, profile = build(name, 2, m), equal_stages(2, T_F, T_B), make_profile(latency_s=T_F / 2)
    plain = simulate(schedule, costs, profile, recompute="always")
    assert not any(op.name.startswith("R(") for op in plain.machine.streams["gpu0 compute"].ops)
    _recomputing_in_backward(monkeypatch)
    assert simulate(schedule, costs, profile, recompute="always").step_time_s == plain.step_time_s


def test_early_recomputes_are_the_backwards_whose_gradient_comes_by_a_message():
    """zbv places stages 0..3 on ranks 0, 1, 1, 0: stage 1's gradient comes from stage 2 on its own rank, stage 3's
    is its loss's; those recompute inside their backward (here input-grads: the split backward recomputes at I)."""
    schedule = build("zbv", 2, 4)
    assert schedule.stage_to_rank == (0, 1, 1, 0)
    early = early_recomputing_actions(schedule, "always", copy_streams=True)
    assert {(a.op, a.stage) for a in early} == {("I", 0), ("I", 2)} and len(early) == 8
    assert {a.microbatch for a in early_recomputing_actions(schedule, "except-last", True)} == {0, 1, 2}
    assert early_recomputing_actions(schedule, "always", copy_streams=False) == []
    assert early_recomputing_actions(schedule, "selective", copy_streams=True) == []  # the cores: in the backward


def test_a_host_bound_step_pays_the_early_recompute_once(monkeypatch):
    """GPU free, host slow, 2 ranks on copy streams: the recompute's launches move before the backward's, so the
    host-bound step is the same early or not."""
    profile = replace(make_profile(), host=replace(make_profile().host, action_s=50e-6))
    costs = [replace(c, layers=3) for c in equal_stages(2, 0.0, 0.0, host_s=2e-3)]
    early = simulate(build("1f1b", 2, 6), costs, profile, copy_streams=True, recompute="always").step_time_s
    _recomputing_in_backward(monkeypatch)
    inside = simulate(build("1f1b", 2, 6), costs, profile, copy_streams=True, recompute="always").step_time_s
    assert early == pytest.approx(inside, rel=1e-12)


def test_an_early_recompute_costs_the_host_a_forwards_launches_not_checkpoints():
    """hw runs the early recompute as a plain forward (no checkpoint, none of its hooks): its launch is the stage
    forward's, layer by layer, calibrated checkpoint cost or not; a backward recomputing inside pays the forward's
    launches and checkpoint's own cost (an MLP block's launches free here)."""
    host = replace(make_profile().host, recompute_s=40e-6, recompute_call_s=500e-6)
    profile = replace(make_profile(), host=host)
    costs = [replace(c, layers=3) for c in equal_stages(2, T_F, T_B, host_s=2e-3, chunks=3)]
    schedule = build("gpipe", 2, 2)
    extras = action_extras(schedule, costs, profile, "always", copy_streams=True)
    assert extras.early == {Action("B", 0, i): (T_F, T_F / 3, 2e-3, 2e-3 / 3) for i in range(2)}
    assert extras.host == {Action("B", 1, i): pytest.approx(2e-3 + 500e-6 + 3 * 40e-6) for i in range(2)}
    assert extras.gpu == {Action("B", 1, i): T_F for i in range(2)}


@pytest.mark.parametrize("saved", [None, 3 * 36])
@pytest.mark.parametrize("call_s,per_layer_s", [(0.0, 0.0), (300e-6, 0.0), (500e-6, 40e-6), (500e-6, 400e-6)])
def test_a_host_bound_step_grows_by_each_recomputed_microbatchs_host_cost(call_s, per_layer_s, saved):
    """GPU free, host slow: one GPU's step grows by m x (the forward's launches + call_s + the checkpoint's hooks:
    what per-layer costs beyond an MLP block's launches, which calibrate's MLP probe blocks include in it, per
    tensor an MLP block saves, times the tensors the stage's forward saves; each layer an MLP block's where
    unknown), or by m forwards' launches where the profile has no calibrated cost."""
    m, layers, host_s = 6, 3, 2e-3
    host = replace(make_profile().host, action_s=50e-6, recompute_s=per_layer_s, recompute_call_s=call_s)
    profile = replace(make_profile(layer_host_s=100e-6), host=host)  # an MLP block's launches: 100 us
    costs = [replace(c, layers=layers, saved_tensors=saved) for c in equal_stages(1, 0.0, 0.0, host_s=host_s)]
    never = simulate(build("gpipe", 1, m), costs, profile).step_time_s
    always = simulate(build("gpipe", 1, m), costs, profile, recompute="always").step_time_s
    hooks = max(per_layer_s - profile.layers["mlp"].forward.host_s, 0.0) if per_layer_s else 0.0
    tensors = layers * MLP_SAVED if saved is None else saved
    assert always - never == pytest.approx(m * (host_s + call_s + tensors * hooks / MLP_SAVED), rel=1e-9)


def test_a_stage_saves_its_layers_tensors():
    """A Llama stage's recompute hooks run for its blocks', embedding's and head's saved tensors (checked against
    hw's modules in test_hw_transformer); a layer of unknown count (a profiled model's older file) leaves the
    stage's unknown."""
    costs = stage_costs(transformer_model(SHAPE, 3, 4), 2, 2, transformer_profile())
    assert [c.saved_tensors for c in costs] == [1 + 36 + 36, 36 + 5]
    assert [c.core_saved_tensors for c in costs] == [2 * 5, 5]
    mlp = mlp_model(4, 8, 16)
    assert saved_tensors(list(mlp.layers)) == 4 * MLP_SAVED
    assert saved_tensors([*mlp.layers, SimpleNamespace(saved_tensors=None)]) is None


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
    at its peak what a one-micro-batch step of the same size holds, and one parameter's gradient (fc1's or fc2's,
    C x 4C) that a later backward makes before adding it into .grad (without Adam, the gradients the first backward
    made are held through the later ones: more)."""
    model, samples = mlp_model(4, 256, 64 * m), 64
    one = rank_peak_bytes(model, build("gpipe", 1, 1), samples)
    grads = 4 * 256 * 256 * model.layers[0].dtype_bytes
    assert rank_peak_bytes(model, build("gpipe", 1, m), samples, "adam", "always") == [one[0] + grads]
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


# selective recomputation: each decoder block's attention core run again in every backward

SHAPE = TransformerShape("llama", hidden=64, ffn=96, heads=4, kv_heads=2, head_dim=16, vocab=50, seq=32)
ATTENTION_RATE, FIXED_S = 2e11, 1e-6  # the attention key's FLOPs/s and fixed cost, unlike the other keys'


def _core_forward_s(sequences: int) -> float:
    """One attention core's forward on `sequences` of SHAPE, priced as the attention part is: 4 h d a causal pair."""
    pairs = SHAPE.seq * (SHAPE.seq + 1) // 2
    return FIXED_S + 4 * SHAPE.heads * SHAPE.head_dim * pairs * sequences / ATTENTION_RATE


@pytest.mark.parametrize("m", [1, 2, 5])
def test_selective_adds_each_attention_cores_forward_per_microbatch_to_a_gpu_bound_step(m):
    """One GPU, free host: m micro-batches of 2 sequences through 3 blocks are m x 3 attention forwards longer."""
    blocks, per_microbatch = 3, 2
    model = transformer_model(SHAPE, blocks, per_microbatch * m)
    profile = transformer_profile({"attention": ATTENTION_RATE}, fixed_s=FIXED_S)
    costs = stage_costs(model, 1, m, profile)
    never = simulate(build("gpipe", 1, m), costs, profile).step_time_s
    selective = simulate(build("gpipe", 1, m), costs, profile, recompute="selective").step_time_s
    assert selective - never == pytest.approx(m * blocks * _core_forward_s(per_microbatch), rel=1e-9)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (3, 5)])
def test_selective_makes_every_backward_its_stages_cores_longer(name, p, m, free_profile):
    """With free messages and host, GPipe and 1F1B take (m + p - 1)(t_f + t_b); selective, t_b + t_c for t_b, t_c
    the stage's attention cores' forward."""
    t_c = 0.0007
    costs = [replace(c, core_forward=Work(t_c, 0.0, 2)) for c in equal_stages(p, T_F, T_B)]
    sim = simulate(build(name, p, m), costs, free_profile, recompute="selective")
    assert sim.step_time_s == pytest.approx((m + p - 1) * (T_F + T_B + t_c), rel=1e-12)


@pytest.mark.parametrize("call_s,per_layer_s", [(0.0, 0.0), (300e-6, 40e-6), (300e-6, 400e-6)])
def test_a_host_bound_step_grows_by_a_checkpoint_per_core(call_s, per_layer_s):
    """GPU free, host slow: selective adds m x (the cores' forward launches + cores x (call_s + per_layer_s beyond an
    MLP block's launches)), each core its own checkpoint of one op, whatever the stage's layers."""
    m, cores, launch_s = 6, 3, 70e-6
    host = replace(make_profile().host, action_s=50e-6, recompute_s=per_layer_s, recompute_call_s=call_s)
    profile = replace(make_profile(layer_host_s=100e-6), host=host)  # an MLP block's launches: 100 us
    costs = [replace(c, layers=5, core_forward=Work(0.0, launch_s, cores))
             for c in equal_stages(1, 0.0, 0.0, host_s=2e-3)]
    never = simulate(build("gpipe", 1, m), costs, profile).step_time_s
    selective = simulate(build("gpipe", 1, m), costs, profile, recompute="selective").step_time_s
    hooks = max(per_layer_s - profile.layers["mlp"].forward.host_s, 0.0) if per_layer_s else 0.0
    assert selective - never == pytest.approx(m * (launch_s + cores * (call_s + hooks)), rel=1e-9)


@pytest.mark.parametrize("m", [1, 3])
def test_selective_frees_exactly_each_cores_log_sum_exp(m):
    """One GPU, GPipe: at its peak every micro-batch's stash is held; selective holds each block's less its attention
    core's fp32 log-sum-exp (a head's per token), in predict's activations and in plan's memory walk alike."""
    blocks, per_microbatch = 3, 2
    model = transformer_model(SHAPE, blocks, per_microbatch * m)
    freed = m * blocks * per_microbatch * SHAPE.seq * SHAPE.heads * 4
    profile = transformer_profile()
    never, selective = (predict(Configuration(model, "gpipe", 1, m, recompute=mode), profile)[0]
                        for mode in ("never", "selective"))
    assert never.per_gpu[0].peak_activation_bytes - selective.per_gpu[0].peak_activation_bytes == freed
    schedule = build("gpipe", 1, m)
    walked = [rank_peak_bytes(model, schedule, per_microbatch, "adam", mode)[0] for mode in ("never", "selective")]
    assert walked[0] - walked[1] == freed


def test_selective_frees_little_under_flash_attention():
    """Llama 3 8B at 4096 tokens: a block keeps 168,072 bytes a token (q, k, v and the output among them, which the
    checkpointed core keeps or its output projection needs); selective frees the log-sum-exp, 32 heads x 4 bytes."""
    block = next(layer for layer in model_from_spec("llama-3-8b:1:4096").layers if isinstance(layer, Decoder))
    assert block.stash_bytes_per_token == 4096 * 168_072
    assert block.core_freed_bytes_per_token == 4096 * 128
    assert [p.work[0] for p in block.core_parts] == [p.work[0] for p in block.parts if p.keys[-1] == "attention"]


@pytest.mark.parametrize("t", [2, 4])
def test_a_tensor_parallel_block_recomputes_and_frees_its_heads_share(t):
    block = Decoder(SHAPE)
    split = Split(block, TensorParallel(t))
    assert split.core_freed_bytes_per_token * t == block.core_freed_bytes_per_token
    (whole,), (part,) = block.core_parts, split.core_parts
    assert part.keys == (f"attention@d16/tp{t}", "attention@d16", "attention")
    assert part.work == tuple(w / t for w in whole.work)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_every_schedule_runs_selective_slower_in_less_memory_both_engines_alike(name):
    """Split backwards too: the core has no weights, so its recompute is in I and W is unchanged."""
    model, m = transformer_model(SHAPE, 6, 8), 4
    profile = transformer_profile({"attention": ATTENTION_RATE}, fixed_s=FIXED_S)
    never, selective = (predict(Configuration(model, name, 2, m, recompute=mode), profile)[0]
                        for mode in ("never", "selective"))
    assert selective.step_time_s > never.step_time_s
    assert all(s.peak_activation_bytes < n.peak_activation_bytes for s, n in zip(selective.per_gpu, never.per_gpu))
    schedule = build(name, 2, m)
    costs = stage_costs(model, schedule.num_stages, m, profile)
    walked, machine = (simulate(schedule, costs, profile, recompute="selective", engine=e)
                       for e in ("longest-path", "events"))
    assert walked.step_time_s == machine.step_time_s and walked.busy_s == machine.busy_s
    assert {a.op for a in core_recomputing_actions(schedule, "selective")} <= {"B", "I"}


def test_selective_on_an_mlp_stack_is_never(capsys):
    """No attention core: everything kept, nothing run again; the same prediction, but for the mode it names."""
    def predicted(*flags: str) -> dict:
        status, out, err = run(main, ["predict", "--gpus", "2", "--schedule", "zb-h1", "--json", *flags], capsys)
        assert status == 0, err
        return json.loads(out)

    selective = predicted("--recompute", "selective")
    assert selective.pop("recompute") == "selective" and selective == predicted()
    model, schedule = mlp_model(4, 256, 512), build("zb-h1", 2, 4)
    assert rank_peak_bytes(model, schedule, 128, "adam", "selective") == rank_peak_bytes(model, schedule, 128)
    costs = stage_costs(model, 2, 4, make_profile())
    assert simulate(schedule, costs, make_profile(), recompute="selective").step_time_s == \
        simulate(schedule, costs, make_profile()).step_time_s


def test_the_commands_take_selective_and_say_it(capsys):
    status, out, err = run(main, ["predict", "--model", "llama-3.2-1b", "--seq-len", "1024", "--global-batch", "8",
                                  "--gpus", "2", "--recompute", "selective"], capsys)
    assert status == 0 and "recomputing each decoder block's attention core" in out, err
    swept = {}
    for mode in ("never", "selective"):
        status, out, err = run(main, ["sweep", "--model", "llama-3.2-1b", "--seq-len", "1024", "--global-batch", "8",
                                      "--gpus", "2", "--microbatches", "2,4", "--recompute", mode, "--json"], capsys)
        assert status == 0, err
        swept[mode] = [row["step_time_s"] for row in json.loads(out)]
    assert all(s > n for s, n in zip(swept["selective"], swept["never"], strict=True))


def test_selective_on_a_profiled_model_is_one_line_and_exit_2(capsys):
    """Its layers are timed whole: parsim cannot price their attention cores apart (nor hw run them checkpointed)."""
    profiled = str(Path(__file__).parent.parent / "data/user-models/nvidia-h200-x2-2026-11-28/gpt-2.json")
    one_error_line(*run(main, ["predict", "--model", profiled, "--gpus", "2", "--recompute", "selective"], capsys),
                   "timed whole")
