"""Tensor parallelism (issue 48): closed forms of a split step, memory per GPU, the CLI's flags and plan's search."""

from __future__ import annotations

import dataclasses

import pytest
from clirun import run
from conftest import make_profile, transformer_profile

from parsim.cli import main
from parsim.configuration import Configuration, predict, prepare
from parsim.errors import ParsimError
from parsim.plan import evaluate, rank_key, search, shapes
from parsim.profile import CollectiveSpec, LayerCosts, OpCost
from parsim.runtimes import RUNTIMES
from parsim.schedules import build
from parsim.workload import (
    OPS,
    layer_works,
    mlp_model,
    model_from_spec,
    peak_bytes,
    rank_peak_bytes,
    stage_costs,
)
from parsim.workload.tensor_parallel import NONE, Split, TensorParallel, collective_s, split_model

LATENCY, BUSBW = 2e-5, 1e11  # the all-reduce's cost in these tests
RATE = 1e12  # FLOP/s of every layer kind (conftest's profiles)
LLAMA = "llama:4:64:2:256:8:4:512:1024"  # 4 sequences of 64 tokens, 2 blocks, h 256, 8/4 heads, ffn 512, vocab 1024


def tp_profile(**kw):
    """conftest's free profile (no host, link or fixed costs) with a priced all-reduce."""
    base = transformer_profile() if kw.pop("transformer", False) else make_profile()
    return dataclasses.replace(base, collectives={"allreduce": CollectiveSpec(LATENCY, BUSBW)}, **kw)


def ring_s(kind: str, nbytes: float, t: int) -> float:
    """The formula the model names: latency + passes (t-1)/t bytes / bus bandwidth."""
    return LATENCY + (2 if kind == "allreduce" else 1) * (t - 1) / t * nbytes / BUSBW


@pytest.mark.parametrize("t", [2, 4, 8])
@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("sequence", [False, True])
def test_gpu_bound_mlp_step_is_the_split_compute_plus_the_named_collectives(t, m, sequence):
    """One pipeline rank of t GPUs, GPipe, free host and links: m x layers x (forward, input-grad and weight-grad
    at a t-th of the FLOPs, plus per block one all-reduce forward and one backward of the activation, or with
    sequence parallelism an all-gather and a reduce-scatter each way)."""
    layers, h, per_mb = 4, 256, 512
    model = mlp_model(layers, h, per_mb * m)
    prediction, _ = predict(Configuration(model, "gpipe", t, m, tensor_parallel=t, sequence_parallel=sequence),
                            tp_profile())
    compute = 3 * 16 * h * h * per_mb / t / RATE
    act = per_mb * h * 2
    comm = 2 * (ring_s("all_gather", act, t) + ring_s("reduce_scatter", act, t)) if sequence else \
        2 * ring_s("allreduce", act, t)
    assert prediction.step_time_s == pytest.approx(m * layers * (compute + comm), rel=1e-12)
    assert prediction.gpus == t and prediction.tensor_parallel == t and len(prediction.per_gpu) == 1


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (4, 8)])
def test_tp_x_pp_step_matches_the_pipeline_closed_form_with_split_stages(name, p, m):
    """Free links: (m + p - 1)(t_f + t_b), each stage's times the split compute plus its all-reduces."""
    t, h, per_mb = 2, 128, 256
    model = mlp_model(2 * p, h, per_mb * m)
    prediction, _ = predict(Configuration(model, name, t * p, m, tensor_parallel=t), tp_profile())
    block = 16 * h * h * per_mb / t / RATE
    allreduce = ring_s("allreduce", per_mb * h * 2, t)
    t_f, t_b = 2 * (block + allreduce), 2 * (2 * block + allreduce)
    assert prediction.step_time_s == pytest.approx((m + p - 1) * (t_f + t_b), rel=1e-12)


@pytest.mark.parametrize("sequence", [False, True])
def test_each_transformer_layer_costs_its_split_parts_plus_its_collectives(sequence):
    """Embedding, decoder blocks and head: each op a t-th of the whole layer's GPU time (free fixed costs: linear in
    work) plus its collectives (decoder: 2 forward and 2 backward; head: the loss's 3 fp32 all-reduces forward)."""
    t, samples = 2, 3
    profile = tp_profile(transformer=True)
    model = model_from_spec(LLAMA)
    counts = {}
    for layer in model.layers:
        split = Split(layer, TensorParallel(t, sequence))
        whole, part = layer_works(profile, layer, samples), layer_works(profile, split, samples)
        for i in range(len(OPS)):
            comm = sum(collective_s(profile, c.kind, c.bytes_per_token * samples, t)
                       for c in split.collectives if c.op == i)
            assert part[i].gpu_s == pytest.approx(whole[i].gpu_s / t + comm, rel=1e-12)
        counts[layer.kind] = [sum(c.op == i for c in split.collectives) for i in range(3)]
    per_way = 2 if sequence else 1
    assert counts["llama"] == [2 * per_way, 2 * per_way, 0]
    assert counts["head"] == [3 + (per_way - 1), 1, 0]
    assert counts["embed"] == [1, 0, per_way - 1]


