"""Runtimes: hw's runner unchanged, torch.distributed.pipelining's orders equal torch's own, and what its comm
plan does to a step (one communication stream per rank, batches, waits on sends)."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import equal_stages, make_profile

from parsim.errors import ParsimError, ProfileError, ScheduleError
from parsim.profile import RuntimeCosts, from_json
from parsim.runtimes import RUNTIMES, get_runtime
from parsim.runtimes.torch_pipelining import CLASSES, MULTI_STAGE, TORCH
from parsim.schedules import COMPUTE_OPS, CommPlan, Op, Schedule, act, build
from parsim.sim.check import validate
from parsim.sim.predict import predict, simulate
from parsim.workload import mlp_model


def with_torch_costs(profile, **kw):
    return dataclasses.replace(profile, runtimes={"torch": RuntimeCosts(profile.host.action_s, profile.host.p2p_s, **kw)})


@pytest.mark.parametrize("name", sorted(CLASSES))
@pytest.mark.parametrize("p,m", [(1, 2), (2, 4), (3, 6), (4, 8), (4, 5)])
def test_every_torch_schedule_validates_and_simulates_without_deadlock(name, p, m):
    v = 2 if name in MULTI_STAGE else None
    try:
        s = TORCH.build(name, p, m, v)
    except ScheduleError:
        pytest.skip("torch refuses these sizes too")  # checked against torch below
    validate(s)
    profile = with_torch_costs(make_profile(latency_s=5e-5, bandwidth_Bps=1e10, action_s=1e-5, p2p_s=1e-5))
    step = simulate(s, equal_stages(s.num_stages, 1e-3, 2e-3), TORCH.costs(profile)).step_time_s
    assert step >= 3e-3 * m * s.num_stages / p  # never faster than one rank's compute


def test_torch_gpipe_and_1f1b_run_the_generators_compute_order():
    for name in ("gpipe", "1f1b"):
        ours, theirs = TORCH.build(name, 4, 8), build(name, 4, 8)
        assert [[a for a in acts if a.op in COMPUTE_OPS] for acts in ours.actions] == \
            [[a for a in acts if a.op in COMPUTE_OPS] for acts in theirs.actions]


def test_torch_1f1b_posts_a_forward_send_with_the_next_backwards_receive_and_waits_for_both():
    s = TORCH.build("1f1b", 2, 4)
    f, rb = (lambda i: act(Op.SEND_F, 0, i)), (lambda i: act(Op.RECV_B, 0, i))
    assert s.comm.batches[0] == ((f(0),), (f(1), rb(0)), (f(2), rb(1)), (f(3), rb(2)), (rb(3),))
    # B0 waits for its input and the send posted with it, and (warm-up) for the send posted before F1
    assert s.comm.waits[act(Op.BACKWARD, 0, 0)] == (f(0), f(1), rb(0))
    assert act(Op.FORWARD, 0, 1) not in s.comm.waits


def test_torch_gpipe_waits_for_every_forward_send_before_the_first_backward():
    s = TORCH.build("gpipe", 3, 4)
    assert set(s.comm.waits[act(Op.BACKWARD, 0, 0)]) >= {act(Op.SEND_F, 0, i) for i in range(4)}


def _two_rank(comm: CommPlan | None) -> Schedule:
    """Rank 0 computes stage 0 twice (F0, F1) and sends each; rank 1 receives both, posting them up front."""
    a0 = (act(Op.FORWARD, 0, 0), act(Op.SEND_F, 0, 0), act(Op.FORWARD, 0, 1), act(Op.SEND_F, 0, 1),
          act(Op.RECV_B, 0, 0), act(Op.BACKWARD, 0, 0), act(Op.RECV_B, 0, 1), act(Op.BACKWARD, 0, 1))
    a1 = (act(Op.RECV_F, 1, 0), act(Op.RECV_F, 1, 1), act(Op.FORWARD, 1, 0), act(Op.BACKWARD, 1, 0),
          act(Op.SEND_B, 1, 0), act(Op.FORWARD, 1, 1), act(Op.BACKWARD, 1, 1), act(Op.SEND_B, 1, 1))
    return Schedule("x", 2, 2, (0, 1), (a0, a1), comm)


def test_a_ranks_batches_run_in_posting_order_on_its_one_stream():
    """Rank 1 posts two receives, then its first send. On one stream (torch) the send waits for both receives,
    so rank 0's B0 waits for the second forward message; on channel streams (hw) it need not."""
    profile = make_profile(latency_s=1e-3, bandwidth_Bps=1e15, action_s=0.0, p2p_s=0.0)
    costs = equal_stages(2, 1e-3, 1e-3)
    batches = tuple(tuple((a,) for a in acts if a.op not in COMPUTE_OPS) for acts in _two_rank(None).actions)
    hw = simulate(_two_rank(None), costs, profile)
    one_stream = simulate(_two_rank(CommPlan(batches)), costs, profile)
    end = {str(op.label): op.end_s for op in one_stream.ops}
    start = {str(op.label): op.start_s for op in one_stream.ops}
    assert start["SEND_B(s1,m0)->RECV_B(s0,m0)"] >= end["SEND_F(s0,m1)->RECV_F(s1,m1)"]
    assert one_stream.step_time_s >= hw.step_time_s


def test_messages_of_one_batch_run_together_without_deadlock():
    """Each rank posts its send with the receive of the other's send in one batch: serially that would deadlock."""
    a0 = (act(Op.FORWARD, 0, 0), act(Op.SEND_F, 0, 0), act(Op.RECV_B, 0, 0), act(Op.BACKWARD, 0, 0))
    a1 = (act(Op.RECV_F, 1, 0), act(Op.FORWARD, 1, 0), act(Op.BACKWARD, 1, 0), act(Op.SEND_B, 1, 0))
    comm = CommPlan(((a0[1:3],), ((a1[0],), (a1[3],))))
    s = Schedule("x", 2, 1, (0, 1), (a0, a1), comm)
    profile = make_profile(latency_s=1e-4, bandwidth_Bps=1e15, action_s=0.0, p2p_s=0.0)
    assert simulate(s, equal_stages(2, 1e-3, 1e-3), profile).step_time_s == pytest.approx(4e-3 + 2e-4)


