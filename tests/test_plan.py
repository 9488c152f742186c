"""`parsim plan`: candidates ranked by predicted step time, filtered by memory."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from conftest import make_profile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsim.errors import ScheduleError
from parsim.plan import (
    OPTIMIZER_BYTES_PER_PARAM,
    candidates,
    costed_runtimes,
    evaluate,
    params_per_gpu,
    plan,
    rank_key,
    search,
    shapes,
)
from parsim.profile import CollectiveSpec, LinkSpec, ResidentComm, RuntimeCosts
from parsim.runtimes import RUNTIMES
from parsim.runtimes.torch_pipelining import TORCH
from parsim.schedules import VIRTUAL, build
from parsim.sim.predict import predict
from parsim.workload import mlp_model, peak_bytes

MODEL = mlp_model(layers=8, hidden=64, tokens=256)


def test_plan_ranks_every_runnable_configuration_by_step_time():
    profile = make_profile(latency_s=1e-5, bandwidth_Bps=1e10, action_s=1e-6)
    fits, too_big = plan(MODEL, 4, profile)
    assert not too_big
    times = [c.prediction.step_time_s for c in fits]
    assert times == sorted(times)
    best = fits[0]
    again, _ = predict(build(best.schedule, 4 // best.data_parallel, best.microbatches,
                             best.virtual_stages if best.schedule in VIRTUAL else None), MODEL, profile,
                       data_parallel=best.data_parallel)
    assert again.step_time_s == pytest.approx(best.prediction.step_time_s)


def test_memory_limit_drops_configurations_that_need_more():
    profile = make_profile()
    everything = candidates(MODEL, 4, profile)
    limit = sorted(c.memory_bytes for c in everything)[len(everything) // 2]
    fits, too_big = plan(MODEL, 4, profile, memory_limit_bytes=limit)
    assert fits and too_big
    assert all(c.memory_bytes <= limit for c in fits) and all(c.memory_bytes > limit for c in too_big)


def test_memory_counts_optimizer_state_activations_and_the_outputs_kept_for_the_backward():
    profile = make_profile()
    c = next(c for c in candidates(MODEL, 2, profile, ["gpipe"]) if c.microbatches == 4 and c.data_parallel == 1)
    params = params_per_gpu(MODEL, 2, 2, (0, 1))
    assert sum(params) == 8 * (8 * 64**2 + 7 * 64)
    out = (256 // 4) * 64 * 2  # a micro-batch's output
    work = 5 * out  # the first backward's working memory (an MLP block's: 5 C a token)
    # GPipe: stage 0 keeps its 4 micro-batches' outputs (sent on: hw's runner holds them), the last its loss
    kept = [4 * out + work, work]
    assert c.memory_bytes == max(g.peak_activation_bytes + OPTIMIZER_BYTES_PER_PARAM * n + k
                                 for g, n, k in zip(c.prediction.per_gpu, params, kept))


def test_plan_cli_says_when_nothing_fits():
    result = subprocess.run([sys.executable, "-m", "parsim", "plan", "--gpus", "2", "--layers", "4", "--hidden", "256",
                             "--tokens", "1024", "--memory-limit", "0.000001"], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.startswith("error: no configuration fits in 1e-06 GB per GPU; the smallest")


def test_plan_tries_data_parallel_degrees_when_the_profile_costs_an_allreduce():
    profile = dataclasses.replace(make_profile(), collectives={"allreduce": CollectiveSpec(1e-5, 1e11)})
    degrees = {c.data_parallel for c in candidates(MODEL, 4, profile)}
    assert degrees == {1, 2, 4}
    assert {c.data_parallel for c in candidates(MODEL, 4, make_profile())} == {1}


def test_plan_searches_the_v_shaped_and_breadth_first_schedules_where_their_sizes_allow():
    found = candidates(MODEL, 4, make_profile(), ["zbv", "dualpipev", "looped-bfs"], max_microbatches=16)
    labels = {c.label for c in found}
    assert {"zbv m=1", "zbv m=16", "dualpipev m=8", "dualpipev m=16", "looped-bfs m=4, v=2"} <= labels
    assert "dualpipev m=4" not in labels  # DualPipeV needs m >= 2p
    assert not any(c.label.startswith("looped-bfs") and c.virtual_stages == 4 for c in found)  # 16 stages > 8 layers
    assert {c.prediction.gpus for c in found} == {4}



# --- the pruned, parallel search ---------------------------------------------------------------------------------

@st.composite
def spaces(draw):
    """A small random search space: model, GPUs, a profile with costs everywhere (sometimes an all-reduce,
    sometimes torch's runtime costs; small nodes, so that links are shared), and how many rows to keep."""
    model = mlp_model(draw(st.integers(2, 8)), draw(st.sampled_from([64, 256])), draw(st.sampled_from([64, 96, 256])))
    network = LinkSpec(draw(st.sampled_from([0.0, 2e-5])), draw(st.sampled_from([1e8, 5e9])))
    profile = make_profile(latency_s=draw(st.sampled_from([0.0, 5e-6])), bandwidth_Bps=draw(st.sampled_from([1e9, 1e11])),
                           action_s=draw(st.sampled_from([0.0, 3e-6, 4e-5])), p2p_s=draw(st.sampled_from([0.0, 5e-6])),
                           layer_host_s=draw(st.sampled_from([0.0, 2e-6])), gpus_per_node=draw(st.sampled_from([2, 4, 8])),
                           network=network)
    if draw(st.booleans()):
        bus = draw(st.sampled_from([1e9, 1e11]))
        profile = dataclasses.replace(profile, collectives={"allreduce": CollectiveSpec(1e-5, bus)})
    runtimes = {}
    if draw(st.booleans()):
        runtimes["torch"] = RuntimeCosts(draw(st.sampled_from([0.0, 2e-5])), draw(st.sampled_from([0.0, 8e-6])),
                                         layer_host=draw(st.sampled_from([0.0, 1.0])),
                                         step_s=draw(st.sampled_from([0.0, 3e-5])))
    if draw(st.booleans()):  # the graphed runtimes: cheaper launches and GPU time, a gradient add per action
        graphs = RuntimeCosts(draw(st.sampled_from([0.0, 1e-5])), 0.0, layer_host=0.0, gpu_scale=0.9,
                              gpu_fixed_scale=0.7, accumulate_s=draw(st.sampled_from([0.0, 4e-6])),
                              accumulate_Bps=draw(st.sampled_from([1e9, 1e12])))
        runtimes |= {"graphs": graphs, "graphs-step": dataclasses.replace(graphs, action_s=0.0, step_s=2e-5)}
    if draw(st.booleans()):
        profile = dataclasses.replace(profile, host=dataclasses.replace(profile.host, split_backward_s=3e-6))
    if draw(st.booleans()):  # a stage's first backward of a step adds no gradients in
        profile = dataclasses.replace(profile, host=dataclasses.replace(profile.host, grad_add_s=1e-6))
    profile = dataclasses.replace(profile, runtimes=runtimes)
    if draw(st.booleans()):  # receives waiting beside compute slow it (torch's looped classes): settled in rounds
        profile = dataclasses.replace(profile, resident_comm=ResidentComm(draw(st.sampled_from([0.3, 0.8]))))
    return model, draw(st.sampled_from([1, 2, 3, 4, 4, 6, 8, 8])), profile, draw(st.integers(1, 5))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(space=spaces(), limit_at=st.sampled_from([None, 0.3, 0.7]), partition=st.sampled_from(["equal", "both"]),
       optimizer=st.sampled_from(["adam", "none"]))
def test_pruning_finds_the_exhaustive_top_k_and_every_floor_is_below_its_step(space, limit_at, partition, optimizer):
    """Every configuration simulated: no floor above its own step time, recomputed or not; and the pruned search's
    top K (with a memory limit at a quantile of what they need, which some meet only recomputed, or none) are the
    exhaustive search's, in order, to the bit."""
    model, gpus, profile, top = space
    todo = shapes(model, gpus, profile, costed_runtimes(profile), max_microbatches=16, partition=partition)
    everything = [(s, evaluate(s, model, profile, optimizer=optimizer)) for s in todo]
    memory = sorted(c.memory_bytes for _, c in everything if c is not None)
    limit = memory[int(limit_at * len(memory))] if limit_at is not None and memory else None
    ran = [(s, c) for s in todo if (c := evaluate(s, model, profile, limit, optimizer)) is not None and c.prediction]
    for shape, c in ran:
        assert shape.floor_s <= c.prediction.step_time_s, (c.runtime, c.label)
        assert c.recompute == "never" or c.runtime == "hw"
    exhaustive = sorted(((c.prediction.step_time_s, s.index, c) for s, c in ran),
                        key=lambda x: rank_key(x[0], x[2].memory_bytes, x[1]))[:top]
    found = search(model, gpus, profile, limit, top=top, max_microbatches=16, partition=partition, optimizer=optimizer)
    assert [(c.runtime, c.label, c.prediction.step_time_s) for c in found.fits] == \
        [(c.runtime, c.label, step) for step, _, c in exhaustive]
    assert found.considered == len(todo) == found.pruned + len(found.too_big) + found.cannot_run + found.simulated


@pytest.mark.parametrize("top,limit", [(4, None), (4, 2.2e6), (None, None)])
def test_search_on_several_processes_finds_what_one_finds(top, limit):
    """Every runtime (the graphed ones with a gradient add), a memory limit or none, the top 4 or everything."""
    graphs = RuntimeCosts(2e-7, 0.0, layer_host=0.0, gpu_scale=0.9, accumulate_s=1e-6, accumulate_Bps=1e11)
    profile = dataclasses.replace(make_profile(latency_s=1e-5, bandwidth_Bps=1e10, action_s=1e-6),
                                  collectives={"allreduce": CollectiveSpec(1e-5, 1e10)},
                                  runtimes={"torch": RuntimeCosts(2e-6, 1e-6), "graphs": graphs,
                                            "graphs-step": dataclasses.replace(graphs, step_s=1e-5)})
    one = search(MODEL, 4, profile, limit, top=top, jobs=1, partition="both")
    two = search(MODEL, 4, profile, limit, top=top, jobs=2, partition="both")
    assert [(c.runtime, c.label) for c in two.fits] == [(c.runtime, c.label) for c in one.fits]
    assert [c.prediction for c in two.fits] == [c.prediction for c in one.fits]
    assert two.jobs == 2 and two.considered == one.considered
    if top is None:
        assert {c.runtime for c in one.fits} == {"hw", "torch", "graphs", "graphs-step"}
    if limit is not None:
        assert one.too_big and all(c.memory_bytes > limit for c in one.too_big + two.too_big)
        assert all(c.memory_bytes <= limit for c in one.fits)


def test_plan_searches_every_runtime_the_profile_costs_unless_told_one():
    plain = make_profile(latency_s=1e-5, bandwidth_Bps=1e10, action_s=1e-6)
    costed = dataclasses.replace(plain, runtimes={"torch": RuntimeCosts(2e-6, 0.0)})
    assert [r.name for r in costed_runtimes(plain)] == ["hw"]
    assert [r.name for r in costed_runtimes(costed)] == ["hw", "torch"]
    both = {c.runtime for c in search(MODEL, 4, costed, max_microbatches=16).fits}
    assert both == {"hw", "torch"}
    assert {c.runtime for c in search(MODEL, 4, costed, runtimes=[TORCH], max_microbatches=16).fits} == {"torch"}


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_each_runtime_places_stages_and_splits_backwards_as_it_says_without_building(runtime):
    rt = RUNTIMES[runtime]
    for name in rt.schedules():
        for p, m in ((2, 4), (3, 6), (4, 8)):
            for v in ((2, 3) if name in VIRTUAL else (None,)):
                try:
                    built = rt.build(name, p, m, v)
                except ScheduleError:
                    continue
                assert rt.placement(name, p, v) == built.stage_to_rank, (name, p, v)
                has_w = any(a.op == "W" for acts in built.actions for a in acts)
                assert rt.splits_backward(name) == has_w, name


def test_plan_cli_says_what_it_considered_pruned_and_simulated():
    result = subprocess.run([sys.executable, "-m", "parsim", "plan", "--gpus", "4", "--layers", "8", "--top", "2",
                             "--jobs", "1"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    last = result.stdout.splitlines()[-1]
    numbers = [int(w) for w in last.replace(",", "").split() if w.isdigit()]
    considered, pruned, too_big, refused, simulated = numbers[:5]
    assert last.startswith("considered") and "on 1 process" in last
    assert considered == pruned + too_big + refused + simulated and pruned > 0 and simulated >= 2


def test_ctrl_c_stops_plan_and_its_workers_with_one_line():
    """SIGINT to the process group, as a terminal sends it: exit 130, `interrupted`, no traceback, no process left."""
    import os
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "parsim", "plan", "--gpus", "64", "--layers", "128",
                             "--top", "100000", "--jobs", "2"],  # every configuration simulated: minutes
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    time.sleep(2.5)  # imports done, the workers started and simulating
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["interrupted"]
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # nothing left in its process group: the workers are gone too


def test_equally_fast_configurations_rank_the_one_needing_less_memory_first():
    """On one GPU with the host setting the pace, GPipe and 1F1B issue the same host program at each micro-batch
    count: equally fast, and 1F1B holds one micro-batch's activations where GPipe holds them all."""
    profile = make_profile(action_s=1e-4, layer_host_s=1e-5)
    found = search(MODEL, 1, profile, schedules=["gpipe", "1f1b"], max_microbatches=8, data_parallel=False)
    rank = {(c.schedule, c.microbatches): (k, c) for k, c in enumerate(found.fits)}
    for m in (2, 4, 8):
        (first, one), (second, gp) = rank["1f1b", m], rank["gpipe", m]
        assert one.prediction.step_time_s == pytest.approx(gp.prediction.step_time_s, rel=1e-12)
        assert one.memory_bytes < gp.memory_bytes and first < second


def test_plan_offers_recomputation_where_it_alone_fits_a_configuration():
    """A limit that GPipe's kept activations pass and its recomputed ones meet: plan offers it recomputed, priced as
    `predict --recompute` prices it; told never, it leaves it out; and nothing that fits kept is offered recomputed."""
    profile = make_profile()
    kept = evaluate(next(s for s in shapes(MODEL, 2, profile, [RUNTIMES["hw"]], ["gpipe"], 8)
                         if s.microbatches == 8 and s.data_parallel == 1), MODEL, profile)
    redone = dataclasses.replace(kept, recompute="always")
    limit = (peak_bytes(MODEL, build("gpipe", 2, 8), 1, "adam", "always") + kept.memory_bytes) / 2
    found = search(MODEL, 2, profile, limit, ["gpipe"], runtimes=[RUNTIMES["hw"]], max_microbatches=8)
    offered = {c.label: c for c in found.fits}
    assert "gpipe m=8, recompute except-last" in offered or "gpipe m=8, recompute always" in offered
    c = offered.get("gpipe m=8, recompute except-last") or offered["gpipe m=8, recompute always"]
    again, _ = predict(build("gpipe", 2, 8), MODEL, profile, recompute=c.recompute)
    assert c.prediction.step_time_s == again.step_time_s > kept.prediction.step_time_s
    assert c.memory_bytes <= limit < kept.memory_bytes and redone.label == "gpipe m=8, recompute always"
    plain = search(MODEL, 2, profile, limit, ["gpipe"], runtimes=[RUNTIMES["hw"]], max_microbatches=8, recompute=False)
    assert all(c.recompute == "never" for c in plain.fits) and "gpipe m=8" not in {c.label for c in plain.fits}
    assert all(c.recompute == "never" for c in found.fits if c.memory_bytes <= limit and
               peak_bytes(MODEL, build("gpipe", 2, c.microbatches)) <= limit)
