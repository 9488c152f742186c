"""hw's side of the data-parallel interfaces on the CPU: threads launching ops, a tiny Hogwild, the calibration,
and measured figures that pair up with parsim's predicted ones."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from hw.interfaces.hogwild import core_speeds, hogwild_steps, rates, run_processes, speed_counts  # noqa: E402
from hw.interfaces.launch_threads import gil_costs, launch_loop, launch_times, released_s, unfused  # noqa: E402
from parsim.errors import ParsimError  # noqa: E402
from parsim.profile import load_profile  # noqa: E402
from parsim.scenarios import SCENARIOS, compare_figures  # noqa: E402

CPU = torch.device("cpu")


def _hw(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hw", *argv], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("threads,hold_s", [(1, 0.0), (3, 0.0), (2, 20e-6)])
def test_threads_launch_until_the_window_closes_and_count_their_launches(threads, hold_s):
    loop = launch_loop(CPU, threads, 0.02, hold_s)
    assert len(loop["launches"]) == threads and sum(loop["launches"]) > 0 and loop["drain_s"] >= 0
    assert loop["per_launch_s"] >= hold_s  # a hold is GIL time of every launch
    assert loop["clocks_kept_up"] is False  # no GPU to keep busy
    launched = sum(n > 0 for n in loop["launches"])
    assert launched - 1 <= loop["switches"] <= sum(loop["launches"]) - 1  # each thread that launched took over once
    times = launch_times(CPU, tuple(dict.fromkeys((1, threads))), window_s=0.01, rounds=2)
    assert all(len(t["rounds"]) == 2 and t["per_launch_s"] > 0 for t in times.values())


def test_pinned_threads_run_on_their_cpu_and_leave_the_process_where_it_was():
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    seen = []
    real = os.sched_setaffinity

    def record(pid, cpus):
        real(pid, cpus)
        seen.append(os.sched_getaffinity(0))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "sched_setaffinity", record)
        loop = launch_loop(CPU, 2, 0.01, cpus=(cpu, cpu))
    assert seen == [{cpu}, {cpu}] and all(n > 0 for n in loop["launches"])
    assert os.sched_getaffinity(0) == before  # a thread's pin is its own


def test_the_gil_free_part_of_a_launch_is_shorter_than_the_launch():
    costs, _ = gil_costs(CPU, window_s=0.01, rounds=1, holds_s=(0.0,), crowd_holds_s=())
    released = released_s(CPU, launches=200, repeat=3)
    assert released is not None and 0 < released < 10 * costs.launch_s  # TorchScript runs the op without Python


def test_unfused_turns_torchscripts_fuser_off_and_restores_it():
    """released_s times one kernel per iteration only with the fuser off (on a GPU it fused 8 adds into one)."""
    before = torch._C._jit_texpr_fuser_enabled(), torch._C._jit_can_fuse_on_gpu()
    with unfused():
        assert not torch._C._jit_texpr_fuser_enabled() and not torch._C._jit_can_fuse_on_gpu()
    assert (torch._C._jit_texpr_fuser_enabled(), torch._C._jit_can_fuse_on_gpu()) == before


def test_gil_costs_keep_their_raw_rounds_and_a_wake_up_per_hold():
    costs, raw = gil_costs(CPU, window_s=0.01, rounds=2, holds_s=(0.0, 40e-6), crowd_holds_s=(40e-6,))
    assert costs.launch_s > 0 and costs.thread_s > 0 and costs.cores >= 1
    assert costs.released_s is None or 0 <= costs.released_s <= costs.launch_s
    assert costs.replicate_module_s is None  # replicate needs a GPU
    assert costs.module_call_s >= 0 and costs.backward_call_s >= 0 and costs.matmul_launch_s > 0  # any device
    assert len(costs.wake) == 2 and costs.wake[1][0] > 40e-6  # the core slept a whole launch and its hold
    assert {(h["threads"], h["hold_s"]) for h in raw["holds"]} == {(1, 0.0), (2, 0.0), (1, 40e-6), (2, 40e-6),
                                                                   (8, 40e-6)}
    assert all(len(h["rounds"]) == 2 for h in raw["holds"])
    (two,) = [h["rounds"] for h in raw["holds"] if (h["threads"], h["hold_s"]) == (2, 0.0)]
    assert 0 <= costs.handoff_share <= 1
    assert costs.handoff_share == pytest.approx(sum(r["switches"] for r in two) / sum(sum(r["launches"]) for r in two))
    (crowd,) = raw["crowd"]  # eight threads: each sleeper idles seven launches of the others
    assert raw["crowd_threads"] == 8 and crowd["hold_s"] == 40e-6 and crowd["slept_s"] > 6 * 40e-6


def test_step_host_costs_time_each_part_of_a_plain_step_beyond_its_launches():
    from hw.interfaces.step_costs import step_host_costs
    from parsim.profile import GIL_STEP_KEYS

    costs = step_host_costs(CPU, launch_s=0.0, repeat=20)
    assert set(costs) == set(GIL_STEP_KEYS) - {"ddp_forward_s", "ddp_backward_s", "ddp_param_s"}
    for name in ("module_call_s", "backward_call_s", "matmul_launch_s", "zero_grad_s", "linear_forward_s", "loss_s",
                 "linear_backward_s"):
        assert costs[name] > 0, name
    assert costs["zero_grad_param_s"] >= 0 and costs["zero_grad_module_s"] >= 0
    dear = step_host_costs(CPU, launch_s=1.0, repeat=5)  # launches dearer than any probe: never below nothing
    assert dear["module_call_s"] == dear["backward_call_s"] == dear["linear_backward_s"] == 0.0


def test_ddps_own_costs_come_from_its_probes_in_a_process_group_of_one(tmp_path):
    """DDP over one gloo rank runs its hooks and all-reduce as at any size: dearer than the plain module."""
    import torch.distributed as dist

    from hw.interfaces.data_parallel import ddp_costs, ddp_probes, timed_calls

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        times = timed_calls(ddp_probes(CPU, dist.new_group([0])), [CPU], repeat=20)
    finally:
        dist.destroy_process_group()
    costs = ddp_costs({f"call_{name}_1gpus": statistics.median(t) for name, t in times.items()})
    assert set(costs) == {"ddp_forward_s", "ddp_backward_s", "ddp_param_s"}
    assert costs["ddp_backward_s"] > 0 and all(v >= 0 for v in costs.values())
    assert ddp_costs({}) == {}


def test_ddp_costs_are_ddps_time_less_the_modules_per_further_tensor():
    from hw.interfaces.data_parallel import DDP_LAYERS, ddp_costs

    us = {"module_forward": 10, "ddp_forward": 25, "module_backward": 40, "ddp_backward": 140,
          f"module_backward_x{DDP_LAYERS}": 100, f"ddp_backward_x{DDP_LAYERS}": 100 + 100 + 7 * (2 * DDP_LAYERS - 2)}
    costs = ddp_costs({f"call_{k}_1gpus": v * 1e-6 for k, v in us.items()})
    assert costs == pytest.approx({"ddp_forward_s": 15e-6, "ddp_backward_s": 100e-6, "ddp_param_s": 7e-6})


def test_a_tiny_hogwild_moves_the_shared_parameters():
    result = hogwild_steps("1x16x8", processes=2, duration_s=0.2)
    assert result["params_moved"]
    assert len(result["process_rates"]) == 2 and result["step_s"] > 0


def _failing_job(rank: int):
    if rank == 1:
        raise RuntimeError("worker 1 cannot start")
    return lambda: None


def test_a_worker_that_fails_stops_the_run_at_once_with_its_reason():
    with pytest.raises(ParsimError, match="worker 1 cannot start"):
        run_processes(_failing_job, processes=2, duration_s=0.1, timeout_s=60)


def test_rates_count_steps_between_first_and_last():
    assert rates([[1.0, 2.0, 3.0], [0.0, 0.5], [4.0]]) == [1.0, 2.0]


@pytest.mark.parametrize("cores,counts", [(1, (3, 6, 12)), (2, (3, 6, 12)), (8, (3, 6, 12)), (14, (3, 6, 12, 13)),
                                          (16, (3, 6, 12, 15)), (17, (3, 6, 12)), (32, (3, 6, 12, 24, 31))])
def test_core_speed_probes_avoid_the_experiment_counts(cores, counts):
    assert speed_counts(cores) == counts
    assert not set(counts) & {1, 2, 4, 8, 16}


def test_core_speeds_come_from_the_hogwild_step_itself():
    step_s, speed, runs, measured = core_speeds("1x16x8", cores=2, duration_s=0.1, rounds=1)
    assert step_s > 0 and set(speed) == {1, 3, 6, 12} and speed[1] == 1.0 and all(s > 0 for s in speed.values())
    assert set(runs) == {"1", "3", "6", "12"} and all(r["params_moved"] for v in runs.values() for r in v)
    assert measured == {}


def test_core_speeds_run_the_experiment_in_their_rounds_apart_from_the_probe():
    _, _, runs, measured = core_speeds("1x16x8", cores=2, duration_s=0.05, rounds=2, experiment=(1, 2))
    assert set(measured) == {1, 2} and all(len(m["runs"]) == 2 and m["step_s"] > 0 for m in measured.values())
    assert all(a is not b for a in runs["1"] for b in measured[1]["runs"])  # its one process is not the probe's


def test_gil_costs_time_the_experiment_in_their_rounds_apart_from_the_probes():
    _, raw = gil_costs(CPU, window_s=0.01, rounds=2, holds_s=(0.0,), crowd_holds_s=(), experiment=(1, 2, 3))
    assert set(raw["experiment"]) == {1, 2, 3} and all(len(t["rounds"]) == 2 for t in raw["experiment"].values())
    probe = next(h for h in raw["holds"] if (h["threads"], h["hold_s"]) == (1, 0.0))
    assert all(a is not b for a in probe["rounds"] for b in raw["experiment"][1]["rounds"])


def test_a_calibrated_section_replaces_the_profiles_in_the_prediction():
    from hw.measure.scenarios import predicted

    shipped = load_profile()
    slower = {"cpu": dataclasses.replace(shipped.cpu, step_s=2 * shipped.cpu.step_s)}
    plain, calibrated = predicted("hogwild", None), predicted("hogwild", None, slower)
    steps = [k for k in plain if k.endswith("_s")]
    assert steps and all(calibrated[k] == pytest.approx(2 * plain[k]) for k in steps)


def test_scenario_calibrate_keeps_its_costs_and_refuses_scenarios_without_them(tmp_path):
    out = tmp_path / "h.json"
    result = _hw("scenario", "hogwild", "--cpu", "--calibrate", "--out", str(out))
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert doc["calibrated"]["cpu"]["core_speed_probe"] == "step" and doc["raw"]["calibration"]["speed_probe_runs"]
    refused = _hw("scenario", "async", "--calibrate")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "--calibrate" in refused.stderr


def test_calibrate_interfaces_adds_both_sections_to_the_base(tmp_path):
    out = tmp_path / "p.json"
    result = _hw("calibrate", "--interfaces", "--cpu", "--out", str(out))
    assert result.returncode == 0, result.stderr
    profile = load_profile(out)
    assert profile.gil is not None and profile.cpu is not None and profile.cpu.step_model == "1x16x8"
    assert profile.gil.wake and profile.cpu.core_speed_probe == "step"
    assert [n for n, _ in profile.gil.launch_curve] == list(range(1, 9))  # the GIL's calibration (issue 47)
    assert profile.layers == load_profile().layers  # the rest is the base's
    samples = json.loads(out.with_name("p.samples.json").read_text())
    assert samples["meta"]["command"].startswith("python -m hw calibrate --interfaces")
    again = _hw("calibrate", "--interfaces", "--cpu", "--out", str(out))
    assert again.returncode == 2 and "exists" in again.stderr


@pytest.mark.parametrize("name", ["data-parallel", "hogwild"])
def test_measured_figures_pair_up_with_the_predicted_ones(name, tmp_path):
    from parsim.profile import CpuCosts, GilCosts

    out = tmp_path / "r.json"
    result = _hw("scenario", name, "--cpu", "--out", str(out))
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert doc["raw"] and doc["command"].startswith("python -m hw scenario")
    profile = dataclasses.replace(load_profile(),
                                  gil=GilCosts(8e-6, 5e-5, 4e-6, ((8e-6, 1e-6),), 2, 1e-5, "tests"),
                                  cpu=CpuCosts(2, {1: 1.0, 2: 0.9}, 1e10, 2e10, 1e-3, "1x16x8", "tests"))
    rows = compare_figures(SCENARIOS[name](profile), doc["measured"])
    assert {figure for figure, *_ in rows} == set(doc["measured"])  # every measured figure has a prediction
    assert all(measured > 0 for _, _, measured, _ in rows)


# --- nn.DataParallel against DDP (hw.interfaces.data_parallel) -----------------------------------------------------------

def _ddp_grads(rank, world, device):
    """One rank's DDP gradients of the tiny MLP on its ceil(rows / world) rows (hw.run.ranks.spawn's signature)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from hw.interfaces.data_parallel import build

    model, rows, data = build("mlp", device, tiny=True)
    torch.manual_seed(1)
    x = data(rows)  # the same batch on every rank; each takes its share
    share = x.chunk(world)[rank]
    ddp = DistributedDataParallel(model, process_group=dist.group.WORLD)
    ddp(share).float().sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_ddp_over_two_gloo_ranks_averages_the_gradients_of_one_process_on_the_whole_batch():
    from hw.interfaces.data_parallel import build
    from hw.run.ranks import spawn

    per_rank = spawn(_ddp_grads, 2, (), "cpu", timeout_s=60)
    model, rows, data = build("mlp", CPU, tiny=True)
    torch.manual_seed(1)
    model(data(rows)).float().sum().backward()
    for got, other, want in zip(*per_rank, model.parameters()):
        assert torch.equal(got, other)  # every rank holds the same, all-reduced gradients
        assert torch.allclose(got * 2, want.grad, rtol=1e-4, atol=1e-5)  # DDP averages over its 2 ranks


