"""hw's graphed runner on the CPU, through the eager stand-in for CUDA graphs: the same loss and gradients as hw's
eager runner bit for bit, captures in program order replayed in that order, static buffers, capture in warm-up."""

from __future__ import annotations

import pytest
from conftest import allocator_peak_bytes

torch = pytest.importorskip("torch")

from hw.nets.blocks import loss_for  # noqa: E402
from hw.run.cuda_graphs import EagerGraphs, GraphRunner, graphs_runner  # noqa: E402
from hw.run.ranks import spawn  # noqa: E402
from hw.run.runtimes import RUNNERS, gradient_step_worker, runner_factory  # noqa: E402
from hw.run.stage_runner import (
    Groups,
    StageRunner,
    make_batch,
    replica_groups,
    split_batch,
    stage_modules,
    stage_shapes,
)
from parsim.errors import ParsimError  # noqa: E402
from parsim.schedules import build  # noqa: E402
from parsim.workload import TransformerShape, conv_model, graphed_ranks, mlp_model, transformer_model  # noqa: E402

CPU, F64 = torch.device("cpu"), torch.float64
MODEL = mlp_model(layers=4, hidden=16, tokens=24)
CONV = conv_model(images=12, widths=(4, 8), blocks=(2, 2), side=8)  # batch norm: state the warm-up must not change
ONE_RANK = [("gpipe", 3, None), ("1f1b", 4, None), ("interleaved-1f1b", 2, 2), ("looped-bfs", 3, 2),
            ("zb-h1", 3, None), ("zbv", 4, None), ("dualpipev", 4, None), ("interleaved-zb", 2, 2)]


def _pair(model, name: str, microbatches: int, virtual: int | None, whole_step: bool = False):
    """hw's eager runner and the graphed one, each with its own copy of the same weights, on one rank."""
    s = build(name, 1, microbatches, virtual)
    eager = StageRunner(s, 0, stage_modules(model, s, 0, CPU, F64), {})
    graphed = GraphRunner(s, 0, stage_modules(model, s, 0, CPU, F64), {}, EagerGraphs(), whole_step=whole_step)
    return eager, graphed, split_batch(*make_batch(model, CPU, F64), microbatches, stage_shapes(model, s.num_stages))


def _params(runner):
    return [p for s in sorted(runner.stages) for p in runner.stages[s].parameters()]


def _buffers(runner):
    return [b for s in sorted(runner.stages) for b in runner.stages[s].buffers()]


def _step_both(eager, graphed, io, clear: bool = True):
    losses = []
    for runner in (eager, graphed):
        if clear:
            for p in _params(runner):
                p.grad = None
        losses.append(runner.step(io))
    return losses


def _assert_same(eager, graphed, losses):
    assert torch.equal(losses[0], losses[1])
    for a, b in zip(_params(eager), _params(graphed)):
        assert torch.equal(a.grad, b.grad)
    for a, b in zip(_buffers(eager), _buffers(graphed)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name,microbatches,virtual,whole_step",
                         [(*case, False) for case in ONE_RANK] + [("gpipe", 3, None, True), ("zbv", 4, None, True)])
def test_graphed_steps_equal_eager_steps_bit_for_bit(name, microbatches, virtual, whole_step):
    """Gradients accumulate into the flat buffer in program order, as autograd accumulates .grad: no rounding differs."""
    eager, graphed, io = _pair(MODEL, name, microbatches, virtual, whole_step)
    for _ in range(2):
        _assert_same(eager, graphed, _step_both(eager, graphed, io))


@pytest.mark.parametrize("name,microbatches", [("gpipe", 3), ("zb-h1", 3)])
def test_batch_norm_nets_equal_eager_and_capture_leaves_their_running_statistics_alone(name, microbatches):
    eager, graphed, io = _pair(CONV, name, microbatches, None)
    graphed.prepare(io)  # warm-up and (stand-in) captures run the forwards: their batch statistics are put back
    for a, b in zip(_buffers(eager), _buffers(graphed)):
        assert torch.equal(a, b)
    for _ in range(2):
        _assert_same(eager, graphed, _step_both(eager, graphed, io))


@pytest.mark.parametrize("name,microbatches", [("1f1b", 4), ("zb-h1", 3)])
def test_gradients_accumulate_across_steps_as_eager_does_into_the_same_tensors(name, microbatches):
    """Not cleared between steps, .grad keeps adding up; a .grad the caller set keeps its identity and sums into it."""
    eager, graphed, io = _pair(MODEL, name, microbatches, None)
    mine = {}
    for runner in (eager, graphed):
        p = _params(runner)[0]
        p.grad = torch.ones_like(p)
        mine[runner] = p.grad
    for _ in range(3):
        losses = _step_both(eager, graphed, io, clear=False)
    _assert_same(eager, graphed, losses)
    assert _params(graphed)[0].grad is mine[graphed] and _params(eager)[0].grad is mine[eager]


