"""What makes plan fast at scale gives the exhaustive step: the sharing rounds on the walk, alike data-parallel
replicas walked once, and the first (unslowed) round as a floor, each against the event-driven machine with every
replica, on random schedules, runtimes, stage costs (splits), node sizes and data-parallel degrees."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import make_profile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsim.errors import ScheduleError
from parsim.profile import CollectiveSpec, LinkSpec, ResidentComm, RuntimeCosts
from parsim.runtimes import RUNTIMES
from parsim.schedules import ALL_OPS, VIRTUAL, Action
from parsim.sim import longest_path
from parsim.sim.check import validate
from parsim.sim.grad_allreduce import gradient_buckets
from parsim.sim.longest_path import replicas_alike, settle_step
from parsim.sim.lower import peak_held_bytes
from parsim.sim.predict import StepAbove, simulate
from parsim.workload import StageCost, Work
from parsim.workload.recompute import MODES

CASES = [(runtime, name) for runtime in sorted(RUNTIMES) for name in RUNTIMES[runtime].schedules()]


@st.composite
def steps(draw):
    """A built schedule, its runtime's profile (small nodes sometimes: shared links, replicas unlike), stage costs
    drawn per stage, a data-parallel degree; None where the schedule refuses the sizes."""
    runtime, name = draw(st.sampled_from(CASES))
    p, m = draw(st.integers(1, 4)), draw(st.integers(1, 8))
    v = draw(st.sampled_from([2, 3])) if name in VIRTUAL else None
    try:
        schedule = RUNTIMES[runtime].build(name, p, m, v)
    except ScheduleError:
        return None
    network = LinkSpec(draw(st.sampled_from([0.0, 2e-5])), draw(st.sampled_from([1e8, 5e9])))
    profile = make_profile(latency_s=draw(st.sampled_from([0.0, 3e-6])), bandwidth_Bps=3e9,
                           action_s=draw(st.sampled_from([0.0, 2e-5])), p2p_s=draw(st.sampled_from([0.0, 4e-6])),
                           gpus_per_node=draw(st.sampled_from([2, 3, 4, 64])), network=network)
    host = dataclasses.replace(profile.host, step_s=draw(st.sampled_from([0.0, 5e-5])), begin_s=1e-5,
                               grad_add_s=draw(st.sampled_from([0.0, 1e-6])))
    rate = draw(st.sampled_from([None, 0.4, 0.8]))
    profile = dataclasses.replace(
        profile, host=host, resident_comm=ResidentComm(rate) if rate else None,
        collectives={"allreduce": CollectiveSpec(2e-5, 5e10, compute_share=draw(st.sampled_from([0.0, 0.5])))},
        runtimes={"torch": RuntimeCosts(3e-5, 6e-6, step_s=1e-4),
                  "graphs": RuntimeCosts(1e-5, 4e-6, layer_host=0.0, gpu_scale=0.9, accumulate_s=3e-6),
                  "graphs-step": RuntimeCosts(0.0, 4e-6, layer_host=0.0, step_s=2e-5)})
    times = draw(st.lists(st.floats(1e-5, 1e-2), min_size=4, max_size=12))
    costs = [StageCost(Work(times[4 * s % len(times)], times[(4 * s + 3) % len(times)] / 10, 2),
                       Work(times[(4 * s + 1) % len(times)], 1e-6, 2), Work(times[(4 * s + 2) % len(times)], 1e-6, 1),
                       send_bytes=(s + 1) << 16, stash_bytes=1000, grad_bytes=(s + 1) * 30 << 20, layers=s % 3 + 1,
                       core_forward=Work(times[(4 * s + 1) % len(times)] / 3, 2e-6, s % 3))  # 0-2 attention cores
             for s in range(schedule.num_stages)]
    dp = draw(st.sampled_from([1, 2, 3]))
    return schedule, RUNTIMES[runtime].costs(profile), costs, dp, draw(st.booleans()) and runtime == "hw"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(step=steps(), recompute=st.sampled_from(MODES), calibrated=st.booleans())
def test_every_shortcut_gives_the_machines_step_with_every_replica(step, recompute, calibrated):
    """The step and each GPU's busy time, to the bit (stronger than the 1e-9 relative asked of a shortcut), with
    recomputation too (its forwards priced by a calibrated host cost, or by their launches)."""
    if step is None:
        return
    schedule, profile, costs, dp, copy = step
    if calibrated:
        profile = dataclasses.replace(profile, host=dataclasses.replace(profile.host, recompute_call_s=7e-4,
                                                                          recompute_s=3e-4))
    fast = simulate(schedule, costs, profile, copy, dp, recompute=recompute)
    slow = simulate(schedule, costs, profile, copy, dp, engine="events", recompute=recompute)
    assert fast.step_time_s == slow.step_time_s
    assert fast.busy_s == slow.busy_s


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(step=steps())
def test_one_walked_replica_stands_for_every_alike_one(step):
    if step is None:
        return
    schedule, profile, costs, dp, copy = step
    buckets = gradient_buckets(costs) if dp > 1 else None
    once = settle_step(schedule, costs, profile, copy, dp, buckets)
    longest_path.ALIKE_REPLICAS_ONCE = False
    try:
        every = settle_step(schedule, costs, profile, copy, dp, buckets)
    finally:
        longest_path.ALIKE_REPLICAS_ONCE = True
    assert (once is None) == (every is None)
    if once is not None and every is not None:
        assert (once.step_time_s, once.busy_s, once.finished_s) == (every.step_time_s, every.busy_s, every.finished_s)
        assert once.ends == every.ends


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(step=steps())
def test_the_first_round_is_a_floor_and_giving_up_on_it_says_so(step):
    """Where the sharing rounds run on the walk, the floor give_up is shown is no more than the settled step; a
    give_up that says yes stops the simulation with that floor."""
    if step is None:
        return
    schedule, profile, costs, dp, copy = step
    floors: list[float] = []
    settled = simulate(schedule, costs, profile, copy, dp, give_up=lambda f: floors.append(f) or False)
    assert all(f <= settled.step_time_s for f in floors)
    if floors:
        try:
            simulate(schedule, costs, profile, copy, dp, give_up=lambda f: True)
        except StepAbove as above:
            assert above.floor_s == floors[0]
        else:
            raise AssertionError("give_up said yes: StepAbove")


@pytest.mark.parametrize("runtime,name", [(r, n) for r in ("hw", "torch") for n in ("interleaved-1f1b", "zbv",
                                                                                   "looped-bfs")])
@pytest.mark.parametrize("dp", [2, 3])
@pytest.mark.parametrize("rate", [None, 0.6])
def test_alike_replicas_on_shared_links_are_run_once_on_the_machine(runtime, name, dp, rate):
    """Two GPUs a node, four ranks: a replica's wrap-around and neighbour channels share a node pair's network link
    (the machine settles them), each replica on nodes of its own; the first run stands for all of them."""
    network = LinkSpec(1e-5, 1e8)
    base = make_profile(latency_s=1e-6, bandwidth_Bps=1e10, action_s=2e-5, p2p_s=4e-6, gpus_per_node=2,
                        network=network)
    base = dataclasses.replace(base, resident_comm=ResidentComm(rate) if rate else None,
                               collectives={"allreduce": CollectiveSpec(2e-5, 5e10, compute_share=0.5)},
                               runtimes={"torch": RuntimeCosts(3e-5, 6e-6, step_s=1e-4)})
    schedule = RUNTIMES[runtime].build(name, 4, 8, 2 if name in VIRTUAL else None)
    profile = RUNTIMES[runtime].costs(base)
    costs = [StageCost(Work(1e-3 * (1 + s % 3), 1e-5, 2), Work(1e-3, 1e-6, 2), Work(5e-4, 1e-6, 1),
                       send_bytes=1 << 20, stash_bytes=1000, grad_bytes=60 << 20, layers=1)
             for s in range(schedule.num_stages)]
    assert replicas_alike(profile, schedule, dp)
    assert settle_step(schedule, costs, profile, False, dp, gradient_buckets(costs)) is None
    fast = simulate(schedule, costs, profile, data_parallel=dp)
    slow = simulate(schedule, costs, profile, data_parallel=dp, engine="events")
    assert (fast.step_time_s, fast.busy_s) == (slow.step_time_s, slow.busy_s)
    assert max(h.finished_at for h in fast.machine.hosts) == fast.step_time_s  # its timeline runs every replica
    assert len(fast.machine.hosts) == 4 * dp


@st.composite
def broken(draw):
    """A step from steps() whose schedule has one action dropped, repeated, moved to another rank or place, or given
    another op, stage or micro-batch (in range or not): valid or not, as it happens."""
    step = draw(steps())
    if step is None:
        return None
    schedule, profile, costs, dp, copy = step
    ranks = [list(acts) for acts in schedule.actions]
    r = draw(st.integers(0, len(ranks) - 1))
    if not ranks[r]:
        return None
    k = draw(st.integers(0, len(ranks[r]) - 1))
    op, stage, mb = a = ranks[r][k]
    how = draw(st.sampled_from(["drop", "repeat", "move", "op", "stage", "microbatch"]))
    if how == "drop":
        del ranks[r][k]
    elif how == "repeat":
        ranks[r].insert(draw(st.integers(0, len(ranks[r]))), a)
    elif how == "move":
        del ranks[r][k]
        to = draw(st.integers(0, len(ranks) - 1))
        ranks[to].insert(draw(st.integers(0, len(ranks[to]))), a)
    elif how == "op":
        ranks[r][k] = Action(draw(st.sampled_from(sorted(ALL_OPS) + ["X"])), stage, mb)
    elif how == "stage":
        ranks[r][k] = Action(op, draw(st.integers(-schedule.num_stages - 1, schedule.num_stages)), mb)
    else:
        ranks[r][k] = Action(op, stage, draw(st.integers(-schedule.num_microbatches - 1, schedule.num_microbatches)))
    return dataclasses.replace(schedule, actions=tuple(map(tuple, ranks))), profile, costs, dp, copy


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(step=broken())
def test_the_walk_vouches_only_for_a_valid_schedule(step):
    """simulate validates only where the walk (settle_step's check) does not vouch for the schedule: where it
    does, the schedule is valid and its step the machine's; where not, simulate names what validate names."""
    if step is None:
        return
    schedule, profile, costs, dp, copy = step
    buckets = gradient_buckets(costs) if dp > 1 else None
    settled = settle_step(schedule, costs, profile, copy, dp, buckets, check=True)
    try:
        validate(schedule, copy, check_deadlock=False, check_order=False)
    except ScheduleError as error:
        assert settled is None
        with pytest.raises(ScheduleError) as raised:
            simulate(schedule, costs, profile, copy, dp)
        assert str(raised.value) == str(error)
        return
    if settled is not None:
        assert settled == settle_step(schedule, costs, profile, copy, dp, buckets)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(step=steps(), recompute=st.sampled_from(MODES))
def test_each_walk_settles_the_same_step_to_the_bit(step, recompute):
    """The walk's variants agree on every end, busy time and host end: the general one (observing), the plain one
    (nothing odd, nothing observed) and, for a schedule valid as built, the one that trusts it; with replicas."""
    if step is None:
        return
    schedule, profile, costs, dp, copy = step
    buckets = gradient_buckets(costs) if dp > 1 else None
    general = settle_step(schedule, costs, profile, copy, dp, buckets, observe=True, recompute=recompute)
    for variant in (schedule, dataclasses.replace(schedule)):  # as built (noted, where its builder notes it); not
        settled = settle_step(variant, costs, profile, copy, dp, buckets, recompute=recompute, check=True)
        assert (settled is None) == (general is None)
        if settled is not None and general is not None:
            assert (settled.step_time_s, settled.busy_s, settled.finished_s, settled.ends) == (
                general.step_time_s, general.busy_s, general.finished_s, general.ends)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_schedules_valid_as_built_are_valid_and_hold_what_they_note(name):
    """A schedule noted valid as built (parsim.schedules.valid_as_built) passes validate, channel order included;
    the peaks it notes are what its programs hold (peak_held_bytes read off every action); walked in blocks, its
    step is the one walked action by action."""
    profile = make_profile(latency_s=3e-6, bandwidth_Bps=3e9, action_s=2e-5, p2p_s=4e-6)
    for p in range(1, 7):
        for m in range(1, 11):
            schedule = RUNTIMES["hw"].build(name, p, m, None)
            assert schedule.__dict__.get("valid_as_built")
            validate(schedule)
            stash = [1000 + 7 * s for s in range(p)]
            assert peak_held_bytes(schedule, stash) == peak_held_bytes(dataclasses.replace(schedule), stash)
            costs = [StageCost(Work(1e-3 * (s + 1), 1e-4, 2), Work(2e-3, 1e-6, 2), Work(1e-3, 1e-6, 1),
                               send_bytes=(s + 1) << 16, stash_bytes=1000, grad_bytes=1 << 20) for s in range(p)]
            built = settle_step(schedule, costs, profile, recompute="never")
            assert built == settle_step(dataclasses.replace(schedule), costs, profile, check=True)
