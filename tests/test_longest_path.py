"""The longest-path pass against the event-driven machine: the same step, to the bit, on every schedule and runtime."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import make_profile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsim.errors import ScheduleError
from parsim.profile import CollectiveSpec, LinkSpec, RuntimeCosts
from parsim.runtimes import RUNTIMES
from parsim.schedules import VIRTUAL, Action, Schedule
from parsim.sim.check import validate
from parsim.sim.dataflow import Transfer
from parsim.sim.grad_allreduce import gradient_buckets
from parsim.sim.longest_path import settle_step
from parsim.sim.predict import simulate
from parsim.workload import StageCost, Work

CASES = [(runtime, name) for runtime in sorted(RUNTIMES) for name in RUNTIMES[runtime].schedules()]


def _profile(latency_s: float, p2p_s: float, action_s: float, step_s: float, gpus_per_node: int = 64,
             share: float = 0.0):
    """Costs everywhere (links, host, a split backward's extra host time, the gradient adds a stage's first backward
    saves, an all-reduce), torch's and the graphed runtimes' host costs unlike hw's (the graphed ones with a
    gradient add), and nodes big enough that no link is shared."""
    profile = make_profile(latency_s=latency_s, bandwidth_Bps=3e9, action_s=action_s, p2p_s=p2p_s,
                           gpus_per_node=gpus_per_node)
    host = dataclasses.replace(profile.host, step_s=step_s, split_backward_s=action_s * 0.3, begin_s=step_s / 3,
                               grad_add_s=action_s * 0.1)
    torch = RuntimeCosts(action_s * 1.7, p2p_s * 0.6, step_s=step_s * 2)
    graphs = RuntimeCosts(action_s * 0.4, p2p_s, layer_host=0.0, gpu_scale=0.9, gpu_fixed_scale=0.8,
                          accumulate_s=3e-6, accumulate_Bps=2e11, begin_s=step_s / 2)
    step = dataclasses.replace(graphs, action_s=0.0, step_s=step_s * 3 + 1e-5)
    return dataclasses.replace(profile, host=host, collectives={"allreduce": CollectiveSpec(2e-5, 5e10, compute_share=share)},
                               runtimes={"torch": torch, "graphs": graphs, "graphs-step": step})


def _costs(draw_times: list[float], stages: int) -> list[StageCost]:
    """Unequal stages: forward, input-grad and weight-grad times (and host times) drawn per stage."""
    out = []
    for s in range(stages):
        f, i, w, h = (draw_times[(4 * s + k) % len(draw_times)] for k in range(4))
        out.append(StageCost(Work(f, h, 3), Work(i, h / 2, 2), Work(w, h / 3, 1), send_bytes=(s + 1) << 16,
                             stash_bytes=1000, grad_bytes=(s + 1) * 30 << 20,  # several DDP buckets a stage
                             layers=s % 3 + 1))
    return out


def _build(runtime: str, name: str, p: int, m: int) -> Schedule | None:
    try:
        return RUNTIMES[runtime].build(name, p, m, 2 if name in VIRTUAL else None)
    except ScheduleError:
        return None


def _machine_ends(sim, schedule: Schedule) -> dict[tuple[int, Action], float]:
    """(replica, action) -> end of its op on the machine; a message's under its send and its receive."""
    ends = {}
    for op in sim.ops:
        if op.track.startswith("gpu") and isinstance(op.label, tuple):
            replica = int(op.track.split()[0].removeprefix("gpu")) // schedule.num_ranks
            ends[replica, op.label] = op.end_s
        elif isinstance(op.label, Transfer):
            replica = int(op.track.split()[1].split("->")[0]) // schedule.num_ranks
            ends[replica, op.label.send] = ends[replica, op.label.recv] = op.end_s
    return ends