def test_captures_run_in_program_order_and_every_step_replays_them_in_that_order():
    """One pool per rank is safe only so: a later graph may reuse what an earlier one freed."""
    eager, graphed, io = _pair(MODEL, "zbv", 4, None)
    graphed.step(io)
    graphed.step(io)
    computes = [a for a in graphed.schedule.actions[0] if a.is_compute]
    log = graphed.graphs.log
    assert log[:len(computes)] == [("capture", a) for a in computes]
    assert log[len(computes):] == [("replay", a) for a in computes] * 2


def test_one_graph_per_step_captures_the_whole_program_once_and_needs_gradients_cleared():
    eager, graphed, io = _pair(MODEL, "1f1b", 4, None, whole_step=True)
    _step_both(eager, graphed, io)
    _step_both(eager, graphed, io)
    assert graphed.graphs.log == [("capture", "step"), ("replay", "step"), ("replay", "step")]
    with pytest.raises(ParsimError, match=r"needs every \.grad cleared"):
        graphed.step(io)  # accumulating over steps would need an add inside the graph, after its first action


def test_a_step_reads_its_batch_through_static_buffers_captured_once():
    """A new batch of the same shapes is copied into the captured inputs (no new capture); new shapes capture again."""
    eager, graphed, io = _pair(MODEL, "gpipe", 3, None)
    _step_both(eager, graphed, io)
    inputs = [t.data_ptr() for t in graphed.inputs]
    other = split_batch(*(t * 2 for t in make_batch(MODEL, CPU, F64)), 3, io.stage_shapes)
    _assert_same(eager, graphed, _step_both(eager, graphed, other))
    assert graphed.captures == 1 and [t.data_ptr() for t in graphed.inputs] == inputs
    assert all(mine is not theirs for mine, theirs in zip(graphed.inputs, other.inputs))
    bigger = split_batch(*make_batch(mlp_model(4, 16, 72), CPU, F64), 3)
    _assert_same(eager, graphed, _step_both(eager, graphed, bigger))
    assert graphed.captures == 2


def test_receives_land_in_the_static_buffer_of_the_action_that_reads_them():
    s = build("1f1b", 2, 2)
    io = split_batch(*make_batch(MODEL, CPU, F64), 2)
    runner = GraphRunner(s, 1, stage_modules(MODEL, s, 1, CPU, F64), {}, EagerGraphs())
    runner.prepare(io)
    receive = next(a for a in s.actions[1] if a.op == "RECV_F")
    assert runner._receive_buffer(receive, io) is runner._receive_buffer(receive, io) is runner.received[receive]
    assert runner.received[receive].shape == io.inputs[0].shape


@pytest.mark.parametrize("name,ranks,m,virtual", [("gpipe", 3, 3, None), ("1f1b", 2, 4, None),
                                                   ("interleaved-1f1b", 2, 4, 2), ("zbv", 2, 4, None)])
