"""The graphs runtimes in parsim: hw's schedules, one launch per action (or per step), the layers' fixed GPU time
scaled apart from their matmuls; closed forms on one GPU."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import make_profile

from parsim.errors import ProfileError, ScheduleError
from parsim.profile import LayerCosts, OpCost, RuntimeCosts, from_json
from parsim.runtimes import RUNTIMES, get_runtime
from parsim.runtimes.graphs import GRAPHS, STEP_GRAPH
from parsim.schedules import SCHEDULES, build
from parsim.sim.predict import predict
from parsim.workload import mlp_model

MODEL = mlp_model(layers=8, hidden=1024, tokens=4096)
FLOPS = 16 * 1024**2 * 4096  # the batch's forward FLOPs per MLP layer: 2 x 8h^2 per token; each backward half the same


def with_runtime(profile, name: str, **kw):
    return dataclasses.replace(profile, runtimes={name: RuntimeCosts(**kw)})


def gpu_step_s(layers: int = 8, rate: float = 1e12) -> float:
    """The whole batch's GPU time: forward, input-grad and weight-grad of every layer at `rate`."""
    return 3 * layers * FLOPS / rate


@pytest.mark.parametrize("microbatches", [1, 4, 16])
@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved-1f1b"])
def test_a_host_bound_point_under_graphs_takes_the_gpus_time(name, microbatches):
    """Eager, the host's 1 ms per layer sets the pace; graphed, one 20 us launch per action, the GPU runs back to
    back from the first launch on: step = action_s + the batch's GPU time (any schedule on one GPU)."""
    profile = make_profile(action_s=1e-4, layer_host_s=1e-3)
    graphed = with_runtime(profile, "graphs", action_s=2e-5, p2p_s=0.0, layer_host=0.0)
    s = GRAPHS.build(name, 1, microbatches)
    eager = predict(s, MODEL, profile)[0].step_time_s
    step = predict(s, MODEL, graphed, runtime=GRAPHS)[0].step_time_s
    assert step == pytest.approx(2e-5 + gpu_step_s(), rel=1e-9)
    assert eager >= 3 * 8 * microbatches * 1e-3  # every layer's every op launched by the host, one by one


def test_graphs_pay_one_launch_per_action_where_the_host_is_slower_than_the_gpu():
    """Tiny layers: each action costs the host action_s whatever its layers, so the step is one launch per action."""
    tiny = mlp_model(layers=8, hidden=8, tokens=16)
    graphed = with_runtime(make_profile(layer_host_s=1e-3), "graphs", action_s=1e-3, p2p_s=0.0, layer_host=0.0)
    step = predict(GRAPHS.build("gpipe", 1, 4), tiny, graphed, runtime=GRAPHS)[0].step_time_s
    gpu_last = 2 * 8 * 16 * 8**2 * 16 / 4 / 1e12  # the last backward's GPU time after its launch
    assert step == pytest.approx(8 * 1e-3 + gpu_last, rel=1e-9)


@pytest.mark.parametrize("gpu_scale,fixed_scale", [(1.0, 0.5), (1.25, 0.8), (0.9, 1.0)])
def test_the_fixed_scale_shortens_each_layers_fixed_time_and_gpu_scale_all_of_it(gpu_scale, fixed_scale):
    cost = OpCost(1e-4, 3e-5, 5e14)
    profile = dataclasses.replace(make_profile(), layers={"mlp": LayerCosts(cost, cost, cost)})
    viewed = GRAPHS.costs(with_runtime(profile, "graphs", action_s=1e-5, p2p_s=0.0, layer_host=0.0,
                                       gpu_scale=gpu_scale, gpu_fixed_scale=fixed_scale))
    for op in dataclasses.astuple(viewed.layers["mlp"]):
        op = OpCost(*op)
        assert op.gpu_s(1e12) == pytest.approx(gpu_scale * (fixed_scale * 3e-5 + 1e12 / 5e14))
        assert op.host_s == 0.0


def test_the_graphs_runtime_runs_hws_schedules_unchanged():
    assert GRAPHS.schedules() == tuple(sorted(SCHEDULES))
    for name in ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv", "dualpipev"):
        assert GRAPHS.build(name, 2, 4) == build(name, 2, 4)
    assert {"graphs", "graphs-step"} <= set(RUNTIMES) and get_runtime("graphs") is GRAPHS


