"""Schedules read from torch.distributed.pipelining: its action strings, its CSV, its generators."""

from __future__ import annotations

import pytest

from parsim.errors import ScheduleError
from parsim.profile import load_profile
from parsim.schedules import Op, act, build
from parsim.schedules.from_torch import from_rows, load_csv, parse_action
from parsim.sim.check import validate
from parsim.sim.predict import predict
from parsim.workload import mlp_model


def test_action_strings_read_as_torch_writes_them():
    assert parse_action("2SEND_B13") == [act(Op.SEND_B, 2, 13)]
    assert parse_action("(0F3;3B1)OVERLAP_F_B") == [act(Op.FORWARD, 0, 3), act(Op.BACKWARD, 3, 1)]
    assert parse_action("1UNSHARD") == parse_action("1REDUCE_GRAD") == parse_action("None") == []
    for bad in ("F0", "0X1", "0F"):
        with pytest.raises(ScheduleError, match="torch action"):
            parse_action(bad)


def test_compute_only_lists_get_messages_where_parsims_generators_put_them():
    rows = [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]
    assert from_rows("x", rows).actions == build("gpipe", 2, 2).actions[:1] + build("1f1b", 2, 2).actions[1:]


def test_a_stage_split_over_two_ranks_is_refused():
    with pytest.raises(ScheduleError, match="stage 0 computes on ranks 0 and 1"):
        from_rows("x", [["0F0", "0B0"], ["0F1", "0B1"]])


def test_csv_with_messages_loads_as_written(tmp_path):
    path = tmp_path / "mine.csv"
    path.write_text("0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n")
    s = load_csv(path)
    assert s.stage_to_rank == (0, 1) and s.num_microbatches == 1
    assert [str(a) for a in s.actions[1]] == [str(a) for a in build("1f1b", 2, 1).actions[1]]
    validate(s)


torch_visualizer = pytest.importorskip("torch.distributed.pipelining._schedule_visualizer")


@pytest.mark.parametrize("name", ["ZBVZeroBubble", "DualPipeV", "InterleavedZeroBubble", "LoopedBFS",
                                  "Interleaved1F1B", "GPipe"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8)])
def test_torch_schedules_validate_and_simulate(name, p, m):
    s = build(f"torch:{name}", p, m)
    validate(s)  # each op once, messages paired in order, no wait cycle
    pred, _ = predict(s, mlp_model(2 * s.num_stages, 256, 64 * m), load_profile(None))
    assert pred.step_time_s >= pred.single_gpu_step_s / p * (1 - 1e-9)  # never beyond perfect scaling


def test_torch_csv_and_class_name_give_the_same_schedule(tmp_path):
    ops = torch_visualizer.get_schedule_ops("ZBVZeroBubble", 2, 4, with_comms=True)
    path = tmp_path / "zbv.csv"
    path.write_text("\n".join(",".join(str(a) for a in row if a is not None) for row in ops) + "\n")
    assert load_csv(path).actions == build("torch:ZBVZeroBubble", 2, 4).actions


def test_torch_1f1b_visualiser_quirk_gets_a_clear_error():
    with pytest.raises(ScheduleError, match="one micro-batch late"):
        build("torch:1F1B", 4, 8)
