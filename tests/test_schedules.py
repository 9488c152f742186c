"""Schedule generators and the validator: complete programs pass, broken ones fail with a reason."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import equal_stages

from parsim.errors import ScheduleError
from parsim.schedules import Action, Op, build
from parsim.sim.check import validate
from parsim.sim.predict import simulate


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1"])
@pytest.mark.parametrize("p,m", [(1, 1), (2, 1), (1, 5), (3, 4), (4, 8), (8, 3), (5, 17)])
def test_generated_schedules_validate(name, p, m):
    validate(build(name, p, m))


@pytest.mark.parametrize("p,m,v", [(1, 1, 2), (2, 2, 2), (4, 8, 2), (3, 9, 3), (8, 16, 4)])
def test_interleaved_schedules_validate(p, m, v):
    validate(build("interleaved-1f1b", p, m, v))


@pytest.mark.parametrize("p", range(1, 9))
@pytest.mark.parametrize("copy_streams", [False, True])
def test_zbv_validates_for_every_microbatch_count(p, copy_streams):
    for m in range(1, 3 * p + 1):
        validate(build("zbv", p, m), copy_streams)


@pytest.mark.parametrize("p", range(1, 9))
@pytest.mark.parametrize("copy_streams", [False, True])
def test_dualpipev_validates_from_two_microbatches_per_gpu(p, copy_streams):
    for m in range(2 * p, 4 * p + 1):
        validate(build("dualpipev", p, m), copy_streams)


@pytest.mark.parametrize("p,m", [(1, 1), (2, 3), (4, 7), (8, 1)])
def test_dualpipev_needs_at_least_two_microbatches_per_gpu(p, m):
    with pytest.raises(ScheduleError, match=rf"DualPipeV needs at least two micro-batches per GPU \(2p = {2 * p}\), got {m}"):
        build("dualpipev", p, m)


@pytest.mark.parametrize("p", range(1, 7))
@pytest.mark.parametrize("v", [1, 2, 3])
def test_looped_bfs_validates_for_every_microbatch_count(p, v):
    for m in range(1, 3 * p + 1):
        validate(build("looped-bfs", p, m, v))


@pytest.mark.parametrize("name", ["zbv", "dualpipev"])
def test_v_schedules_place_stage_r_and_2p_minus_1_minus_r_on_rank_r(name):
    s = build(name, 4, 8)
    assert s.num_stages == 8 and s.stage_to_rank == (0, 1, 2, 3, 3, 2, 1, 0)
    assert build(name, 4, 8, 2).actions == s.actions  # --virtual-stages 2 says what they do anyway
    with pytest.raises(ScheduleError, match=f"{name} runs two stages per GPU"):
        build(name, 4, 8, 3)


def test_zbv_splits_every_backward_and_hands_over_locally_where_the_v_turns():
    """Rank p-1 hosts stages p-1 and p: the activation and its gradient pass between them with no message."""
    s = build("zbv", 3, 5)
    everything = [a for acts in s.actions for a in acts]
    assert not any(a.op == Op.BACKWARD for a in everything)
    kinds = {(a.op, a.stage) for a in everything if not a.is_compute}
    assert not kinds & {(Op.SEND_F, 2), (Op.RECV_F, 3), (Op.SEND_B, 3), (Op.RECV_B, 2)}
    assert {(Op.SEND_F, 4), (Op.RECV_F, 5), (Op.SEND_B, 5), (Op.RECV_B, 4)} <= kinds  # ranks 1 -> 0 and back


def test_a_receive_moves_ahead_of_another_where_its_channel_sent_it_first():
    """ZB-V's channel rank 0 -> rank 1 carries stage 0's outputs and stage 3's input-grads. Rank 0
    sends F(s0,m2) before the gradient of m0, while rank 1 needs the gradient first (I(s2,m0) comes
    before F(s1,m2)); so rank 1 posts the receive of F(s0,m2) first, as NCCL matches in order."""
    rank0, rank1 = (list(acts) for acts in build("zbv", 2, 4).actions)
    assert rank0.index(Action(Op.SEND_F, 0, 2)) < rank0.index(Action(Op.SEND_B, 3, 0))
    assert rank1.index(Action(Op.BACKWARD_INPUT, 2, 0)) < rank1.index(Action(Op.FORWARD, 1, 2))
    assert rank1.index(Action(Op.RECV_F, 1, 2)) < rank1.index(Action(Op.RECV_B, 2, 0)) \
        < rank1.index(Action(Op.BACKWARD_INPUT, 2, 0))


def test_interleaved_needs_microbatches_a_multiple_of_gpus():
    with pytest.raises(ScheduleError, match="multiple of the GPU count"):
        build("interleaved-1f1b", 4, 6, 2)


def test_virtual_stages_are_refused_by_one_stage_per_gpu_schedules():
    with pytest.raises(ScheduleError, match="one stage per GPU"):
        build("1f1b", 4, 8, 2)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_every_compute_action_runs_once_per_stage_and_microbatch(name):
    s = build(name, 4, 6)
    compute = [a for acts in s.actions for a in acts if a.is_compute]
    assert sorted(compute) == sorted(Action(op, st, i) for op in "FB" for st in range(4) for i in range(6))


def test_unknown_schedule_names_the_choices():
    with pytest.raises(ScheduleError, match="unknown schedule 'zb'; choose one of: 1f1b, dualpipev, gpipe, interleaved-1f1b, interleaved-zb, "
                       "looped-bfs, zb-h1, zbv"):
        build("zb", 4, 8)


@pytest.mark.parametrize("p,m", [(0, 4), (4, 0), (-1, 2)])
def test_sizes_below_one_are_rejected(p, m):
    with pytest.raises(ScheduleError, match="at least one"):
        build("1f1b", p, m)


def _edit(schedule, rank, fn):
    actions = list(schedule.actions)
    actions[rank] = tuple(fn(list(actions[rank])))
    return dataclasses.replace(schedule, actions=tuple(actions))


def test_missing_backward_is_named():
    s = _edit(build("gpipe", 2, 2), 1, lambda acts: [a for a in acts if a != Action(Op.BACKWARD, 1, 1)])
    with pytest.raises(ScheduleError, match="backward of stage 1, micro-batch 1 is missing"):
        validate(s)


def test_duplicate_action_is_named():
    s = _edit(build("gpipe", 2, 2), 0, lambda acts: acts + [Action(Op.FORWARD, 0, 0)])
    with pytest.raises(ScheduleError, match=r"F\(s0,m0\) appears 2 times"):
        validate(s)


def test_action_on_a_rank_that_does_not_host_its_stage_is_rejected():
    s = _edit(build("gpipe", 2, 1), 0, lambda acts: acts + [Action(Op.FORWARD, 1, 0)])
    with pytest.raises(ScheduleError, match="belongs to rank 1"):
        validate(s)


def test_missing_receive_is_named():
    s = _edit(build("1f1b", 2, 2), 1, lambda acts: [a for a in acts if a != Action(Op.RECV_F, 1, 1)])
    with pytest.raises(ScheduleError, match=r"RECV_F\(s1,m1\) is missing on rank 1"):
        validate(s)


def test_messages_received_out_of_order_are_rejected():
    def swap(acts):
        i, j = acts.index(Action(Op.RECV_F, 1, 0)), acts.index(Action(Op.RECV_F, 1, 1))
        acts[i], acts[j] = acts[j], acts[i]
        return acts

    with pytest.raises(ScheduleError, match="message 0 is sent as SEND_F.s0,m0. but rank 1 expects RECV_F.s1,m1."):
        validate(_edit(build("gpipe", 2, 2), 1, swap))


def _backward_before_its_gradient_arrives(schedule):
    """Rank 0 runs every backward before the forwards whose outputs rank 1 needs: a wait cycle."""
    def reorder(acts):
        backward = [a for a in acts if a.op in (Op.BACKWARD, Op.RECV_B)]
        return backward + [a for a in acts if a not in backward]
    return _edit(schedule, 0, reorder)


def test_deadlock_is_found_by_the_validator():
    with pytest.raises(ScheduleError, match="deadlock"):
        validate(_backward_before_its_gradient_arrives(build("gpipe", 2, 2)))


def test_deadlock_is_found_by_the_simulator_with_the_stuck_ops():
    s = _backward_before_its_gradient_arrives(build("gpipe", 2, 2))
    with pytest.raises(ScheduleError, match=r"deadlock: .*stuck at"):
        simulate(s, equal_stages(2, 1.0, 1.0), __import__("conftest").make_profile())


def test_to_text_lists_each_rank_in_order():
    text = build("1f1b", 2, 1).to_text().splitlines()
    assert text == ["rank 0: F(s0,m0) SEND_F(s0,m0) RECV_B(s0,m0) B(s0,m0)",
                    "rank 1: RECV_F(s1,m0) F(s1,m0) B(s1,m0) SEND_B(s1,m0)"]
