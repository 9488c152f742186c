"""The machine model's physics: streams, resources, host dispatch and the costs of links."""

from __future__ import annotations

import pytest
from conftest import equal_stages, make_profile

from parsim.errors import ScheduleError
from parsim.profile import LinkSpec
from parsim.schedules import SCHEDULES, build
from parsim.sim.machine import Launch, Machine, Sync
from parsim.sim.predict import simulate


def _run_two_ops(same_stream: bool, shared_resource: bool = False) -> float:
    """A kernel and a copy, each 1 s, issued back to back by one host at no cost."""
    m = Machine()
    res = (m.resource("gpu0 h2d"),) if shared_resource else ()
    kernel = m.op("gpu0 s0", "kernel", 1.0, resources=res)
    copy = m.op("gpu0 s0" if same_stream else "gpu0 s1", "copy", 1.0, resources=res)
    host = m.host("host0")
    host.steps += [Launch(kernel, 0.0, 0.0), Launch(copy, 0.0, 0.0), Sync((kernel, copy))]
    return m.run()


def test_two_independent_streams_overlap():
    assert _run_two_ops(same_stream=False) == pytest.approx(1.0)


def test_one_stream_serialises():
    assert _run_two_ops(same_stream=True) == pytest.approx(2.0)


def test_streams_sharing_an_engine_serialise():
    assert _run_two_ops(same_stream=False, shared_resource=True) == pytest.approx(2.0)


def test_event_dependency_orders_ops_across_streams():
    m = Machine()
    a = m.op("s0", "a", 1.0)
    b = m.op("s1", "b", 1.0)
    b.deps.append(a)  # cudaStreamWaitEvent(s1, event recorded after a)
    host = m.host("h")
    host.steps += [Launch(a, 0.0, 0.0), Launch(b, 0.0, 0.0), Sync((b,))]
    assert m.run() == pytest.approx(2.0)
    assert b.start_s == pytest.approx(1.0)


@pytest.mark.parametrize("n", [1, 10, 100])
def test_async_front_end_costs_t1_plus_n_t2_plus_t3_but_sync_per_op_costs_n_times_the_sum(n):
    """The textbook's experiment: host work t1 per op, GPU work t2, a sync costing t3."""
    t1, t2 = 1e-5, 5e-5

    def run(sync_each: bool) -> float:
        m = Machine()
        host = m.host("h")
        ops = [m.op("s", f"op{i}", t2) for i in range(n)]
        for op in ops:
            host.steps.append(Launch(op, t1, t1))
            if sync_each:
                host.steps.append(Sync((op,)))
        host.steps.append(Sync(tuple(ops)))
        return m.run()

    assert run(sync_each=False) == pytest.approx(t1 + n * t2)  # GPU-bound: the host runs ahead
    assert run(sync_each=True) == pytest.approx(n * (t1 + t2))


def test_host_bound_when_kernels_are_shorter_than_their_launch():
    """Tiny kernels: the step is as long as the host takes to launch them, not the GPU time."""
    m = Machine()
    host = m.host("h")
    ops = [m.op("s", f"k{i}", 1e-6) for i in range(100)]
    host.steps += [Launch(op, 1e-5, 1e-5) for op in ops] + [Sync(tuple(ops))]
    assert m.run() == pytest.approx(100 * 1e-5 + 1e-6)


def test_kernels_start_after_the_first_layer_is_launched_not_the_whole_stage():
    """A 4-layer stage: GPU-bound, so it ends one layer's launch plus its GPU time after the start."""
    m = Machine()
    op = m.op("s", "F", 4.0, tail_s=1.0)
    host = m.host("h")
    host.steps += [Launch(op, host_s=0.4, first_s=0.1), Sync((op,))]
    assert m.run() == pytest.approx(4.1)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 4)])
def test_communication_cost_never_makes_a_step_faster(name, p, m):
    schedule = build(name, p, max(m, 2 * p) if name == "dualpipev" else m)  # DualPipeV needs m >= 2p
    stages = equal_stages(schedule.num_stages, 1e-3, 2e-3)
    times = [simulate(schedule, stages, make_profile(latency_s=lat, bandwidth_Bps=bw)).step_time_s
             for lat, bw in [(0.0, float("inf")), (1e-5, 1e11), (1e-4, 1e11), (1e-4, 1e9), (1e-3, 1e8)]]
    assert times == sorted(times)
    assert times[-1] > times[0]


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_dispatch_cost_never_makes_a_step_faster(name):
    times = []
    schedule = build(name, 4, 8)
    for host_s in (0.0, 1e-5, 1e-4, 1e-3, 1e-2):
        stages = equal_stages(schedule.num_stages, 1e-3, 2e-3, host_s=host_s, chunks=4)
        profile = make_profile(action_s=host_s / 4, p2p_s=host_s / 10)
        times.append(simulate(schedule, stages, profile).step_time_s)
    assert times == sorted(times)
    assert times[-1] > times[0]


def test_network_between_nodes_slows_a_pipeline_that_crosses_them():
    stages = equal_stages(4, 1e-3, 2e-3, send_bytes=64 << 20)
    fast = LinkSpec(1e-5, 4e11)
    one_node = make_profile(1e-5, 4e11, gpus_per_node=4, network=LinkSpec(1e-5, 1e9))
    two_nodes = make_profile(1e-5, 4e11, gpus_per_node=2, network=LinkSpec(1e-5, 1e9))
    assert fast.time_s(64 << 20) < 1e-3
    t1 = simulate(build("1f1b", 4, 8), stages, one_node).step_time_s
    t2 = simulate(build("1f1b", 4, 8), stages, two_nodes).step_time_s
    assert t2 > t1 + 8 * (64 << 20) / 1e9  # every micro-batch crosses the slow link at least once


def test_copy_streams_let_receives_overlap_compute():
    """Receives on the compute stream wait for the kernels issued before them; on a copy stream they don't."""
    stages = equal_stages(4, 1e-3, 2e-3)
    profile = make_profile(latency_s=5e-4, bandwidth_Bps=1e10)
    default = simulate(build("1f1b", 4, 8), stages, profile).step_time_s
    copy = simulate(build("1f1b", 4, 8), stages, profile, copy_streams=True).step_time_s
    assert copy < default


def test_a_deadlocked_program_is_reported_not_hung():
    m = Machine()
    a, b = m.op("s0", "a", 1.0), m.op("s1", "b", 1.0)
    a.deps.append(b)
    b.deps.append(a)
    host = m.host("h")
    host.steps += [Launch(a, 0.0, 0.0), Launch(b, 0.0, 0.0), Sync((a, b))]
    with pytest.raises(ScheduleError, match="deadlock: s0 stuck at a .waiting for b"):
        m.run()


def test_negative_or_nan_durations_are_rejected():
    m = Machine()
    for bad in (-1.0, float("nan")):
        with pytest.raises(ScheduleError, match="duration must be >= 0"):
            m.op("s", "x", bad)
