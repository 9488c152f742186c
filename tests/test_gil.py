"""The GIL as a host resource: threads of one process take turns holding it; what they release overlaps."""

from __future__ import annotations

import pytest

from parsim.sim.gil import Gil, GilLaunch, gil_thread
from parsim.sim.machine import Launch, Machine, Sync


def _threads(n: int, steps: int, held_s: float, released_s: float, handoff_s: float = 0.0) -> tuple[float, Gil]:
    m = Machine()
    gil = Gil(m.env, handoff_s)
    for t in range(n):
        gil_thread(m, f"t{t}", gil).steps += [GilLaunch(None, held_s, released_s)] * steps
    return m.run(), gil


@pytest.mark.parametrize("n", [1, 2, 3, 8])
@pytest.mark.parametrize("held_s,released_s", [(1.0, 0.0), (1.0, 0.5), (0.2, 1.0), (1.0, 7.0)])
def test_threads_finish_no_sooner_than_their_held_time_added_up(n, held_s, released_s):
    steps = 10
    end, gil = _threads(n, steps, held_s, released_s)
    assert end >= n * steps * held_s - 1e-9
    assert gil.held_s == pytest.approx(n * steps * held_s)
    assert end >= steps * (held_s + released_s) - 1e-9  # and no sooner than one thread alone


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_a_gil_bound_loop_is_n_times_one_thread(n):
    end, _ = _threads(n, 50, 1.0, 0.0)
    assert end == pytest.approx(n * 50.0)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_released_parts_overlap_until_the_lock_is_busy(n):
    """Held 1, released r: N threads run at their own pace (1 + r) until N exceeds 1 + r, then at the lock's (N)."""
    steps, r = 40, 3.0
    end, _ = _threads(n, steps, 1.0, r)
    per_step = max(1.0 + r, n * 1.0)
    assert end == pytest.approx(per_step * steps, rel=n / steps + 1e-9)


@pytest.mark.parametrize("n", [1, 2, 8])
def test_without_a_gil_threads_overlap_completely(n):
    m = Machine()
    for t in range(n):
        host = m.host(f"t{t}")
        host.steps += [Launch(m.op(f"s{t}", f"op{t}.{i}", 0.0), 1.0, 1.0) for i in range(10)]
    assert m.run() == pytest.approx(10.0)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_each_handoff_costs_the_new_holder(n):
    steps, handoff = 20, 0.25
    end, gil = _threads(n, steps, 1.0, 0.0, handoff)
    assert gil.handoffs == (0 if n == 1 else n * steps - 1)  # first come, first served: a handoff at every turn
    assert end == pytest.approx(n * steps * 1.0 + gil.handoffs * handoff)


def test_a_thread_waiting_in_a_sync_leaves_the_gil_to_others():
    m = Machine()
    gil = Gil(m.env)
    kernel = m.op("gpu0", "long kernel", 10.0)
    a, b = gil_thread(m, "a", gil), gil_thread(m, "b", gil)
    a.steps += [GilLaunch(kernel, 1.0, 0.0), Sync((kernel,))]
    b.steps += [GilLaunch(None, 1.0, 0.0)] * 5
    assert m.run() == pytest.approx(11.0)
    assert b.finished_at == pytest.approx(6.0)  # b ran while a waited for the GPU
    assert a.synced_at == [pytest.approx(11.0)]


def test_an_op_launched_under_the_gil_starts_once_its_launch_is_done():
    m = Machine()
    gil = Gil(m.env)
    op = m.op("gpu0", "kernel", 2.0)
    other = gil_thread(m, "other", gil)
    other.steps.append(GilLaunch(None, 3.0, 0.0))  # holds the GIL first
    launcher = gil_thread(m, "launcher", gil)
    launcher.steps += [GilLaunch(op, 1.0, 0.5), Sync((op,))]
    assert m.run() == pytest.approx(3.0 + 1.0 + 0.5 + 2.0)
    assert op.start_s == pytest.approx(4.5)
    assert [(o.name, s, e) for o, s, e in launcher.spans()] == [("kernel", 0.0, pytest.approx(4.5))]
