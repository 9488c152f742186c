"""The real pipeline on the CPU (gloo): gradients equal one device's, and a failing rank ends the run."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from conftest import assert_same_gradients, one_device_step

torch = pytest.importorskip("torch")

from hw.run.ranks import spawn  # noqa: E402
from hw.run.runtimes import gradient_step_worker  # noqa: E402
from hw.run.stage_runner import StageRunner, StepIO  # noqa: E402
from parsim.errors import ParsimError  # noqa: E402
from parsim.schedules import build  # noqa: E402
from parsim.workload import conv_model, mlp_model  # noqa: E402

MODEL = mlp_model(layers=4, hidden=16, tokens=24)
CONV = conv_model(images=12, widths=(4, 8), blocks=(2, 2), side=8)  # conv 4@8x8 x2, down 8@4x4, conv 8@4x4


@pytest.mark.parametrize("name,ranks,microbatches,virtual", [
    ("gpipe", 2, 3, None), ("1f1b", 2, 4, None), ("gpipe", 4, 2, None), ("1f1b", 4, 6, None),
    ("interleaved-1f1b", 2, 2, 2), ("zb-h1", 2, 3, None), ("zb-h1", 4, 6, None),
    ("torch:ZBVZeroBubble", 2, 4, None), ("torch:DualPipeV", 2, 4, None),
    ("zbv", 2, 4, None), ("zbv", 2, 2, None), ("dualpipev", 2, 4, None), ("looped-bfs", 2, 3, 2),
])
def test_pipelined_step_matches_single_device_loss_and_gradients(name, ranks, microbatches, virtual):
    schedule = build(name, ranks, microbatches, virtual)
    results = spawn(gradient_step_worker, ranks, (schedule, MODEL, torch.float64), timeout_s=30, deadline_s=120)
    assert_same_gradients(results, schedule.stage_to_rank[-1], *one_device_step(MODEL))


@pytest.mark.parametrize("name,ranks,microbatches,recompute", [
    ("gpipe", 1, 3, "always"), ("gpipe", 2, 3, "except-last"), ("1f1b", 2, 4, "always"), ("gpipe", 4, 4, "always"),
])
def test_recomputing_stages_get_the_single_devices_loss_and_gradients(name, ranks, microbatches, recompute):
    """torch.utils.checkpoint around a micro-batch's stage forward, run again in its backward: the same numbers."""
    schedule = build(name, ranks, microbatches)
    results = spawn(gradient_step_worker, ranks, (schedule, MODEL, torch.float64, None, 1, "hw", recompute),
                    timeout_s=30, deadline_s=120)
    assert_same_gradients(results, schedule.stage_to_rank[-1], *one_device_step(MODEL))


@pytest.mark.parametrize("name,ranks,microbatches,recompute,virtual", [
    ("gpipe", 2, 3, "always", None), ("gpipe", 2, 3, "except-last", None), ("1f1b", 2, 4, "always", None),
    ("1f1b", 4, 4, "except-last", None), ("interleaved-1f1b", 2, 2, "always", 2),
])
def test_early_recomputing_stages_get_the_single_devices_loss_and_gradients(name, ranks, microbatches, recompute,
                                                                            virtual):
    """The forward run under no_grad, then again in the backward before its gradient is awaited (copy streams' early
    recompute, asked for without them: the CPU has none): the same numbers. Interleaved: a stage whose gradient
    comes from a stage on its own rank recomputes inside autograd's backward, beside those that recompute early."""
    schedule = build(name, ranks, microbatches, virtual)
    results = spawn(gradient_step_worker, ranks, (schedule, MODEL, torch.float64, None, 1, "hw", recompute, 1, True),
                    timeout_s=30, deadline_s=120)
    assert_same_gradients(results, schedule.stage_to_rank[-1], *one_device_step(MODEL))