def test_collectives_are_priced_as_the_ring_formula_names():
    profile = tp_profile()
    for kind in ("allreduce", "reduce_scatter", "all_gather"):
        for t in (2, 4, 8):
            assert collective_s(profile, kind, 1e6, t) == pytest.approx(ring_s(kind, 1e6, t), rel=1e-15)
    assert collective_s(profile, "allreduce", 1e6, 1) == 0.0
    measured = dataclasses.replace(profile, collectives={**profile.collectives,
                                                         "tp_allreduce": CollectiveSpec(1e-6, 1e12)})
    assert collective_s(measured, "allreduce", 1e6, 2) == pytest.approx(1e-6 + 1e6 / 1e12)


@pytest.mark.parametrize("t", [2, 4])
def test_mlp_memory_per_gpu_is_divided_as_megatron_divides_it(t):
    """Weights: (8h^2 + 4h) / t split, 3h replicated (layernorm, fc2's bias); kept per token: the layernorm's input
    and output whole and fc1's and GELU's outputs (8h) over t; sequence parallelism splits the layernorm's input
    (the gathered output stays whole: DTensor keeps the column-parallel linear's input)."""
    h, b = 512, 2
    layer = mlp_model(1, h, 64).layers[0]
    plain, seq = Split(layer, TensorParallel(t)), Split(layer, TensorParallel(t, True))
    assert plain.params == (8 * h * h + 4 * h) // t + 3 * h
    assert plain.stash_bytes_per_token == (2 * h + 8 * h // t) * b
    assert seq.stash_bytes_per_token == (h // t + h + 8 * h // t) * b
    assert plain.out_bytes_per_token == h * b and seq.out_bytes_per_token == h * b // t


@pytest.mark.parametrize("t", [2, 4])
def test_transformer_memory_per_gpu_follows_the_split(t):
    """A Llama block: weights over t but the two RMSNorm scales; kept per token (Korthikanti et al. 2022, without
    sequence parallelism): the norms' inputs and outputs (4H) whole, q, k, v, attention's output and the MLP's
    four inner tensors over t; fp32: two rstd whole, a log-sum-exp per head over t."""
    model = model_from_spec(LLAMA)
    block = model.layers[1]
    s = block.shape
    split = Split(block, TensorParallel(t))
    assert split.params == (block.params - 2 * s.hidden) // t + 2 * s.hidden
    act = 4 * s.hidden + (2 * s.q_width + 2 * s.kv_width + 4 * s.ffn) // t
    assert split.stash_bytes_per_token == s.seq * (act * 2 + (2 + s.heads // t) * 4)
    head, embed = Split(model.layers[-1], TensorParallel(t)), Split(model.layers[0], TensorParallel(t))
    assert head.params == s.hidden + s.hidden * s.vocab // t and embed.params == s.vocab * s.hidden // t


def test_peak_memory_per_gpu_is_the_split_weights_and_stash():
    """One stage of GPipe at one micro-batch: a GPU's peak is 16 bytes (Adam) per parameter it holds plus every
    layer's split stash for the micro-batch, and the last layer's backward working memory: the output's gradient
    (whole, h per token) and fc2's input gradient (4h/t: fc2 is row-parallel), 5h per token unsplit."""
    layers, h, tokens, t = 4, 256, 128, 2
    model, profile = mlp_model(layers, h, tokens), tp_profile()
    split = prepare(Configuration(model, "gpipe", t, 1, tensor_parallel=t), profile)
    params = layers * ((8 * h * h + 4 * h) // t + 3 * h)
    stash = layers * (2 * h + 8 * h // t) * 2 * tokens
    assert peak_bytes(split.run_model, split.schedule) == 16 * params + stash + (h + 4 * h // t) * 2 * tokens
    whole = prepare(Configuration(model, "gpipe", 1, 1), profile)
    assert peak_bytes(whole.model, whole.schedule) == (16 * layers * (8 * h * h + 7 * h) + layers * 10 * h * 2 * tokens
                                                       + 5 * h * 2 * tokens)


def test_one_way_tensor_parallelism_is_the_model_itself():
    model = mlp_model(4, 256, 1024)
    assert split_model(model, NONE) is model
    profile = tp_profile()
    assert predict(Configuration(model, "1f1b", 2, 4, tensor_parallel=1), profile)[0] == \
        predict(Configuration(model, "1f1b", 2, 4), profile)[0]


@pytest.mark.parametrize("argv,message", [
    (["--gpus", "4", "--tensor-parallel", "3"], "does not split into 1 data-parallel replica(s) of --tensor-parallel"),
    (["--gpus", "4", "--sequence-parallel"], "sequence parallelism splits what tensor parallelism replicates"),
    (["--conv", "--gpus", "2", "--tensor-parallel", "2"], "tensor parallelism splits MLP blocks and transformers"),
    (["--gpus", "8", "--tensor-parallel", "8"], "stays within a node's NVLink: 8 does not divide"),
    (["--gpus", "2", "--tensor-parallel", "0"], "--tensor-parallel: must be at least 1"),
    (["--model", "gpt-2", "--seq-len", "64", "--global-batch", "4", "--gpus", "4", "--tensor-parallel", "4"],
     "embed@50257x768 does not split 4 ways: vocab 50257 not divisible by 4"),
    (["--gpus", "2", "--tensor-parallel", "2", "--sequence-parallel", "--tokens", "6", "--microbatches", "2",
      "--layers", "2"], "splits each micro-batch's 3 tokens 2 ways"),
])
def test_bad_tensor_parallel_flags_are_one_line_and_exit_2(argv, message, capsys):
    status, out, err = run(main, ["predict", *argv], capsys)
    assert status == 2 and out == "" and err.count("\n") == 1 and message in err, err


def test_predict_and_sweep_take_the_degree(capsys):
    status, out, _ = run(main, ["predict", "--gpus", "4", "--tensor-parallel", "2", "--json"], capsys)
    assert status == 0 and '"tensor_parallel": 2' in out and '"gpus": 4' in out
    status, out, _ = run(main, ["sweep", "--gpus", "4", "--tensor-parallel", "2", "--sequence-parallel",
                                "--microbatches", "2", "--schedules", "1f1b", "--json"], capsys)
    assert status == 0 and '"sequence_parallel": true' in out


def test_plan_prints_each_picks_tensor_parallel_degree(capsys):
    status, out, _ = run(main, ["plan", "--gpus", "4", "--layers", "4", "--hidden", "512", "--tokens", "1024",
                                "--runtime", "hw", "--top", "60", "--jobs", "1"], capsys)
    rows = [line for line in out.splitlines() if line[:4].strip().isdigit()]
    degrees = {next((w[3:].rstrip(",") for w in line.split() if w.startswith("tp=")), "1") for line in rows}
    assert status == 0 and degrees == {"1", "2", "4"}
    assert "tried: 1, 2, 4\n" in out  # 8 is more than the shipped profile's node


def test_gpus_per_node_sets_the_node_a_tensor_parallel_group_stays_in(capsys):
    """--gpus-per-node replaces the profile's node size: plan tries 8-way TP in 8-GPU nodes, and says so."""
    status, out, _ = run(main, ["plan", "--gpus", "8", "--layers", "4", "--hidden", "512", "--tokens", "1024",
                                "--runtime", "hw", "--top", "3", "--jobs", "1", "--gpus-per-node", "8"], capsys)
    assert status == 0 and "tried: 1, 2, 4, 8\n" in out and "8-GPU node" in out
    assert "gpus_per_node from --gpus-per-node" in out
    status, out, err = run(main, ["predict", "--gpus", "6", "--tensor-parallel", "2", "--gpus-per-node", "3",
                                  "--microbatches", "4"], capsys)
    assert status == 2 and "does not divide the profile's 3 GPUs per node" in err


@pytest.mark.parametrize("sequence", [False, True])
def test_pruned_search_with_tensor_parallelism_finds_the_exhaustive_top_k(sequence):
    model, gpus, top = mlp_model(8, 256, 2048), 8, 5
    profile = tp_profile(host=make_profile(action_s=2e-6, p2p_s=1e-6).host)
    runtimes, degrees = [RUNTIMES["hw"]], (1, 2, 4, 8)
    todo = shapes(model, gpus, profile, runtimes, max_microbatches=16, degrees=degrees, sequence=sequence)
    assert {s.tensor_parallel for s in todo} == {1, 2, 4, 8}
    ran = [(s, c) for s in todo if (c := evaluate(s, model, profile)) is not None and c.prediction]
    for shape, c in ran:
        assert shape.floor_s <= c.prediction.step_time_s
    exhaustive = sorted(((c.prediction.step_time_s, s.index, c) for s, c in ran),
                        key=lambda x: rank_key(x[0], x[2].memory_bytes, x[1]))[:top]
    found = search(model, gpus, profile, None, runtimes=runtimes, top=top, max_microbatches=16, degrees=degrees,
                   sequence=sequence)
    assert [(c.label, c.tensor_parallel, c.prediction.step_time_s) for c in found.fits] == \
        [(c.label, c.tensor_parallel, step) for step, _, c in exhaustive]


def test_a_profile_without_collective_costs_refuses_tensor_parallelism():
    with pytest.raises(ParsimError, match="no collectives.allreduce cost, which tensor parallelism needs"):
        predict(Configuration(mlp_model(2, 128, 256), "gpipe", 2, 1, tensor_parallel=2), make_profile())


@pytest.mark.parametrize("t", [2, 4])
def test_dtensor_host_cost_is_paid_per_split_matrix(t):
    """Each split layer's forward pays tp_forward_s and its backward tp_backward_s per split matrix (2 in an MLP
    block, 7 in a Llama block, 1 in an embedding or a head); the unsplit layer pays none of it."""
    f, b = 3e-4, 5e-4
    profile = tp_profile(transformer=True)
    costed = dataclasses.replace(profile, host=dataclasses.replace(profile.host, tp_forward_s=f, tp_backward_s=b))
    matrices = {"mlp": 2, "llama": 7, "embed": 1, "head": 1}
    for layer in (*model_from_spec(LLAMA).layers, *mlp_model(1, 256, 64).layers):
        split = Split(layer, TensorParallel(t))
        assert split.matrices == matrices[layer.kind]
        free, paid = layer_works(profile, split, 3), layer_works(costed, split, 3)
        extra = [p.host_s - q.host_s for p, q in zip(paid, free)]
        assert extra == pytest.approx([matrices[layer.kind] * f, matrices[layer.kind] * b, 0.0], rel=1e-12)
        assert layer_works(costed, layer, 3) == layer_works(profile, layer, 3)


@pytest.mark.parametrize("m", [1, 4])
def test_a_host_bound_tp_step_is_its_dtensor_dispatch(m):
    """GPU and collectives free, only DTensor's host cost: a one-rank GPipe step of an MLP stack is m x layers x 2
    matrices x (forward + backward cost)."""
    f, b, layers = 3e-4, 5e-4, 3
    base = tp_profile()
    fast = OpCost(0.0, 0.0, 1e30)
    free = dataclasses.replace(base, host=dataclasses.replace(base.host, tp_forward_s=f, tp_backward_s=b),
                               collectives={"allreduce": CollectiveSpec(0.0, 1e30)},
                               layers={"mlp": LayerCosts(fast, fast, fast)})
    prediction, _ = predict(Configuration(mlp_model(layers, 256, 64 * m), "gpipe", 2, m, tensor_parallel=2), free)
    assert prediction.step_time_s == pytest.approx(m * layers * 2 * (f + b), rel=1e-9)


def test_the_parallel_loss_holds_one_fp32_copy_of_the_split_logits_more():
    """torch's loss_parallel runs the log-softmax and its backward as separate kernels: forward and backward each
    hold one fp32 copy of the local logits (seq x V/t per sample) more than the whole head's t-th."""
    head = model_from_spec(LLAMA).layers[-1]
    s = head.shape
    for t in (2, 4):
        split = Split(head, TensorParallel(t))
        extra = s.seq * s.vocab * s.acc_bytes // t
        assert split.forward_workspace_bytes_per_token == head.forward_workspace_bytes_per_token // t + extra
        assert split.backward_workspace_bytes_per_token == head.backward_workspace_bytes_per_token // t + extra


@pytest.mark.parametrize("t", [2, 4])
def test_a_split_heads_loss_keeps_its_local_log_softmax_outside_a_checkpoint(t):
    """The vocab-parallel loss keeps the fp32 log-softmax of its GPU's logits (V/t a token), outside a checkpoint of
    the stage: the split head reports it as its loss's stash (the stash's last part), the stage's cost carries it,
    and under GPipe with every micro-batch recomputed the last rank keeps, per micro-batch more, the stage's input
    and that log-softmax."""
    model = model_from_spec(LLAMA)
    s = model.layers[-1].shape
    split = split_model(model, TensorParallel(t))
    head = split.layers[-1]
    local = s.seq * s.vocab * s.acc_bytes // t
    assert head.loss_stash_bytes_per_token == local and split.layers[1].loss_stash_bytes_per_token == 0
    costs = stage_costs(split, 2, 4, tp_profile(transformer=True))  # a sequence a micro-batch
    assert costs[-1].loss_bytes == local and costs[0].loss_bytes == 0
    peaks = [rank_peak_bytes(split, build("gpipe", 2, m), 1, "none", "always")[1] for m in (4, 5)]
    assert peaks[1] - peaks[0] == split.layers[-2].out_bytes_per_token + local