def test_data_parallel_against_ddp_times_every_point_in_turns_on_gloo():
    from hw.interfaces.data_parallel import measure

    run = measure((1, 2, 3), "cpu", steps=2, rounds=2, tiny=True, calls=True)
    want = {f"{kind}_{name}_{n}gpus" for kind in ("dp", "ddp") for name in ("text", "mlp") for n in (1, 2, 3)}
    assert set(run.raw) == want and all(len(v) == 4 for v in run.raw.values())  # 2 steps x 2 rounds
    assert {f"{k}_s" for k in want} == set(run.figures) and all(v > 0 for v in run.figures.values())
    assert run.calls == {}  # DataParallel's calls are GPU calls: not timed on the CPU


@pytest.mark.parametrize("call", ["scatter", "parallel_apply", "gather", "broadcast", "reduce_add", "broadcast_chunk",
                                  "reduce_add_chunk", "backward"])
def test_every_call_hw_times_is_one_the_model_prices(call):
    """hw.interfaces.data_parallel.CALLS and parsim's DataParallel step name the same calls: a call timed dearer than the model
    would otherwise charge makes the step of an MLP stack (many chunks) over two GPUs longer (the probe's backward:
    dearer over two GPUs than over one)."""
    from hw.interfaces.data_parallel import CALLS
    from parsim.scenarios.interfaces import model_replica
    from parsim.sim.dataparallel_step import data_parallel_step_s
    from parsim.workload import mlp_model

    assert call in CALLS and len(CALLS) == 8
    profile = load_profile()
    timed = ((1, 1e-3), (2, 0.1)) if call == "backward" else ((2, 0.01),)
    dear = dataclasses.replace(profile, gil=dataclasses.replace(profile.gil, calls={call: timed}))
    replica = model_replica(mlp_model(2, 2048, 64), profile)
    assert data_parallel_step_s(replica, 2, dear) > data_parallel_step_s(replica, 2, profile) + 0.009


