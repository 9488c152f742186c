"""Schedule generators and the validator: complete programs pass, broken ones fail with a reason."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import equal_stages

from parsim.errors import ScheduleError
from parsim.predict import simulate
from parsim.schedules import Action, Op, build
from parsim.validate import validate


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1"])
@pytest.mark.parametrize("p,m", [(1, 1), (2, 1), (1, 5), (3, 4), (4, 8), (8, 3), (5, 17)])
def test_generated_schedules_validate(name, p, m):
    validate(build(name, p, m))


@pytest.mark.parametrize("p,m,v", [(1, 1, 2), (2, 2, 2), (4, 8, 2), (3, 9, 3), (8, 16, 4)])
def test_interleaved_schedules_validate(p, m, v):
    validate(build("interleaved-1f1b", p, m, v))


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
    with pytest.raises(ScheduleError, match="unknown schedule 'zb'; choose one of: 1f1b, dualpipev, gpipe, interleaved-1f1b, "
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
