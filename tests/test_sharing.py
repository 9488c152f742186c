"""A receive's kernel waiting beside compute slows it (parsim.sim.sharing): the reading of the probe, which receives
wait, the lost time, the settled step, and what stays as it was."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import make_profile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsim.errors import ScheduleError
from parsim.profile import CollectiveSpec, ResidentComm, load_profile
from parsim.runtimes import EAGER, RUNTIMES, TORCH
from parsim.schedules import VIRTUAL, act
from parsim.sim.predict import lowered_machine, predict, simulate
from parsim.sim.sharing import (
    early_receives,
    early_waits,
    lengthening,
    machine_observed,
    rate_beside,
    settle_sharing,
    stretch,
)
from parsim.workload import mlp_model, stage_costs

SLOW = ResidentComm(0.6, "tests")


@given(rate=st.floats(0.05, 1.0), spin=st.floats(0.1, 3.0))
def test_the_probes_reading_recovers_the_speed_beside_a_kernel_there_throughout_or_gone_midway(rate, spin):
    ratio = stretch(rate, spin)
    assert rate_beside(ratio, spin) == pytest.approx(rate, rel=1e-9)
    assert ratio == pytest.approx(min(1 / rate, spin + 1 - spin * rate))  # done inside the wait, or after it


def test_the_probes_reading_stays_a_speed_when_noise_makes_the_chunk_faster_than_alone():
    assert rate_beside(0.98, 1.5) == 1.0 and rate_beside(2.0, 0.5) == pytest.approx(1e-3)


@pytest.mark.parametrize("name", EAGER.schedules())
def test_hws_runner_posts_its_receives_where_none_waits_beside_compute(name):
    """Just before their consumer, or (DualPipeV's pairs) where they have arrived: its steps stay as they were."""
    schedule = EAGER.build(name, 4, 8, 2 if name in VIRTUAL else None)
    model = mlp_model(16, 1024, 4096)
    costs = stage_costs(model, schedule.num_stages, 8, load_profile())
    steps = [simulate(schedule, costs, dataclasses.replace(load_profile(), resident_comm=r)).step_time_s
             for r in (SLOW, None)]
    assert steps[0] == steps[1]


def test_torchs_single_stage_loops_wait_for_their_receives_and_its_looped_classes_post_some_early():
    assert not early_receives(TORCH.build("gpipe", 4, 8)) and not early_receives(TORCH.build("1f1b", 4, 8))
    early = early_receives(TORCH.build("interleaved-1f1b", 2, 4))
    assert act("RECV_F", 2, 0) in early  # rank 0 posts it after F(s0,m0), runs F(s0,m1) before F(s2,m0)
    assert act("RECV_F", 1, 0) not in early  # rank 1's first action: its forward comes next


def test_a_compute_loses_the_share_of_its_overlap_with_waiting_receives_that_the_rate_says():
    computes = [[(act("F", 0, 0), 0.0, 4.0), (act("F", 0, 1), 4.0, 10.0)]]
    windows = [[(3.0, 5.0), (6.0, 7.0)]]  # 1 s beside the first compute, 2 s beside the second
    assert lengthening(computes, windows, 0.75) == {act("F", 0, 0): pytest.approx(0.25), act("F", 0, 1): pytest.approx(0.5)}


def _sim(name: str, p: int, m: int, resident: ResidentComm | None, runtime=TORCH):
    model = mlp_model(16, 2048, 8192)
    profile = dataclasses.replace(load_profile(), resident_comm=resident)
    return predict(runtime.build(name, p, m), model, profile, runtime=runtime if runtime is TORCH else None)


@pytest.mark.parametrize("name,p,m", [("interleaved-1f1b", 2, 4), ("zbv", 2, 4), ("dualpipev", 2, 4),
                                      ("looped-bfs", 4, 8), ("interleaved-zb", 4, 8)])
def test_the_settled_step_is_one_its_own_slowdowns_imply_and_no_faster_than_without_them(name, p, m):
    schedule = TORCH.build(name, p, m)
    profile = dataclasses.replace(TORCH.costs(load_profile()), resident_comm=SLOW)
    costs = stage_costs(mlp_model(16, 2048, 8192), schedule.num_stages, m, profile)

    def run(slower):
        machine, table = lowered_machine(schedule, costs, profile, False, 1, None, slower)
        early = early_receives(schedule)
        return machine, machine_observed(schedule, machine, table, early, early_waits(schedule, early))

    machine, slower = settle_sharing(run, SLOW.rate)
    implied = lengthening(*run(slower)[1], SLOW.rate)
    assert slower and all(abs(implied.get(a, 0.0) - slower.get(a, 0.0)) <= 1e-8 for a in implied.keys() | slower.keys())
    sim = simulate(schedule, costs, profile)
    apart = simulate(schedule, costs, dataclasses.replace(profile, resident_comm=None))
    assert sim.step_time_s == max(h.finished_at for h in machine.hosts) >= apart.step_time_s
    assert max(h.finished_at for h in sim.run_machine().hosts) == sim.step_time_s  # a timeline replays the same run
    assert simulate(schedule, costs, profile, engine="events").step_time_s == sim.step_time_s  # the walk's rounds


@pytest.mark.parametrize("name", [n for n in TORCH.schedules() if n not in ("gpipe", "1f1b")])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=st.integers(2, 4), m=st.sampled_from([4, 8]), dp=st.sampled_from([1, 2, 3]), share=st.sampled_from([0.0, 0.6]),
       rate=st.sampled_from([0.3, 0.6, 0.9]))
