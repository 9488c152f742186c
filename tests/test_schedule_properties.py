"""Invariants every schedule generator must keep, over random sizes (hypothesis)."""

from __future__ import annotations

from collections import Counter

import pytest
from conftest import equal_stages, make_profile
from hypothesis import given, settings
from hypothesis import strategies as st

from parsim.schedules import SCHEDULES, V_SHAPED, VIRTUAL, Op, build
from parsim.sim.check import validate
from parsim.sim.dataflow import issue_waits
from parsim.sim.lower import peak_stashed_microbatches
from parsim.sim.predict import simulate

sizes = st.tuples(st.integers(1, 9), st.integers(1, 24), st.integers(1, 4))


def make(name: str, p: int, m: int, v: int):
    """The schedule at these sizes, adapted to what it accepts (interleaving: m a multiple of p;
    several stages per GPU: v >= 2; DualPipeV: m >= 2p)."""
    if name == "interleaved-1f1b":
        return build(name, p, p * max(1, m // p), v + 1)
    if name == "interleaved-zb":  # m a multiple of its rounds, m // p
        rounds = max(1, m // p)
        return build(name, p, m - m % rounds, v + 1)
    if name in VIRTUAL:
        return build(name, p, m, v + 1)
    if name == "dualpipev":
        return build(name, p, max(m, 2 * p))
    return build(name, p, m)


def memory_bound(name: str, p: int, m: int, stage: int, v: int) -> int:
    """Micro-batches a stage may hold at once, as each schedule promises."""
    if name in ("gpipe", "looped-bfs"):
        return m
    if name == "interleaved-zb":  # warm-up (v-1 rounds and p-r-1) plus the r weight-grads rank r holds back
        return min(p + (v - 1) * (m // max(1, m // p)), m)
    if name == "1f1b":
        return min(p - stage, m)
    if name == "zb-h1":
        return min(p, m)
    if name in V_SHAPED:  # stage s: 2p-s, so each rank's two stages hold 2p+1 chunk-micro-batches
        return min(2 * p - stage, m)
    rank = stage % p  # interleaved: at most warm-up + 1 chunk-micro-batches on its rank
    return min((p - rank - 1) * 2 + (v - 1) * p + 1, m)


BACKWARD_FORMS = {  # how each schedule runs a (stage, micro-batch)'s backward: whole B, I + W, or either
    "zb-h1": {(0, 1, 1)}, "zbv": {(0, 1, 1)}, "dualpipev": {(1, 0, 0), (0, 1, 1)}, "interleaved-zb": {(0, 1, 1)},
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@given(size=sizes)
@settings(max_examples=40, deadline=None)
def test_each_forward_and_backward_runs_once_per_stage_and_microbatch(name, size):
    s = make(name, *size)
    counts = Counter((a.op, a.stage, a.microbatch) for acts in s.actions for a in acts if a.is_compute)
    forms = BACKWARD_FORMS.get(name, {(1, 0, 0)})
    for st_ in range(s.num_stages):
        for i in range(s.num_microbatches):
            assert counts.pop((Op.FORWARD, st_, i)) == 1
            assert tuple(counts.pop((op, st_, i), 0) for op in (Op.BACKWARD, Op.BACKWARD_INPUT,
                                                                 Op.BACKWARD_WEIGHT)) in forms
    assert not counts  # nothing else


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@given(size=sizes, copy_streams=st.booleans())
@settings(max_examples=40, deadline=None)
def test_local_dependencies_come_first_in_program_order_and_no_deadlock(name, size, copy_streams):
    s = make(name, *size)
    validate(s, copy_streams)  # includes the wait-graph cycle check
    waits = issue_waits(s, copy_streams)
    for acts in s.actions:
        position = {a: k for k, a in enumerate(acts)}
        for a in acts:
            for dep in waits[a]:
                if dep in position:
                    assert position[dep] < position[a], f"{a} runs before {dep}"


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@given(size=sizes, t_f=st.floats(1e-4, 1.0), ratio=st.floats(0.5, 3.0),
       latency=st.floats(0.0, 1e-2), host=st.floats(0.0, 1e-3))
@settings(max_examples=40, deadline=None)
def test_simulation_ends_no_sooner_than_the_closed_form_lower_bound(name, size, t_f, ratio, latency, host):
    s = make(name, *size)
    p, m, v = s.num_ranks, s.num_microbatches, s.num_stages // s.num_ranks
    t_b = ratio * t_f
    profile = make_profile(latency_s=latency, bandwidth_Bps=1e11, action_s=host, p2p_s=host)
    step = simulate(s, equal_stages(p * v, t_f / v, t_b / v), profile).step_time_s
    if name == "zb-h1":  # input- and weight-grad each take t_b / 2
        bound = m * (t_f + t_b) + (p - 1) * t_f
    elif name in V_SHAPED or name == "interleaved-zb":  # rank p-1 waits for p-1 chunk forwards, then has all its work
        bound = m * (t_f + t_b) + (p - 1) * t_f / v
    else:
        bound = (m + (p - 1) / v) * (t_f + t_b)
    assert step >= bound * (1 - 1e-12)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@given(size=sizes)
@settings(max_examples=40, deadline=None)
def test_activation_memory_within_the_schedules_stated_bound(name, size):
    s = make(name, *size)
    p, m, v = s.num_ranks, s.num_microbatches, s.num_stages // s.num_ranks
    peaks = peak_stashed_microbatches(s)
    assert all(1 <= peak <= memory_bound(name, p, m, st_, v) for st_, peak in enumerate(peaks))