@pytest.mark.parametrize("runtime,name", CASES)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=st.integers(1, 4), m=st.integers(1, 9), dp=st.sampled_from([1, 1, 2, 3]), copy=st.booleans(),
       times=st.lists(st.floats(1e-6, 1e-2), min_size=4, max_size=12), latency=st.sampled_from([0.0, 3e-6]),
       p2p=st.sampled_from([0.0, 4e-6]), action=st.sampled_from([0.0, 2e-5, 4e-4]),
       step=st.sampled_from([0.0, 5e-5]), share=st.sampled_from([0.0, 0.6]))
def test_the_walk_settles_every_op_as_the_machine_does(runtime, name, p, m, dp, copy, times, latency, p2p,
                                                       action, step, share):
    schedule = _build(runtime, name, p, m)
    if schedule is None:
        return
    copy = copy and runtime == "hw"  # copy streams are hw's runner's
    profile = RUNTIMES[runtime].costs(_profile(latency, p2p, action, step, share=share))
    costs = _costs(times, schedule.num_stages)
    validate(schedule, copy, check_deadlock=False)
    settled = settle_step(schedule, costs, profile, copy, dp, gradient_buckets(costs) if dp > 1 else None)
    assert settled is not None, "the walk must apply where no link is shared"
    machine = simulate(schedule, costs, profile, copy, dp, engine="events")
    assert settled.step_time_s == machine.step_time_s  # exactly: the same additions and maxima
    assert settled.busy_s == machine.busy_s
    assert list(settled.finished_s) == [h.finished_at for h in machine.hosts]
    for (replica, (op, stage, mb)), end in _machine_ends(machine, schedule).items():
        assert settled.ends[replica][op][stage][mb] == end, (replica, op, stage, mb)


@pytest.mark.parametrize("name", ["interleaved-1f1b", "looped-bfs", "zbv"])
def test_channels_sharing_a_network_link_go_to_the_machine(name):
    """Two GPUs per node: a wrap-around channel and a neighbour's share a node pair's network link; they take it
    in time order, which the machine's clock decides."""
    slow = LinkSpec(1e-5, 1e8)
    profile = make_profile(latency_s=1e-6, bandwidth_Bps=1e10, gpus_per_node=2, network=slow)
    schedule = _build("hw", name, 4, 8)
    costs = _costs([1e-3, 2e-3, 1.5e-3, 1e-4], schedule.num_stages)
    assert settle_step(schedule, costs, profile) is None
    assert simulate(schedule, costs, profile).step_time_s == simulate(schedule, costs, profile,
                                                                      engine="events").step_time_s
    with pytest.raises(ValueError, match="does not apply"):
        simulate(schedule, costs, profile, engine="longest-path")


def test_a_deadlock_is_named_by_the_machine():
    """A receive that waits for a send issued after the compute that needs its own output: no order settles it."""
    a = Action
    schedule = Schedule("stuck", 2, 1, (0, 1), (
        (a("RECV_B", 0, 0), a("F", 0, 0), a("B", 0, 0), a("SEND_F", 0, 0)),
        (a("RECV_F", 1, 0), a("F", 1, 0), a("B", 1, 0), a("SEND_B", 1, 0))))
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(schedule, _costs([1e-3], 2), make_profile())


def test_messages_received_out_of_order_are_named_as_validate_names_them():
    """The walk checks each channel's order as it goes (validate skips it for the simulator): it stops at the
    first message out of order, and the channel is named."""
    schedule = _build("hw", "gpipe", 2, 2)
    recvs = list(schedule.actions[1])
    i, j = recvs.index(Action("RECV_F", 1, 0)), recvs.index(Action("RECV_F", 1, 1))
    recvs[i], recvs[j] = recvs[j], recvs[i]
    swapped = dataclasses.replace(schedule, actions=(schedule.actions[0], tuple(recvs)))
    with pytest.raises(ScheduleError, match="message 0 is sent as SEND_F.s0,m0. but rank 1 expects RECV_F.s1,m1."):
        simulate(swapped, _costs([1e-3], 2), make_profile())