def test_the_sharing_rounds_on_the_walk_settle_the_step_as_the_machines_do(name, p, m, dp, share, rate):
    """The same slowdowns, rounds and step, to the bit, with data-parallel replicas (one walked for all of them)
    and an all-reduce that takes a share of the compute beside it."""
    try:
        schedule = TORCH.build(name, p, m, 2 if name in VIRTUAL else None)
    except ScheduleError:
        return
    base = dataclasses.replace(load_profile(), gpus_per_node=64,  # no link shared
                               collectives={"allreduce": CollectiveSpec(2e-5, 5e10, compute_share=share)})
    profile = dataclasses.replace(TORCH.costs(base), resident_comm=ResidentComm(rate, "tests"))
    costs = stage_costs(mlp_model(8, 1024, 4096 * dp), schedule.num_stages, m, profile, dp)
    walked = simulate(schedule, costs, profile, data_parallel=dp, engine="longest-path")
    events = simulate(schedule, costs, profile, data_parallel=dp, engine="events")
    assert walked.step_time_s == events.step_time_s and walked.busy_s == events.busy_s


def test_waiting_receives_make_torchs_interleaved_1f1b_slower_on_two_gpus_and_nothing_of_hws():
    slow, apart = _sim("interleaved-1f1b", 2, 4, SLOW)[0], _sim("interleaved-1f1b", 2, 4, None)[0]
    assert slow.step_time_s > apart.step_time_s * 1.02  # its receives wait beside compute: lost time
    assert _sim("1f1b", 2, 4, SLOW)[0] == _sim("1f1b", 2, 4, None)[0]
    assert _sim("interleaved-1f1b", 2, 4, SLOW, EAGER)[0] == _sim("interleaved-1f1b", 2, 4, None, EAGER)[0]


def test_a_rate_of_one_is_the_step_without_the_section():
    assert _sim("interleaved-1f1b", 2, 4, ResidentComm(1.0))[0] == _sim("interleaved-1f1b", 2, 4, None)[0]


def test_the_section_survives_a_round_trip_and_is_absent_where_unmeasured(tmp_path):
    from parsim.profile import save_profile

    save_profile(dataclasses.replace(make_profile(bandwidth_Bps=1e11), resident_comm=SLOW), tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json").resident_comm == SLOW
    save_profile(make_profile(bandwidth_Bps=1e11), tmp_path / "q.json")
    assert "resident_comm" not in (tmp_path / "q.json").read_text()


@pytest.mark.parametrize("runtime,name", [(r, n) for r in ("hw", "torch") for n in RUNTIMES[r].schedules()])
@pytest.mark.parametrize("p,m", [(1, 1), (2, 3), (3, 6), (4, 8)])
def test_a_schedule_noted_receives_at_use_has_no_early_receive(runtime, name, p, m):
    """early_receives trusts the note (parsim.schedules.receives_at_use): read off every action, it finds none."""
    try:
        schedule = RUNTIMES[runtime].build(name, p, m, 2 if name in VIRTUAL else None)
    except ScheduleError:
        return
    read = early_receives(dataclasses.replace(schedule))  # a copy, without the note
    assert early_receives(schedule) == read or not schedule.__dict__.get("receives_at_use")
    if schedule.__dict__.get("receives_at_use"):
        assert read == frozenset()