@pytest.mark.parametrize("early,order", [
    (True, ["F", "F", "F", "await", "F", "await"]),  # each backward's forward first, then its gradient awaited
    (False, ["F", "F", "await", "F", "await", "F"]),  # checkpoint's forward again inside the backward, after it
])
def test_early_recompute_runs_the_forward_before_awaiting_the_gradient(early, order):
    """Stage 0 of GPipe on 2 ranks, 2 micro-batches, its messages faked on one process: where the stage's forward
    starts (a pre-hook: checkpoint stops the forward it runs again once it has what the backward needs) against
    where the step awaits each gradient; an early-recomputed forward keeps no graph."""
    schedule = build("gpipe", 2, 2)
    stage = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4))
    runner = _Loopback(schedule, 0, {0: stage}, {}, recompute="always", early_recompute=early)
    stage.register_forward_pre_hook(lambda *_: runner.log.append("F"))
    stage.register_forward_hook(lambda _, __, y: runner.graphs.append(y.grad_fn is not None))
    runner.step(StepIO([torch.randn(2, 4)] * 2, [torch.randn(2, 4)] * 2, 4))
    assert runner.log == order
    assert runner.graphs[:2] == [not early] * 2  # the two forwards proper: a graph only where checkpoint keeps one
    assert all(p.grad is not None for p in stage.parameters())


def test_early_recompute_draws_the_forwards_dropout_masks_again():
    """A stage with dropout: the forward run again before the backward draws the masks its forward drew (the RNG
    replayed, as checkpoint does), so it rebuilds the outputs sent on, and the gradients are checkpoint's."""
    grads, outputs = {}, {}
    for early in (True, False):
        torch.manual_seed(0)
        stage = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 4))
        runner = _Loopback(build("gpipe", 2, 2), 0, {0: stage}, {}, recompute="always", early_recompute=early)
        seen: list[torch.Tensor] = []
        stage.register_forward_hook(lambda _, __, y, seen=seen: seen.append(y.detach().clone()))
        runner.step(StepIO([torch.randn(2, 4), torch.randn(2, 4)], [torch.randn(2, 4)] * 2, 4))
        grads[early], outputs[early] = [p.grad for p in stage.parameters()], seen
    sent, rebuilt = outputs[True][:2], outputs[True][2:]  # micro-batch 0's and 1's forwards, then each again
    assert all(torch.equal(a, b) for a, b in zip(sent, rebuilt, strict=True))
    assert not torch.equal(sent[0], sent[1])
    assert all(torch.equal(a, b) for a, b in zip(grads[True], grads[False], strict=True))