@pytest.mark.parametrize("bookkeeping_s,expected", [(1e-3, None), (3.0, 3.0)])
def test_one_graph_per_step_costs_one_launch_per_step(bookkeeping_s, expected):
    """No host time per action: the GPU runs the batch from the start; the step's launch and bookkeeping
    (step_s) hide behind it unless longer."""
    profile = with_runtime(make_profile(action_s=1e-3, layer_host_s=1e-3), "graphs-step", action_s=0.0, p2p_s=0.0,
                           layer_host=0.0, step_s=bookkeeping_s)
    step = predict(STEP_GRAPH.build("1f1b", 1, 8), MODEL, profile, runtime=STEP_GRAPH)[0].step_time_s
    assert step == pytest.approx(expected or gpu_step_s(), rel=1e-9)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved-1f1b"])
def test_bookkeeping_before_the_first_action_delays_the_gpu_and_after_the_last_hides_behind_it(name):
    """GPU-bound on one GPU: 0.2 ms of the runtime's bookkeeping before its first launch (begin_s) adds 0.2 ms to
    the step; the same after its last launch (step_s) is hidden behind the GPU's work."""
    s = GRAPHS.build(name, 1, 4)

    def step(**kw) -> float:
        graphed = with_runtime(make_profile(), "graphs", action_s=2e-5, p2p_s=0.0, layer_host=0.0, **kw)
        return predict(s, MODEL, graphed, runtime=GRAPHS)[0].step_time_s

    assert step(step_s=2e-4) == pytest.approx(step(), rel=1e-12)
    assert step(begin_s=2e-4) == pytest.approx(step() + 2e-4, rel=1e-9)


def test_one_graph_per_step_refuses_a_pipeline_of_several_gpus():
    with pytest.raises(ScheduleError, match="one graph per step runs on one GPU"):
        STEP_GRAPH.build("1f1b", 2, 4)


def test_a_profile_without_graphs_costs_names_the_calibration():
    with pytest.raises(ProfileError, match="calibrate --runtimes graphs"):
        GRAPHS.costs(make_profile())


def test_the_fixed_scale_round_trips_and_defaults_to_one_in_older_profiles():
    profile = with_runtime(make_profile(bandwidth_Bps=1e10), "graphs", action_s=1e-5, p2p_s=1e-5, layer_host=0.01, gpu_scale=1.01,
                           gpu_fixed_scale=0.7)
    assert from_json(profile.to_json()).runtimes == profile.runtimes
    doc = profile.to_json()
    del doc["runtimes"]["graphs"]["gpu_fixed_scale"]
    assert from_json(doc).runtimes["graphs"].gpu_fixed_scale == 1.0


def test_graphs_keep_hws_copy_streams_and_torch_refuses_them():
    from parsim.cli import main

    assert GRAPHS.copy_streams and not get_runtime("torch").copy_streams and not STEP_GRAPH.copy_streams
    assert main(["predict", "--gpus", "2", "--runtime", "torch", "--copy-streams"]) == 2


@pytest.mark.parametrize("name,virtual,stages", [("gpipe", None, 1), ("zb-h1", None, 1), ("interleaved-1f1b", 2, 2)])
def test_each_gradient_action_after_its_stages_first_adds_the_stages_gradients(name, virtual, stages):
    """GPU-bound on one GPU, 8 micro-batches: 7 adds per stage (the first B or W of a stage defines .grad), each
    accumulate_s + 3 x the stage's gradient bytes (read both, write one) / accumulate_Bps."""
    costs = dict(action_s=0.0, p2p_s=0.0, layer_host=0.0)
    plain = with_runtime(make_profile(), "graphs", **costs)
    adding = with_runtime(make_profile(), "graphs", **costs, accumulate_s=1e-5, accumulate_Bps=1e12)
    s = GRAPHS.build(name, 1, 8, virtual)
    extra = predict(s, MODEL, adding, runtime=GRAPHS)[0].step_time_s - predict(s, MODEL, plain, runtime=GRAPHS)[0].step_time_s
    stage_bytes = 8 * (8 * 1024**2 + 7 * 1024) * 2 / stages  # MLP block: 8h^2 + 7h bf16 parameters
    assert extra == pytest.approx(7 * stages * (1e-5 + 3 * stage_bytes / 1e12), rel=1e-9)


def test_hws_runner_models_no_gradient_add_unless_its_profile_has_one():
    """The eager runner's predictions are unchanged: the add is a runtime's measured cost (graphs: calibrated)."""
    profile = make_profile()
    s = build("gpipe", 1, 8)
    assert "accumulate" not in profile.kernels
    assert predict(s, MODEL, profile)[0].step_time_s == pytest.approx(gpu_step_s(), rel=1e-9)
