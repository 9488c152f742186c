"""Memory per GPU under CUDA graphs (parsim.workload.graph_memory): closed forms of the pool's peak and end and of the
static buffers, the graphed runs' measured pools, and the runtimes' dispatch (the eager ones' memory unchanged)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parsim.cli import main
from parsim.errors import ModelError
from parsim.runtimes import get_runtime
from parsim.schedules import build
from parsim.workload import (
    TransformerShape,
    graphed_activation_bytes,
    graphed_peak_bytes,
    graphed_ranks,
    mlp_model,
    peak_bytes,
    transformer_model,
)

ROOT = Path(__file__).resolve().parents[1]
H, TOKENS, LAYERS = 256, 4096, 4
MLP = mlp_model(LAYERS, H, TOKENS)


FC2_GRADS = (4 * H * H + H) * 2  # fc2's gradients, the first an MLP block's backward makes


def _mlp_bytes(n: int) -> tuple[int, int, int]:
    """An MLP block of width H on n tokens, bf16: (stash, a token row of n tokens = its input and output, gradients)."""
    return 10 * H * n * 2, H * n * 2, (8 * H * H + 7 * H) * 2


def test_gpipe_on_one_gpu_peaks_at_the_first_backward_with_every_output_kept():
    """One stage, m micro-batches of n tokens, no optimizer: the pool holds every micro-batch's stash (less the
    first layer's input, which is the static copy of the batch) and its output, and the first backward's first
    layer holds its working memory (the output's gradient and fc2's input gradient: 5 rows) beside fc2's gradients;
    it ends with the gradients and the m outputs. Outside it: the weights and the copies of the batch's inputs and
    targets."""
    m = 4
    n = TOKENS // m
    stash, row, grads = _mlp_bytes(n)
    weights = LAYERS * grads
    (rank,) = graphed_ranks(MLP, build("gpipe", 1, m), n, "none")
    assert rank.pool_peak == m * (LAYERS * stash - row) + m * row + 5 * row + FC2_GRADS
    assert rank.pool_end == LAYERS * grads + m * row
    assert rank.buffers == 2 * m * row and rank.static == weights
    assert graphed_peak_bytes(MLP, build("gpipe", 1, m), 1, "none") == weights + 2 * m * row + rank.pool_peak


def test_1f1b_ranks_keep_every_output_and_input_gradient_and_a_buffer_per_receive():
    """Four ranks: each keeps its m outputs, and each but the first its m input gradients, for good; a middle rank
    has a buffer for each of its 2m receives, the first the batch's inputs and m gradients, the last m inputs and
    the targets. Each ends with its stage's gradients besides."""
    m = 8
    n = TOKENS // m
    _, row, grads = _mlp_bytes(n)
    ranks = graphed_ranks(MLP, build("1f1b", 4, m), n, "none")
    for r, rank in enumerate(ranks):
        assert rank.pool_end == grads + m * row + (m * row if r > 0 else 0)
        assert rank.buffers == 2 * m * row
    eager = peak_bytes(MLP, build("1f1b", 4, m), 1, "none")
    assert graphed_peak_bytes(MLP, build("1f1b", 4, m), 1, "none") > eager  # what eager frees, the graphs keep


def test_a_split_backward_leaves_what_only_gelu_keeps_held_for_good():
    """ZB-H1 against 1F1B on one GPU: each weight-grad frees what the weighted modules keep (the layernorm's input,
    fc1's and fc2's inputs) but not GELU's input (4 H per token), which the kept output's autograd graph holds."""
    m = 4
    n = TOKENS // m
    split, plain = (graphed_ranks(MLP, build(name, 1, m), n, "none")[0] for name in ("zb-h1", "1f1b"))
    assert split.pool_end - plain.pool_end == m * LAYERS * 4 * H * n * 2
    assert MLP.layers[0].unweighted_stash_bytes_per_token == 4 * H * 2


@pytest.mark.parametrize("tokens", [128, 1024])
def test_a_weight_grad_frees_each_blocks_saved_inputs_before_the_next_blocks_gradients(tokens):
    """ZB-H1 on one GPU, two MLP blocks, two micro-batches of n tokens, no optimizer (F I W F I W). A split forward
    holds 9 + 10 rows of stash (the first block's input is the static batch), a captured fc2 output per block and its
    output; I adds 6 rows of output gradients per block; W frees 4 + 5 rows as it goes (the layernorms' inputs but
    the static one, fc2's inputs), each block's after making its gradients G, and 16 when it ends, leaving GELU's
    inputs (4 rows a block) and the output. The second W makes G again per block on top of the first's."""
    model = mlp_model(2, H, 2 * tokens)
    _, row, grads = _mlp_bytes(tokens)
    forward, input_grad = (9 + 10 + 2 + 1) * row, 12 * row
    left = 9 * row + 2 * grads  # after the first W: GELU's inputs, the output, the gradients
    second = left + forward + input_grad
    (rank,) = graphed_ranks(model, build("zb-h1", 1, 2), tokens, "none")
    assert rank.pool_peak == max(forward + input_grad + grads, second + grads, second - 4 * row + 2 * grads)
    assert rank.pool_end == 2 * (9 * row) + 2 * grads