def test_a_compute_waits_for_the_sends_its_runtime_awaits():
    """A forward made to wait for the send before it cannot start before that message ends."""
    s = _two_rank(None)
    waits = {act(Op.FORWARD, 0, 1): (act(Op.SEND_F, 0, 0),)}
    batches = tuple(tuple((a,) for a in acts if a.op not in COMPUTE_OPS) for acts in s.actions)
    sim = simulate(dataclasses.replace(s, comm=CommPlan(batches, waits)), equal_stages(2, 1e-3, 1e-3),
                   make_profile(latency_s=5e-3, bandwidth_Bps=1e15, action_s=0.0, p2p_s=0.0))
    ops = {str(op.label): op for op in sim.ops}
    assert ops["F(s0,m1)"].start_s >= ops["SEND_F(s0,m0)->RECV_F(s1,m0)"].end_s


def test_the_hw_runtime_predicts_exactly_what_predict_did_without_one():
    profile, model = make_profile(latency_s=2e-5, bandwidth_Bps=1e10, action_s=1e-4, p2p_s=1e-5), mlp_model(8, 256, 1024)
    for name in ("gpipe", "1f1b", "interleaved-1f1b", "zbv"):
        s = build(name, 4, 8)
        assert predict(s, model, profile)[0] == predict(s, model, profile, runtime=get_runtime("hw"))[0]


def test_a_runtimes_host_costs_replace_hw_runners_and_scale_the_layers():
    profile = make_profile(latency_s=0.0, bandwidth_Bps=1e15, action_s=1e-4, p2p_s=1e-5)
    viewed = TORCH.costs(with_torch_costs(profile, layer_host=2.0, gpu_scale=1.5, unmeasured=("p2p_s",)))
    assert viewed.host.action_s == profile.host.action_s
    for key, c in viewed.layers.items():
        base = profile.layers[key]
        assert c.forward.host_s == pytest.approx(2 * base.forward.host_s)
        assert c.forward.gpu_s(1e12) == pytest.approx(1.5 * base.forward.gpu_s(1e12))
    assert "torch.p2p_s" in viewed.describe()


def test_a_profile_without_a_runtimes_costs_names_the_calibration():
    with pytest.raises(ProfileError, match="calibrate --runtimes torch"):
        TORCH.costs(make_profile(latency_s=0.0, bandwidth_Bps=1e10))


def test_runtime_costs_round_trip_through_the_profile_file():
    profile = with_torch_costs(make_profile(latency_s=1e-5, bandwidth_Bps=1e10), unmeasured=("p2p_s",))
    assert from_json(profile.to_json()).runtimes == profile.runtimes


def test_unknown_runtime_and_schedule_names_are_one_clear_error():
    with pytest.raises(ParsimError, match="unknown runtime 'tf'"):
        get_runtime("tf")
    with pytest.raises(ScheduleError, match="the torch runtime runs"):
        TORCH.build("zb-h1", 2, 4)
    assert TORCH.build("torch:ZBVZeroBubble", 2, 4).name == "zbv"
    with pytest.raises(ScheduleError, match="Schedule1F1B needs at least as many micro-batches"):
        TORCH.build("1f1b", 4, 2)
    assert set(RUNTIMES) >= {"hw", "torch"}


# --- against torch's own classes, where torch is installed ---------------------------------------------------

def test_torch_comm_annotated_lists_equal_torchs_own_for_every_runtime_class():
    """parsim lays torch's lists down itself (torch-free); torch's _add_send_recv is the same in 2.11 and 2.13."""
    visualizer = pytest.importorskip("torch.distributed.pipelining._schedule_visualizer")
    from parsim.schedules.from_torch import parse_action

    checked = 0
    for name in sorted(set(CLASSES) - {"gpipe", "1f1b"}):
        for p in (1, 2, 3, 4):
            for v in (2, 3) if name in MULTI_STAGE else (None,):
                for m in range(1, 3 * p + 2):
                    try:
                        ops = visualizer.get_schedule_ops(CLASSES[name], p, m, num_stages_per_rank=v, with_comms=True)
                    except Exception:  # noqa: BLE001 - torch refuses these sizes: so must we
                        with pytest.raises(ScheduleError):
                            TORCH.build(name, p, m, v)
                        continue
                    theirs = [[a for x in row if x is not None for a in parse_action(str(x))] for row in ops]
                    assert [list(acts) for acts in TORCH.build(name, p, m, v).actions] == theirs, (name, p, m, v)
                    checked += 1
    assert checked > 150


def test_a_runtimes_per_step_bookkeeping_adds_to_each_ranks_host_time():
    profile = make_profile(latency_s=0.0, bandwidth_Bps=1e15, action_s=1e-3, p2p_s=0.0)
    s = TORCH.build("gpipe", 1, 4)
    costs = equal_stages(1, 1e-6, 1e-6)  # the host sets the pace: 8 actions of 1 ms, the GPU 1 us behind
    without = simulate(s, costs, TORCH.costs(with_torch_costs(profile))).step_time_s
    with_step = simulate(s, costs, TORCH.costs(with_torch_costs(profile, step_s=2e-3))).step_time_s
    assert without == pytest.approx(8e-3 + 1e-6)
    assert with_step == pytest.approx(8e-3 + 2e-3)  # after the last launch, beside the GPU's last kernel