class _Loopback(StageRunner):
    """A rank whose sends go nowhere and whose receives get ones at once, logging where a step awaits one."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[str] = []
        self.graphs: list[bool] = []

    def _send(self, a, deps, io, st):
        self._handed(deps[0], st)

    def _recv(self, a, deps, io, st):
        st.received[a] = (torch.ones(2, 4), None)

    def _await_message(self, recv, st):
        self.log.append("await")


def test_what_hws_runner_cannot_recompute_is_refused_in_one_line():
    from hw.run.runtimes import check_runs
    from hw.run.stage_runner import check_recompute

    with pytest.raises(ParsimError, match="splits its backward"):
        check_recompute(build("zb-h1", 2, 4), "always")
    assert check_recompute(build("zb-h1", 2, 4), "never") == "never"
    assert check_recompute(build("zb-h1", 2, 4), "selective") == "selective"  # the core has no weights: W is as ever
    for runtime in ("torch", "graphs"):
        for mode in ("always", "selective"):
            with pytest.raises(ParsimError, match="hw's runner only"):
                check_runs(runtime, recompute=mode)
    with pytest.raises(ParsimError, match="--tensor-parallel 1"):
        check_runs("hw", recompute="selective", tensor_parallel=2)


@pytest.mark.parametrize("name,microbatches,balance", [
    ("gpipe", 3, None), ("1f1b", 4, (3, 1)), ("zb-h1", 4, (1, 3)),
])
def test_conv_pipeline_matches_single_device_on_the_same_microbatches(name, microbatches, balance):
    """Stages of a conv net, split equally or by an explicit balance (then the boundary's map is not the input's)."""
    model = replace(CONV, balance=balance)
    schedule = build(name, 2, microbatches)
    results = spawn(gradient_step_worker, 2, (schedule, model, torch.float64), timeout_s=30, deadline_s=120)
    loss, grads = one_device_step(model, microbatches)
    assert_same_gradients(results, 1, loss, grads)
    assert set(results[0].grads) == {k for k in grads if int(k.split(".")[0]) < (balance or (2,))[0]}


@pytest.mark.parametrize("name,ranks,replicas", [("1f1b", 1, 2), ("1f1b", 2, 2), ("zb-h1", 2, 2)])
def test_data_parallel_replicas_average_to_the_single_device_gradients(name, ranks, replicas):
    schedule = build(name, ranks, 2)
    results = spawn(gradient_step_worker, ranks * replicas, (schedule, MODEL, torch.float64, None, replicas),
                    timeout_s=30, deadline_s=120)
    loss, grads = one_device_step(MODEL)
    last = [r for r in results if r.loss is not None]  # each replica's last stage: the loss of its share
    assert len(last) == replicas
    assert torch.allclose(sum(r.loss for r in last) / replicas, loss, rtol=1e-12, atol=0)
    for r in results:  # every rank holds its stages' full-batch gradient after the all-reduce
        for key, g in r.grads.items():
            assert torch.allclose(g, grads[key], rtol=1e-10, atol=1e-14), key


@pytest.mark.parametrize("name,ranks,microbatches", [("interleaved-1f1b", 2, 2), ("torch:DualPipeV", 2, 4)])
def test_the_runner_runs_parsims_dataflow(name, ranks, microbatches):
    """Each action runs in program order with iter_waits' data deps, waiting first for the receive among them."""
    from hw.run.stage_runner import StageRunner, stage_modules
    from parsim.sim.dataflow import iter_waits

    schedule = build(name, ranks, microbatches)
    waits = dict(iter_waits(schedule, copy_streams=True))
    for rank in range(ranks):
        stages = stage_modules(MODEL, schedule, rank, torch.device("cpu"), torch.float64)
        program = StageRunner(schedule, rank, stages, {}).program
        assert [p.action for p in program] == list(schedule.actions[rank])
        for p in program:
            assert list(p.deps) == waits[p.action]
            assert p.message == next((d for d in p.deps if d.op.startswith("RECV")), None)


def test_a_rank_that_fails_mid_step_ends_every_process_with_a_clear_error():
    schedule = build("1f1b", 4, 4)
    t0 = time.monotonic()
    with pytest.raises(ParsimError, match=r"rank 2 failed: RuntimeError: injected failure after .*every other rank was stopped"):
        spawn(gradient_step_worker, 4, (schedule, MODEL, torch.float64, (2, 3)), timeout_s=10, deadline_s=60)
    assert time.monotonic() - t0 < 30




def test_split_backward_computes_each_gradient_once():
    """I then W cost what one B costs: W runs each weighted module's own backward node, nothing more."""
    import torch.nn as nn

    from hw.run.stage_runner import capture_weighted_outputs

    torch.manual_seed(0)
    stage = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8)).double()
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    with capture_weighted_outputs(stage) as captured:
        y = stage(x)
    assert [m for m, _ in captured] == [stage[0], stage[2]]
    calls = []
    for m in (stage[0], stage[2]):
        m.weight.register_hook(lambda g, m=m: calls.append(m) or g)
    outs = [out for _, out in captured]
    dx, *douts = torch.autograd.grad(y.sum(), [x, *outs], retain_graph=True)
    assert calls == []  # I leaves the weights alone
    for (m, out), g in zip(captured, douts):
        torch.autograd.backward(out, g, inputs=list(m.parameters(recurse=False)))
    assert sorted(map(id, calls)) == sorted(map(id, [stage[0], stage[2]]))  # each weight's grad once
    ref = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8)).double()
    ref.load_state_dict(stage.state_dict())
    x2 = x.detach().clone().requires_grad_()
    ref(x2).sum().backward()
    assert torch.allclose(dx, x2.grad)
    for a, b in zip(stage.parameters(), ref.parameters()):
        assert torch.allclose(a.grad, b.grad)