def test_later_backwards_make_the_gradients_again_before_adding_them_in():
    """1F1B on one GPU with one layer: F B F B. The second backward holds the first's gradients (the step's) and
    its own until it adds them in, over the second micro-batch's stash less the layer's input (the static batch):
    at its working memory's peak (5 rows), only fc2's are made."""
    model = mlp_model(1, H, TOKENS)
    n = TOKENS // 2
    stash, row, grads = _mlp_bytes(n)
    (rank,) = graphed_ranks(model, build("1f1b", 1, 2), n, "none")
    assert rank.pool_peak == grads + row + (stash - row) + row + 5 * row + FC2_GRADS
    assert rank.pool_end == grads + 2 * row


@pytest.mark.parametrize("path", sorted(ROOT.glob("data/validation/*/graphs-check.json")))
def test_the_pools_measured_on_an_h200_end_as_modelled(path: Path):
    """scripts/graphs_gpu_check.py's MLP cases (8 x h=512, 2048 tokens, 4 micro-batches, one GPU, every schedule,
    graphs and graphs-step): what the pool has allocated after the captures is the model's end, but for the
    step's m + 1 loss scalars (a 512-byte block each); its peak stays below what the pool reserved."""
    cases = [c for c in json.loads(path.read_text())["cases"] if c["model"].startswith("8 x mlp")]
    assert len(cases) == 16
    model = mlp_model(8, 512, 2048)
    for c in cases:
        m = c["microbatches"]
        (rank,) = graphed_ranks(model, build(c["schedule"], 1, m, c["virtual_stages"]), 2048 // m, "none")
        assert rank.pool_end + (m + 1) * 512 == c["graph_pool_bytes"]["allocated"], c["schedule"]
        assert rank.pool_peak <= c["graph_pool_bytes"]["reserved"]


def test_a_transformers_last_stage_keeps_every_micro_batchs_logits():
    """The head's output (the logits) is kept for every micro-batch: four more micro-batches of the same size on the
    last of two ranks end with four more micro-batches' logits and input gradients."""
    shape = TransformerShape("llama", hidden=64, ffn=160, heads=8, kv_heads=2, head_dim=8, vocab=1000, seq=32)
    model = transformer_model(shape, 4, 16)
    ends = [graphed_ranks(model, build("1f1b", 2, m), 2, "none")[1].pool_end for m in (4, 8)]
    assert ends[1] - ends[0] == 4 * 2 * (1000 * 32 * 2 + 64 * 32 * 2)


def test_runtimes_dispatch_and_the_graphed_ones_refuse_recomputation(capsys: pytest.CaptureFixture[str]):
    schedule = build("1f1b", 2, 4)
    for name in ("hw", "torch"):
        runtime = get_runtime(name)
        assert runtime.peak_bytes(MLP, schedule, 1, "none") == \
            peak_bytes(MLP, schedule, 1, "none", keeps_outputs=runtime.keeps_outputs, holds_sends=runtime.holds_sends)
    for name in ("graphs", "graphs-step"):
        assert get_runtime(name).peak_bytes(MLP, schedule, 1, "adam") == graphed_peak_bytes(MLP, schedule, 1, "adam")
    with pytest.raises(ModelError, match="keep every activation"):
        get_runtime("graphs").peak_bytes(MLP, schedule, 1, "none", "always")
    assert main(["predict", "--runtime", "graphs", "--recompute", "always", "--layers", "4", "--gpus", "2"]) != 0
    assert "keep every activation" in capsys.readouterr().err


def test_adam_adds_12_bytes_a_parameter_and_activations_leave_out_weights_and_gradients():
    schedule = build("1f1b", 2, 4)
    params = max(sum(MLP.layers[i].params for i in ids) for ids in ([0, 1], [2, 3]))
    assert graphed_peak_bytes(MLP, schedule, 1, "adam") - graphed_peak_bytes(MLP, schedule, 1, "none") == 12 * params
    n = TOKENS // 4
    ranks = graphed_ranks(MLP, schedule, n, "none", gradients=False)
    assert graphed_activation_bytes(MLP, schedule) == [r.buffers + r.pool_peak for r in ranks]
    assert all(r.static == 0 for r in ranks)
    with_grads = graphed_ranks(MLP, schedule, n, "none")
    assert all(a.pool_end == b.pool_end - 2 * params for a, b in zip(ranks, with_grads, strict=True))