def test_the_static_tensors_outside_the_pool_are_what_parsim_counts(name: str, ranks: int, m: int, virtual):
    """Each rank's static buffers (a receive's each, stage 0's copy of the inputs, the last stage's of the targets)
    take the bytes parsim.workload.graph_memory counts for them, fp64 here."""
    s = build(name, ranks, m, virtual)
    io = split_batch(*make_batch(MODEL, CPU, F64), m, stage_shapes(MODEL, s.num_stages))
    modelled = graphed_ranks(mlp_model(4, 16, 24, dtype_bytes=8), s, 24 // m)
    for r in range(ranks):
        runner = GraphRunner(s, r, stage_modules(MODEL, s, r, CPU, F64), {}, EagerGraphs())
        runner.prepare(io)
        assert runner.static_bytes() == modelled[r].buffers > 0


def _capture_peak_bytes(runner: GraphRunner, io) -> int:
    """The most bytes the CPU allocator holds while `runner` captures (EagerGraphs: its warm-up and its captures run
    the same functions from the same state) beyond its static tensors: the pool's peak on a GPU."""
    return allocator_peak_bytes(lambda: runner.prepare(io)) - runner.static_bytes()


@pytest.mark.parametrize("name,virtual", [("gpipe", None), ("1f1b", None), ("zb-h1", None), ("zbv", None),
                                          ("interleaved-zb", 2), ("dualpipev", None)])
def test_the_captures_peak_is_the_modelled_pools_by_the_cpu_allocator(name: str, virtual: int | None):
    """8 MLP blocks (h=64, fp32, 4 micro-batches of 64 tokens) on one rank: what the captures hold at their peak is
    parsim's pool peak within 1% (the layernorms' statistics and the loss's scalars are not modelled). The split
    backwards' weight-grads free each module's saved inputs as they go: counted as freed only at their end, the
    model was 11% (ZB-H1) and 5% (ZBV) over here, as on an H200 (lab/graph-memory/pools.py)."""
    model = mlp_model(8, 64, 256, dtype_bytes=4)
    s = build(name, 1, 4, virtual)
    runner = GraphRunner(s, 0, stage_modules(model, s, 0, CPU, torch.float32), {}, EagerGraphs())
    io = split_batch(*make_batch(model, CPU, torch.float32), 4, stage_shapes(model, 1))
    (rank,) = graphed_ranks(model, s, 64, "none")
    assert rank.pool_peak == pytest.approx(_capture_peak_bytes(runner, io), rel=0.01)


@pytest.mark.parametrize("variant", ["llama", "gpt"])
@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1", "zbv"])
def test_a_transformers_captures_peak_is_the_modelled_pools_by_the_cpu_allocator(variant: str, name: str):
    """A transformer (4 blocks, vocab 1000, fp32) on one rank: the captures' peak is the model's within 1% by the
    CPU allocator. A split backward's W holds the head's logits in its captured list and the kept output: counted
    twice, the model was 3.5-4.7% over. A whole backward frees the loss's log-softmax before the head's weight
    gradient: counted beside it, the model was 2-4% over (and 2-10% over on an H200, issue 44)."""
    shape = TransformerShape(variant, hidden=64, ffn=160, heads=4, kv_heads=2 if variant == "llama" else 4,
                             head_dim=16, vocab=1000, seq=32, positions=0 if variant == "llama" else 64,
                             dtype_bytes=4)
    model = transformer_model(shape, 4, 16)
    s = build(name, 1, 4)
    runner = GraphRunner(s, 0, stage_modules(model, s, 0, CPU, torch.float32), {}, EagerGraphs(), loss_for(model))
    io = split_batch(*make_batch(model, CPU, torch.float32), 4, stage_shapes(model, 1))
    (rank,) = graphed_ranks(model, s, 4, "none")
    assert rank.pool_peak == pytest.approx(_capture_peak_bytes(runner, io), rel=0.01)


def test_the_factory_captures_before_any_step_and_refuses_data_parallelism():
    s = build("1f1b", 1, 4)
    runner, stages, replica = graphs_runner(s, MODEL, 0, CPU, F64, replica_groups(s, Groups(), 1))
    assert runner.captures == 1 and runner.graphs.log and replica == 0 and set(stages) == {0}
    assert runner.graph_pool_bytes is None  # no pool on the CPU
    with pytest.raises(ParsimError, match="one pipeline replica"):
        graphs_runner(build("1f1b", 1, 4), MODEL, 0, CPU, F64, ([{}], {}), data_parallel=2)
    assert RUNNERS["graphs"] is graphs_runner and runner_factory("graphs-step")


def test_one_graph_per_step_refuses_a_rank_with_messages():
    s = build("1f1b", 2, 2)
    with pytest.raises(ParsimError, match="one-GPU pipeline only"):
        GraphRunner(s, 0, stage_modules(MODEL, s, 0, CPU, F64), {}, EagerGraphs(), whole_step=True)


def _both_runtimes(rank: int, world: int, device, cases) -> list:
    """Per case, this rank's loss and gradients under hw's eager runner and under the graphed one."""
    out = []
    for name, microbatches in cases:
        s = build(name, world, microbatches)
        out.append([gradient_step_worker(rank, world, device, s, MODEL, F64, runtime=runtime)
                    for runtime in ("hw", "graphs")])
    return out


def test_pipelines_across_ranks_equal_eager_bit_for_bit():
    """Messages outside the graphs, received into their static buffers: every schedule kind across two ranks."""
    cases = [("1f1b", 4), ("interleaved-1f1b", 2), ("zb-h1", 3), ("zbv", 4), ("dualpipev", 4)]
    results = spawn(_both_runtimes, 2, (cases,), timeout_s=60, deadline_s=300)
    for k in range(len(cases)):
        for rank in results:
            eager, graphed = rank[k]
            assert (eager.loss is None) == (graphed.loss is None)
            assert eager.loss is None or torch.equal(eager.loss, graphed.loss)
            assert eager.grads.keys() == graphed.grads.keys()
            assert all(torch.equal(g, graphed.grads[key]) for key, g in eager.grads.items()), cases[k]
