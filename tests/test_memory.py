"""Memory per GPU: optimizer state, activations kept per the schedule, and the working memory of each layer."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
from conftest import transformer_profile

from parsim.plan import candidates, plan
from parsim.profile import load_profile, save_profile
from parsim.schedules import build
from parsim.workload import Head, TransformerShape, mlp_model, rank_peak_bytes, stage_layers, transformer_model

SHAPE = TransformerShape("llama", hidden=64, ffn=160, heads=8, kv_heads=2, head_dim=8, vocab=1000, seq=32)
MODEL = transformer_model(SHAPE, 6, 16)  # embedding, 6 blocks, head


def _stage_bytes(model, stages: int, samples: int, stage: int) -> tuple[int, int]:
    """(stash, output kept) of one micro-batch on `stage`."""
    ids = stage_layers(model, stages)[stage]
    return (sum(model.layers[i].stash_bytes_per_token for i in ids) * samples,
            model.layers[ids[-1]].out_bytes_per_token * samples)


def test_gpipe_holds_every_microbatch_and_1f1b_as_many_as_stages_ahead():
    """Rank 0 of two: GPipe keeps each micro-batch's stash and output until its backward, so four more
    micro-batches hold four more; 1F1B keeps two however many there are (from 4 on: with 2, its second backward,
    the first to make its gradients apart before adding them, finds one micro-batch in flight, not two)."""
    stash, out = _stage_bytes(MODEL, 2, 2, 0)
    gpipe = [rank_peak_bytes(MODEL, build("gpipe", 2, m), 2)[0] for m in (4, 8)]
    assert gpipe[1] - gpipe[0] == 4 * (stash + out)
    one_f_one_b = [rank_peak_bytes(MODEL, build("1f1b", 2, m), 2)[0] for m in (4, 8, 16)]
    assert one_f_one_b[0] == one_f_one_b[1] == one_f_one_b[2] < gpipe[0]


@pytest.mark.parametrize("recompute", ["never", "always"])
@pytest.mark.parametrize("name,virtual,messages", [("1f1b", None, 1), ("interleaved-1f1b", 2, 3)])
def test_hws_runner_holds_every_message_it_sends_until_the_step_ends(name, virtual, messages, recompute):
    """hw's runner waits its sends once the step is done, each handle holding its tensor (issue 44): on two ranks
    every micro-batch more leaves one more message a rank has sent at its last backward, 1F1B's one (rank 0's
    output, rank 1's input gradient), interleaved 1F1B's 2v - 1 = 3 (v outputs or input gradients one way, v - 1
    the other), all of one size; a runtime that frees them (torch's) holds 1F1B's peak whatever m."""
    from parsim.runtimes import get_runtime

    out = 2 * SHAPE.hidden * SHAPE.seq * SHAPE.dtype_bytes  # 2 sequences a micro-batch

    def peaks(m: int, holds_sends: bool) -> list[int]:
        return rank_peak_bytes(MODEL, build(name, 2, m, virtual), 2, "none", recompute, holds_sends=holds_sends)

    assert [b - a for a, b in zip(peaks(8, True), peaks(16, True), strict=True)] == [8 * messages * out] * 2
    assert peaks(8, False) == peaks(16, False)
    assert get_runtime("hw").holds_sends and not get_runtime("torch").holds_sends


def test_adam_holds_16_bytes_a_parameter_and_none_only_the_weights_and_the_gradients_made():
    params = sum(layer.params for layer in MODEL.layers)
    schedule = build("gpipe", 1, 1)
    adam, none = rank_peak_bytes(MODEL, schedule, 16, "adam")[0], rank_peak_bytes(MODEL, schedule, 16, "none")[0]
    assert adam - none >= 12 * params and adam - none <= 14 * params  # none makes some gradients before its peak


def test_a_single_gpu_step_peaks_at_the_heads_backward():
    """One stage, one micro-batch, "none": every stash is held when the loss's backward starts, with the loss's fp32
    gradients (2 x 4 bytes x vocab a token), larger than any block's working memory; the head's own gradients come
    only after those and the log-softmax are freed, so they do not add to that peak."""
    samples = 16
    weights = sum(layer.params * 2 for layer in MODEL.layers)
    stash = sum(layer.stash_bytes_per_token for layer in MODEL.layers) * samples
    head = Head(SHAPE)
    expected = weights + stash + 2 * 4 * SHAPE.vocab * SHAPE.seq * samples
    assert head.backward_workspace_bytes_per_token == 2 * 4 * SHAPE.vocab * SHAPE.seq
    assert rank_peak_bytes(MODEL, build("gpipe", 1, 1), samples, "none") == [expected]


def test_a_split_backward_holds_the_output_gradients_from_input_grad_to_weight_grad():
    """ZB-H1 on one GPU runs F, I, W: the forward also keeps what W needs (the logits, the projections' outputs),
    and I frees nothing while it piles up each layer's output gradients, last layer first."""
    samples, layers = 16, MODEL.layers
    static = sum(16 * layer.params for layer in layers)
    kept = sum(layer.stash_bytes_per_token + layer.captured_bytes_per_token for layer in layers) * samples
    piled = [sum(layer.weight_grad_held_bytes_per_token for layer in layers[i + 1:]) * samples
             for i in range(len(layers))]
    during_input_grad = max(p + layer.backward_workspace_bytes_per_token * samples for p, layer in zip(piled, layers))
    assert rank_peak_bytes(MODEL, build("zb-h1", 1, 1), samples) == [static + kept + during_input_grad]
    assert during_input_grad > Head(SHAPE).backward_workspace_bytes_per_token * samples  # not the head's alone


@pytest.mark.parametrize("tokens", [128, 1024])
def test_a_weight_grad_frees_each_layers_saved_inputs_before_the_next_layers_gradients(tokens):
    """ZB-H1 on one GPU, two MLP blocks (h=256), one micro-batch, "none": after F and I hold each block's stash
    (10 rows), captured fc2 output (1) and output gradients (6), W makes block 0's gradients, frees its layernorm
    input and GELU's output (5 rows, autograd.grad releasing its modules' saved inputs), then makes block 1's. A row
    is 256 x 2 bytes a token; G a block's gradients, 2 to 16 rows here, so either moment is the peak."""
    model, h = mlp_model(2, 256, tokens), 256
    row, grads = h * tokens * 2, (8 * h * h + 7 * h) * 2
    static = 2 * grads
    held = 2 * (10 + 1 + 6) * row
    expected = static + max(held + grads, held - 5 * row + 2 * grads)
    assert rank_peak_bytes(model, build("zb-h1", 1, 1), tokens, "none") == [expected]


def test_plan_drops_what_does_not_fit_and_keeps_what_does():
    profile = transformer_profile()
    found = candidates(MODEL, 2, profile, ["gpipe", "1f1b"], max_microbatches=16)
    gpipe16 = next(c for c in found if c.label.startswith("gpipe m=16"))
    one16 = next(c for c in found if c.label.startswith("1f1b m=16"))
    limit = (gpipe16.memory_bytes + one16.memory_bytes) / 2
    fits, too_big = plan(MODEL, 2, profile, limit, ["gpipe", "1f1b"])
    assert one16.memory_bytes < limit < gpipe16.memory_bytes
    assert all(c.memory_bytes <= limit for c in fits) and all(c.memory_bytes > limit for c in too_big)


def test_plan_tries_both_splits_once_each():
    profile = transformer_profile()
    both = candidates(MODEL, 2, profile, ["1f1b"], max_microbatches=2, partition="both")
    assert {c.balance for c in both} == {None, candidates(MODEL, 2, profile, ["1f1b"], max_microbatches=2,
                                                          partition="time")[0].balance}


def _profile_file(tmp_path, memory: int | None = None) -> str:
    """The shipped profile with transformer costs added (and the GPU's memory, if given), as a file."""
    shipped = load_profile()
    path = tmp_path / "p.json"
    save_profile(replace(shipped, layers={**shipped.layers, **transformer_profile().layers}, gpu_memory_bytes=memory),
                 path)
    return str(path)


def _plan_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "parsim", "plan", "--model", "llama-3.2-1b", "--seq-len", "512",
                           "--global-batch", "8", "--gpus", "2", "--schedules", "1f1b", *argv],
                          capture_output=True, text=True)


@pytest.mark.parametrize("memory,limit", [(None, "limit none (the profile does not record its GPU's memory"),
                                          (150_000_000_000, "limit 150.0 GB (the profile's GPU)")])
def test_plan_takes_its_default_limit_from_the_profile_and_prints_its_assumptions(tmp_path, memory, limit):
    path = _profile_file(tmp_path, memory)
    assert load_profile(path).gpu_memory_bytes == memory
    r = _plan_cli("--profile", path)
    assert r.returncode == 0, r.stderr
    assert "memory per GPU: mixed-precision Adam" in r.stdout and limit in r.stdout


def test_plan_says_when_a_transformer_fits_nowhere(tmp_path):
    r = _plan_cli("--profile", _profile_file(tmp_path), "--memory-limit", "1")
    assert r.returncode == 2 and r.stderr.startswith("error: no configuration fits in 1 GB per GPU; the smallest")


def test_plan_keeps_one_candidate_where_the_time_split_is_the_equal_one():
    uniform = transformer_model(replace(SHAPE, vocab=8), 6, 16)  # a light head: the equal split is the best
    found = candidates(uniform, 2, transformer_profile(), ["1f1b"], max_microbatches=1, partition="both")
    assert [c.balance for c in found] == [None]