def test_a_coalesced_calls_cost_per_further_chunk_is_its_many_chunk_time_less_its_one_chunk_time_spread():
    from hw.interfaces.data_parallel import CHUNKS, call_costs

    medians = {"call_scatter_2gpus": 1e-4, "call_broadcast_2gpus": 2e-4, f"call_broadcast_x{CHUNKS}_2gpus": 9e-4,
               "call_broadcast_3gpus": 3e-4, f"call_broadcast_x{CHUNKS}_3gpus": 2e-4,  # noise: never below 0
               "call_reduce_add_2gpus": 4e-4}  # no many-chunk time: no per-chunk cost
    calls = call_costs(medians, (1, 2, 3))
    assert calls["scatter"] == ((2, 1e-4),) and calls["reduce_add"] == ((2, 4e-4),)
    assert calls["broadcast"] == ((2, 2e-4), (3, 3e-4))
    assert calls["broadcast_chunk"] == ((2, pytest.approx(7e-4 / (CHUNKS - 1))), (3, 0.0))
    assert "reduce_add_chunk" not in calls and not any(name.endswith(f"_x{CHUNKS}") for name in calls)


def test_timed_calls_take_turns_after_a_warmup_and_keep_each_calls_times():
    from hw.interfaces.data_parallel import WARMUP, timed_calls

    order = []
    got = timed_calls({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, [], 3)
    assert order == ["a", "b"] * (WARMUP + 3)
    assert set(got) == {"a", "b"} and all(len(t) == 3 and min(t) >= 0 for t in got.values())


def test_scenario_gpus_adds_data_parallel_against_ddp_and_only_to_data_parallel(tmp_path):
    out = tmp_path / "r.json"
    result = _hw("scenario", "data-parallel", "--cpu", "--gpus", "2", "--out", str(out))
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert {"dp_mlp_2gpus_s", "ddp_text_2gpus_s"} <= doc["measured"].keys()
    assert doc["raw"]["data_parallel_against_ddp"]["step_s"]["ddp_mlp_2gpus"]
    refused = _hw("scenario", "hogwild", "--cpu", "--gpus", "2")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "--gpus" in refused.stderr
    if not torch.cuda.is_available():  # full size needs the GPUs: refused before anything runs
        refused = _hw("scenario", "data-parallel", "--gpus", "2")
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "--cpu" in refused.stderr


@given(st.lists(st.integers(0, 24 << 20), max_size=30))
@settings(max_examples=60, deadline=None)
def test_reduce_add_coalesced_chunks_as_torchs_own_take_tensors_does(sizes):
    """parsim's chunking of the gradients' reduction is torch's (torch.nn.parallel.comm's _take_tensors, one dtype,
    the 10 MiB buffer reduce_add_coalesced passes it)."""
    from torch._utils import _take_tensors

    from parsim.sim.dataparallel_step import COALESCE_BYTES, coalesced

    tensors = [torch.empty(n, dtype=torch.uint8) for n in sizes]
    theirs = [sum(t.numel() for t in chunk) for chunk in _take_tensors(tensors, COALESCE_BYTES)]
    assert coalesced(tuple(sizes), close_at_limit=False) == theirs
