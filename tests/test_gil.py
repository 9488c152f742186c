"""The GIL as CPython hands it: one thread at a time, sleepers in line, a wake-up cost that grows with how long the
sleeper's core slept; and the launch experiment the calibration's two-thread probes predict."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsim.profile import GilCosts
from parsim.scenarios.interfaces import launch_pace_s
from parsim.sim.gil import Gil, GilLaunch, gil_thread, non_decreasing, wake_cost, wake_points, wake_readings
from parsim.sim.machine import Launch, Machine, Sync


def _threads(n: int, steps: int, held_s: float, released_s: float, wake_s: float = 0.0,
             cores: int | None = None, handoff_share: float = 0.0) -> tuple[float, Gil]:
    m = Machine()
    gil = Gil(m.env, lambda slept_s: wake_s, cores, handoff_share)
    for t in range(n):
        gil_thread(m, f"t{t}", gil).steps += [GilLaunch(None, held_s, released_s)] * steps
    return m.run(), gil


def _costs(wake: tuple[tuple[float, float], ...], launch_s: float = 10.0, released_s: float = 4.0,
           cores: int | None = None) -> GilCosts:
    return GilCosts(launch_s, 0.0, released_s, wake, cores)


# --- the lock ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 3, 8])
@pytest.mark.parametrize("held_s,released_s,wake_s", [(1.0, 0.0, 0.0), (1.0, 0.5, 0.0), (0.2, 1.0, 0.3),
                                                      (1.0, 7.0, 2.0)])
def test_threads_finish_no_sooner_than_their_held_time_added_up(n, held_s, released_s, wake_s):
    steps = 10
    end, gil = _threads(n, steps, held_s, released_s, wake_s)
    assert end >= n * steps * held_s - 1e-9
    assert gil.held_s == pytest.approx(n * steps * held_s)
    assert end >= steps * (held_s + released_s) - 1e-9  # and no sooner than one thread alone


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_a_gil_bound_loop_is_n_times_one_thread(n):
    end, _ = _threads(n, 50, 1.0, 0.0)
    assert end == pytest.approx(n * 50.0)


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_one_thread_keeps_the_gil_through_its_gil_free_parts(n):
    """A launching thread takes the GIL back before the one it woke runs: held 1, released 3, the threads run one
    after another, each handing over at its last launch (whose GIL-free part overlaps the next thread's)."""
    steps = 10
    end, gil = _threads(n, steps, 1.0, 3.0)
    assert end == pytest.approx(n * (steps * 1.0 + (steps - 1) * 3.0) + 3.0)
    assert gil.handoffs == n - 1


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_each_launch_pays_a_wake_up_while_others_sleep(n):
    """Wake-up 0.25 a release while anyone sleeps: the k-th thread to run has n-1-k sleepers behind it."""
    steps, wake = 10, 0.25
    end, gil = _threads(n, steps, 1.0, 0.0, wake)
    assert gil.wakes == (n - 1) * steps
    assert end == pytest.approx((n - 1) * steps * (1.0 + wake) + steps * 1.0)


@pytest.mark.parametrize("n", [2, 3, 8])
def test_threads_whose_releases_are_all_handed_over_take_turns_at_the_same_pace(n):
    """handoff_share 1: each release goes to the sleeper it wakes, so the threads launch in turn, each launch
    paying the wake-up, the last one's none: n steps held plus a wake-up for every launch but the last."""
    steps, wake = 10, 0.25
    m = Machine()
    gil = Gil(m.env, lambda slept_s: wake, None, 1.0)
    threads = [gil_thread(m, f"t{t}", gil) for t in range(n)]
    for t in threads:
        t.steps += [GilLaunch(m.op(f"s{t.name}", f"{t.name}.{i}", 0.0), 1.0, 0.0) for i in range(steps)]
    assert m.run() == pytest.approx(n * steps * 1.0 + (n * steps - 1) * wake)
    order = [op.name.split(".")[0] for _, op in sorted((e, op) for t in threads for op, _, e in t.spans())]
    assert order == [f"t{i % n}" for i in range(n * steps)]
    kept, _ = _threads(n, steps, 1.0, 0.0, wake)  # one keeper: the same pace while the others sleep
    assert kept == pytest.approx((n - 1) * steps * (1.0 + wake) + steps * 1.0)


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_the_handoff_share_keeps_the_pace_of_launches_that_hold_the_gil_throughout(threads):
    """Every launch pays a wake-up while others sleep, kept or handed over: the calibration's probes read the same."""
    gil = _costs(wake_points([10.0, 40.0], [12.0, 47.0]), released_s=0.0)
    paces = {share: [launch_pace_s(dataclasses.replace(gil, handoff_share=share), threads, hold) for hold in (0, 30)]
             for share in (0.0, 0.5, 1.0)}
    assert paces[0.5] == pytest.approx(paces[0.0]) and paces[1.0] == pytest.approx(paces[0.0])


def test_a_handed_over_gil_lets_the_releasers_gil_free_part_overlap_the_next_launch():
    """Held 6, free 4, no wake-up cost: kept, two threads launch at one's pace (10); handed over, at the GIL's (6)."""
    gil = _costs(((0.0, 0.0),), launch_s=10.0, released_s=4.0)
    assert launch_pace_s(gil, 2) == pytest.approx(10.0)
    assert launch_pace_s(dataclasses.replace(gil, handoff_share=1.0), 2) == pytest.approx(6.0)


@pytest.mark.parametrize("share", [0.0, 0.25, 0.5, 1.0])
def test_the_handoff_share_of_releases_goes_to_the_woken_thread(share):
    """Of the releases that wake a sleeper while the releaser comes back (all but the first thread's last, which
    always hands over), share hand the GIL over, spread evenly (a running sum: never one too many)."""
    _, gil = _threads(2, 40, 1.0, 0.5, handoff_share=share)
    assert gil.wakes > 1
    assert share * (gil.wakes - 1) - 1 < gil.handoffs - 1 <= share * (gil.wakes - 1)


@pytest.mark.parametrize("n", [1, 2, 8])
def test_without_a_gil_threads_overlap_completely(n):
    m = Machine()
    for t in range(n):
        host = m.host(f"t{t}")
        host.steps += [Launch(m.op(f"s{t}", f"op{t}.{i}", 0.0), 1.0, 1.0) for i in range(10)]
    assert m.run() == pytest.approx(10.0)


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


def test_a_thread_that_leaves_hands_the_gil_over_after_the_wake_up():
    m = Machine()
    gil = Gil(m.env, lambda slept_s: 0.5)
    a, b = gil_thread(m, "a", gil), gil_thread(m, "b", gil)
    a.steps.append(GilLaunch(None, 2.0, 0.0))  # holds first, then ends
    b.steps.append(GilLaunch(None, 1.0, 0.0))
    assert m.run() == pytest.approx(2.0 + 0.5 + 1.0)
    assert gil.handoffs == 1 and a.finished_at == pytest.approx(2.5)  # a paid the wake-up too


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


# --- the wake-up curve -----------------------------------------------------------------------------------

def test_the_wake_up_is_linear_between_probes_and_flat_beyond():
    cost = wake_cost(((10.0, 1.0), (30.0, 5.0)))
    assert [cost(s) for s in (0.0, 10.0, 20.0, 30.0, 99.0)] == pytest.approx([1.0, 1.0, 3.0, 5.0, 5.0])
    assert wake_cost(())(50.0) == 0.0


def test_wake_points_read_the_extra_time_of_two_threads_at_the_core_sleep_of_one_launch():
    points = wake_points([10.0, 20.0, 40.0], [10.5, 23.0, 48.0])
    assert [p for point in points for p in point] == pytest.approx([10, 0.5, 20, 3.0, 40, 8.0])


@pytest.mark.parametrize("values,fitted", [([1, 3, 2, 4], [1, 2.5, 2.5, 4]), ([5, 1, 1], [7 / 3] * 3),
                                           ([0, 1, 2], [0, 1, 2]), ([], [])])
def test_non_decreasing_pools_the_runs_that_fall(values, fitted):
    assert non_decreasing(values) == pytest.approx(fitted)


@given(st.lists(st.floats(-100, 100), max_size=12))
def test_non_decreasing_never_falls_and_keeps_the_mean(values):
    fitted = non_decreasing(values)
    assert fitted == sorted(fitted) and len(fitted) == len(values)
    assert sum(fitted) == pytest.approx(sum(values), abs=1e-6)


@given(st.lists(st.tuples(st.floats(1.0, 1e3), st.floats(-5.0, 20.0)), min_size=1, max_size=8, unique_by=lambda p: p[0]))
def test_wake_points_never_fall_as_the_core_sleeps_longer_and_never_go_below_zero(probes):
    one = [s for s, _ in probes]
    points = wake_points(one, [s + extra for s, extra in probes])
    assert [s for s, _ in points] == sorted(one)
    costs = [c for _, c in points]
    assert all(c >= 0 for c in costs) and costs == sorted(costs)


# --- the launch experiment -----------------------------------------------------------------------------

CURVE = ((10.0, 0.0), (40.0, 6.0), (100.0, 14.0))


def test_one_thread_alone_pays_no_contention():
    assert launch_pace_s(_costs(((0.0, 50.0), (1.0, 50.0))), 1) == pytest.approx(10.0)


@pytest.mark.parametrize("n", range(2, 9))
def test_many_threads_are_bounded_by_the_cheapest_and_dearest_wake_up(n):
    pace = launch_pace_s(_costs(CURVE), n)
    assert 10.0 <= pace <= 10.0 + 14.0 + 1e-9


def test_more_threads_sleep_longer_so_each_launch_pays_more_until_the_curve_is_flat():
    paces = [launch_pace_s(_costs(CURVE), n) for n in range(1, 9)]
    assert paces == sorted(paces)
    assert paces[-1] == pytest.approx(10.0 + 14.0)  # 7 sleepers: each slept ~150, past the last probe


@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_linear_wake_up_gives_the_closed_form_pace(n):
    """Wake-up a x slept: each of n-1 sleepers is woken once every n-1 launches, and went back to sleep when woken
    the time before, so it slept (n-1) P - c: P = t1 + a ((n-2) P + t1), P = t1 (1 + a) / (1 - a (n-2))."""
    a, t1 = 0.1, 10.0
    pace = launch_pace_s(_costs(((0.0, 0.0), (1e6, a * 1e6)), launch_s=t1), n)
    assert pace == pytest.approx(t1 * (1 + a) / (1 - a * (n - 2)), rel=1e-5)  # the start-up decays geometrically


def test_the_two_thread_probes_are_reproduced_from_the_curve_they_calibrate():
    """The calibration's own probes, fed back through the model: one and two threads holding the GIL longer."""
    holds = (0.0, 10.0, 30.0, 90.0)
    one = [10.0 + h for h in holds]
    two = [10.0, 21.0, 45.0, 114.0]
    gil = _costs(wake_points(one, two))
    for hold, o, t in zip(holds, one, two):
        assert launch_pace_s(gil, 1, hold) == pytest.approx(o)
        assert launch_pace_s(gil, 2, hold) == pytest.approx(t)


@pytest.mark.parametrize("threads", [2, 3, 8])
@pytest.mark.parametrize("holds", [(0.0, 5.0, 20.0), (3.0, 60.0)])
def test_many_threads_holding_longer_read_back_the_curve_that_runs_them(threads, holds):
    """wake_readings is the model's own reading: N threads' pace against one thread's, at any hold, gives back the
    wake-up the curve charges at the idle time it names (so a probe at 8 threads is comparable with the curve)."""
    gil, curve = _costs(CURVE), wake_cost(CURVE)
    one = [launch_pace_s(gil, 1, h) for h in holds]
    many = [launch_pace_s(gil, threads, h) for h in holds]
    readings = wake_readings(threads, one, many)
    assert [cost for _, cost in readings] == pytest.approx([curve(slept) for slept, _ in readings], rel=1e-5, abs=1e-9)
    assert all(slept >= (threads - 1) * o - 1e-9 for (slept, _), o in zip(readings, one))


@pytest.mark.parametrize("n", [2, 4, 8])
def test_threads_sharing_one_core_wake_each_other_at_the_price_of_a_core_that_never_slept(n):
    """On one core the sleeper's core is the running one: every wake-up costs what the curve says for 0 idle."""
    assert launch_pace_s(_costs(((0.0, 1.0), (50.0, 20.0)), cores=1), n) == pytest.approx(11.0)


@settings(deadline=None, max_examples=25)
@given(st.integers(2, 8), st.integers(1, 16), st.floats(0.0, 20.0), st.floats(0.0, 20.0))
def test_more_cores_never_make_the_threads_faster(n, cores, c0, rise):
    """A core that idles longer is dearer to wake: spreading the threads over more cores never speeds them up."""
    wake = ((5.0, c0), (200.0, c0 + rise))
    fewer = launch_pace_s(_costs(wake, cores=cores), n)
    more = launch_pace_s(_costs(wake, cores=cores + 1), n)
    assert more >= fewer - 1e-9


# --- the launch curve: the calibration of contended launches -------------------------------------------------

LAUNCH_CURVE = ((1, 10.0), (2, 11.0), (4, 25.0), (8, 60.0))


@pytest.mark.parametrize("n,pace", [(1, 10.0), (2, 11.0), (3, 18.0), (4, 25.0), (6, 42.5), (8, 60.0), (9, 60.0)])
def test_launches_that_hold_the_gil_keep_the_launch_curves_pace(n, pace):
    """k threads launching one at a time: each launch's held time stretched by c_k / c_1 is the pace, linear between
    the measured counts, flat beyond them; the wake-up curve is not paid on top (the launch curve holds it)."""
    gil = dataclasses.replace(_costs(CURVE, released_s=None), launch_curve=LAUNCH_CURVE)
    assert launch_pace_s(gil, n) == pytest.approx(pace, rel=1e-9)


def test_the_launch_curve_stretches_a_held_step_by_the_threads_launching_when_it_takes_the_gil():
    """Two threads taking turns (every release handed over), c_2 / c_1 = 3: a's first step runs before b has
    started (x1), the next two while both launch (x3), b's last after a has ended (x1)."""
    m = Machine()
    costs = dataclasses.replace(_costs(CURVE, released_s=None), launch_curve=((1, 1.0), (2, 3.0)), handoff_share=1.0)
    gil = Gil.calibrated(m.env, costs)
    kernel = m.op("gpu0", "kernel", 1.0)
    a, b = gil_thread(m, "a", gil), gil_thread(m, "b", gil)
    a.steps += [GilLaunch(None, 1.0, 0.0)] * 2
    b.steps += [GilLaunch(None, 1.0, 0.0), GilLaunch(kernel, 1.0, 0.0), Sync((kernel,))]
    m.run()
    assert [end for _, _, end in a.launch_spans] == pytest.approx([1.0, 7.0])
    assert [end for _, _, end in b.launch_spans] == pytest.approx([4.0, 8.0])
    assert gil.wake_s == 0.0  # the curve holds the wake-ups
