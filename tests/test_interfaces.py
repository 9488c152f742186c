"""The three data-parallel interfaces: the GIL experiment, nn.DataParallel's step against DDP, Hogwild on CPU cores."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import simpy
from conftest import make_profile

from parsim.errors import ProfileError
from parsim.profile import CollectiveSpec, CpuCosts, GilCosts, HostCosts, KernelCost, from_json, load_profile
from parsim.scenarios.interfaces import (
    HOGWILD_PROCESSES,
    data_parallel,
    hogwild,
    hogwild_model,
    hogwild_step_s,
    launch_figures,
    launch_pace_s,
    step_bytes,
)
from parsim.sim.cpu import SharedRate, core_speed
from parsim.sim.dataparallel_step import Replica, data_parallel_step_s
from parsim.workload import StageCost, Work

GIL = GilCosts(launch_s=8e-6, thread_s=50e-6, released_s=6e-6, wake=((0.0, 0.0),), cores=None,
               replicate_module_s=10e-6, source="tests")
HELD = dataclasses.replace(GIL, released_s=0.0)  # all of a launch under the GIL, no wake-up cost
CPU = CpuCosts(cores=4, core_speed={1: 1.0, 4: 0.8}, core_bandwidth_Bps=1e12, bandwidth_Bps=1e13, step_s=0.01,
               step_model="2x16x8", source="tests")


def _profile(gil: GilCosts | None = GIL, cpu: CpuCosts | None = CPU, **kw):
    p = make_profile(**kw)
    return dataclasses.replace(p, host=HostCosts(0.0, 0.0, launch_s=8e-6, sync_s=4e-6), gil=gil, cpu=cpu,
                               kernels={"matmul": KernelCost(1e-6, 1e13), "elementwise": KernelCost(1e-6, 1e12)},
                               collectives={"allreduce": CollectiveSpec(0.0, 1e15)})


# --- the profile's optional sections ------------------------------------------------------------------

def test_sections_round_trip_through_a_file_and_stay_absent_when_unmeasured(tmp_path):
    from parsim.profile import save_profile

    path = tmp_path / "p.json"
    save_profile(_profile(bandwidth_Bps=1e11), path)
    assert load_profile(path) == _profile(bandwidth_Bps=1e11)
    assert not {"calls", "handoff_share"} & set(json.loads(path.read_text())["gil"])  # 2+ GPUs; since 2026-11-27
    timed = _profile(gil=dataclasses.replace(GIL, calls={"gather": ((2, 1e-4), (4, 2e-4))}, handoff_share=0.87),
                     bandwidth_Bps=1e11)
    save_profile(timed, path)
    assert load_profile(path) == timed
    save_profile(make_profile(bandwidth_Bps=1e11), path)
    doc = json.loads(path.read_text())
    assert "gil" not in doc and "cpu" not in doc
    assert load_profile(path).gil is None


def _without(section: str) -> dict:
    """The shipped profile's document less one of its optional sections."""
    doc = json.loads(json.dumps(load_profile().to_json()))
    doc.pop(section, None)
    return doc


def test_a_launch_curve_survives_saving_and_is_absent_where_not_measured():
    profile = _profile(bandwidth_Bps=1e11)
    curved = dataclasses.replace(profile, gil=dataclasses.replace(profile.gil, launch_curve=((1, 1e-5), (8, 3e-5))))
    assert from_json(json.loads(json.dumps(curved.to_json()))).gil.launch_curve == ((1, 1e-5), (8, 3e-5))
    assert "launch_curve" not in profile.to_json()["gil"]


def test_a_profile_without_them_still_loads():
    doc = _without("gil")
    doc.pop("cpu", None)
    profile = from_json(doc)
    assert profile.gil is None and profile.cpu is None and "mlp" in profile.layers


@pytest.mark.parametrize("edit,message", [
    (lambda d: d["gil"].update(launch_s=0), r"gil.launch_s must be a finite number above 0"),
    (lambda d: d["gil"].update(cores=0.5), r"gil.cores must be a whole number"),
    (lambda d: d["gil"].update(released_s=1.0), r"gil.released_s must be at most launch_s"),
    (lambda d: d["gil"].update(wake=[[1e-6]]), r"gil.wake must be a list of \[slept_s, cost_s\] pairs"),
    (lambda d: d["gil"].update(wake=[[1e-6, -1.0]]), r"gil.wake.cost_s must be 0 or a finite number"),
    (lambda d: d["gil"].update(calls=[]), r"gil.calls must map call names"),
    (lambda d: d["gil"].update(handoff_share=1.5), r"gil.handoff_share must be"),
    (lambda d: d["gil"].update(calls={"scatter": [[2]]}), r"gil.calls.scatter must be a list of \[gpus, seconds\]"),
    (lambda d: d["gil"].update(calls={"scatter": [[0, 1e-4]]}), r"gil.calls.scatter.gpus must be at least 1"),
    (lambda d: d["gil"].update(calls={"scatter": [[2, -1.0]]}), r"gil.calls.scatter.host_s must be"),
    (lambda d: d["gil"].update(calls={"scatter": [[2, 1e-4], [2, 2e-4]]}), r"gives one GPU count twice"),
    (lambda d: d["gil"].update(launch_curve=[[1, 1e-5], [1, 2e-5]]), r"launch_curve gives one thread count twice"),
    (lambda d: d["gil"].update(launch_curve=[[0, 1e-5]]), r"gil.launch_curve.threads must be at least 1"),
    (lambda d: d["cpu"].update(core_speed={"x": 1.0}), r"cpu.core_speed"),
    (lambda d: d["cpu"].update(core_speed={"2": 0.9}), r"no speed for 1 busy core"),
    (lambda d: d.update(cpu=[]), r"cpu is missing or not an object"),
])
def test_malformed_sections_name_the_field(edit, message):
    doc = json.loads(json.dumps(_profile(bandwidth_Bps=1e11).to_json()))
    edit(doc)
    with pytest.raises(ProfileError, match=message):
        from_json(doc)


@pytest.mark.parametrize("name,section,profile", [
    ("data-parallel", "gil section", "gil"), ("hogwild", "cpu section", "cpu"),  # the shipped profile less it
    ("data-parallel", "gil.wake", "data/interfaces/h200x2-2026-11-23-2/profile.json"),  # calibrated before wake-ups
])
def test_a_scenario_without_its_costs_names_the_calibration_in_one_line(name, section, profile, tmp_path):
    root = Path(__file__).parent.parent
    if profile in ("gil", "cpu"):
        (tmp_path / "p.json").write_text(json.dumps(_without(profile)))
        path = tmp_path / "p.json"
    else:
        path = root / profile
    argv = [sys.executable, "-m", "parsim", "scenario", name, "--profile", str(path)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"no {section}" in lines[0] and "hw calibrate --interfaces" in lines[0]


def test_a_gil_section_from_before_the_wake_up_probes_still_loads():
    root = Path(__file__).parent.parent
    profile = load_profile(root / "data/interfaces/h200x2-2026-11-23-2/profile.json")
    assert profile.gil.launch_s > 0 and profile.gil.wake == () and profile.cpu.core_speed_probe == "matmul"


# --- the GIL experiment ---------------------------------------------------------------------------------

def test_launch_figures_pair_a_time_and_a_speedup_for_every_thread_count():
    figures = launch_figures(dataclasses.replace(GIL, wake=((8e-6, 0.0), (100e-6, 10e-6))), threads=(1, 2, 8))
    assert figures["launch_threads1_s"] == pytest.approx(8e-6) and figures["launch_threads1_speedup_ratio"] == 1.0
    for n in (2, 8):
        assert figures[f"launch_threads{n}_speedup_ratio"] == pytest.approx(8e-6 / figures[f"launch_threads{n}_s"])
    assert figures["launch_threads8_s"] > figures["launch_threads2_s"]


def test_a_dearer_wake_up_never_makes_threads_faster():
    times = [launch_pace_s(dataclasses.replace(GIL, wake=((0.0, c * 1e-6),)), 4) for c in (0, 1, 2, 4, 8)]
    assert times == sorted(times) and times[-1] > times[0]


# --- nn.DataParallel against DDP ------------------------------------------------------------------------

def _replica(layers: int = 4, gpu_s: float = 0.0, host_s: float = 10e-6, params: int = 1000) -> Replica:
    layer = StageCost(Work(gpu_s, host_s, 1), Work(gpu_s, host_s, 1), Work(gpu_s, host_s, 1), 1000, 1000, params)
    return Replica((layer,) * layers, 1000, modules=5)


SYNC_S = 4e-6  # _profile's host.sync_s: the step ends with a sync of every GPU it used


def test_one_gpu_is_the_plain_step_with_no_replicas_or_threads():
    """Host-bound and GPU-free: forward, loss and backward call under the GIL, then backward in one device thread,
    then the sync."""
    p = _profile(gil=HELD)
    step = data_parallel_step_s(_replica(layers=4, host_s=10e-6), 1, p)
    assert step == pytest.approx(4 * 10e-6 + 2 * 8e-6 + 4 * 20e-6 + SYNC_S)


@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_forward_threads_take_turns_under_the_gil_and_replicate_grows_with_gpus(gpus):
    """All of a launch holds the GIL: the replicas' forwards add up; backward's C++ overlaps across GPUs."""
    p = _profile(gil=HELD)
    replica = _replica(layers=4, host_s=10e-6)
    step = data_parallel_step_s(replica, gpus, p)
    # main: scatter (gpus-1) + broadcast launches, replicate, thread starts; threads: forwards in turn;
    # main: gathers (gpus-1), loss, backward call; GPU 0's thread: grad scatters (gpus-1); backward C++ in parallel;
    # GPU 0's thread: the reduce's launch
    serial = ((gpus - 1) + 1) * 8e-6 + 5 * gpus * 10e-6 + gpus * 50e-6 + gpus * 4 * 10e-6 \
        + (gpus - 1) * 8e-6 + 2 * 8e-6 + (gpus - 1) * 8e-6 + 4 * 20e-6 + 8e-6 + gpus * SYNC_S
    assert step == pytest.approx(serial)


def test_forward_threads_that_hand_the_gil_over_start_every_gpu_after_one_launch_not_a_whole_forward():
    """GPU-bound forwards (1 ms a layer, 10 us a launch) on 2 GPUs: keeping the GIL, thread 0 launches its 4 layers
    before thread 1 launches its first; handing it over at every release (as measured on the H200 machines), the
    threads take turns and GPU 1 starts 3 launches sooner, which the step keeps."""
    replica = _replica(layers=4, gpu_s=1e-3, host_s=10e-6)
    kept, handed = (data_parallel_step_s(replica, 2, _profile(gil=dataclasses.replace(HELD, handoff_share=share)))
                    for share in (0.0, 1.0))
    assert kept - handed == pytest.approx(3 * 10e-6)


CALLS = {"scatter": ((2, 100e-6), (3, 130e-6)), "gather": ((2, 90e-6), (3, 100e-6)),
         "parallel_apply": ((2, 300e-6), (3, 420e-6)), "reduce_add": ((2, 200e-6), (3, 260e-6))}


@pytest.mark.parametrize("gpus", [2, 3, 4])
def test_data_parallels_calls_cost_what_hw_timed_them_at_that_gpu_count(gpus):
    """With its calls timed (2 and 3 GPUs here; 4 extrapolated along them), scatter, parallel_apply, gather and
    Gather's and Broadcast's backward cost the host those times instead of a launch per copy and a thread's start."""
    p = _profile(gil=dataclasses.replace(HELD, calls=CALLS))
    at = {name: points[0][1] + (points[1][1] - points[0][1]) * (gpus - 2) for name, points in CALLS.items()}
    step = data_parallel_step_s(_replica(layers=4, host_s=10e-6), gpus, p)
    serial = at["scatter"] + 8e-6 + 5 * gpus * 10e-6 + at["parallel_apply"] + gpus * 4 * 10e-6 + at["gather"] \
        + 2 * 8e-6 + at["scatter"] + 4 * 20e-6 + at["reduce_add"] + gpus * SYNC_S
    assert step == pytest.approx(serial)


def test_torch_cuts_an_mlp_stacks_parameters_into_the_chunks_measured():
    """16 blocks of h=2048 in bf16: reduce_add_coalesced made 65 NCCL calls a step on 4 H100
    (data/interfaces/h100x4-2026-11-27-dp-blocking); broadcast_coalesced's rule closes a chunk at the buffer."""
    from parsim.scenarios.interfaces import mlp_tensors
    from parsim.sim.dataparallel_step import COALESCE_BYTES, coalesced

    tensors = mlp_tensors(2048, 2) * 16
    assert len(coalesced(tensors, close_at_limit=False)) == 65 and len(coalesced(tensors, close_at_limit=True)) == 33
    for rule in (False, True):
        assert sum(coalesced(tensors, rule)) == sum(tensors)
    assert coalesced((COALESCE_BYTES, 1, COALESCE_BYTES), close_at_limit=True) == [COALESCE_BYTES, COALESCE_BYTES + 1]
    assert coalesced((COALESCE_BYTES, 1, COALESCE_BYTES), close_at_limit=False) == [COALESCE_BYTES, 1, COALESCE_BYTES]


@pytest.mark.parametrize("gpus", [2, 3])
def test_a_coalesced_call_costs_the_host_its_first_chunk_and_each_further_one(gpus):
    """Three parameter tensors of 11 MiB: three chunks each way, the broadcast's and the reduction's two further
    chunks at their timed per-chunk cost, on the host's critical path when the GPUs are idle."""
    chunked = {"broadcast": ((2, 100e-6),), "broadcast_chunk": ((2, 30e-6),), "reduce_add": ((2, 200e-6),),
               "reduce_add_chunk": ((2, 50e-6),)}
    p = _profile(gil=dataclasses.replace(HELD, calls=chunked))
    one = _replica(layers=2, host_s=10e-6)
    three = dataclasses.replace(one, tensors=(11 << 20,) * 3)
    extra = data_parallel_step_s(three, gpus, p) - data_parallel_step_s(one, gpus, p)
    assert extra == pytest.approx(2 * 30e-6 + 2 * 50e-6, abs=1e-7)  # the wire: 35 ns at 1 PB/s


def test_a_reduction_slower_to_issue_than_to_run_ends_with_its_last_chunks_issue():
    """Host-bound chunks: each further chunk's host time adds to the step; fast to issue, the wire sets the pace."""
    def step(chunk_s: float, busbw_Bps: float) -> float:
        calls = {"reduce_add": ((2, 0.0),), "reduce_add_chunk": ((2, chunk_s),), "broadcast": ((2, 0.0),),
                 "broadcast_chunk": ((2, 0.0),)}
        p = dataclasses.replace(_profile(gil=dataclasses.replace(HELD, calls=calls)),
                                collectives={"allreduce": CollectiveSpec(0.0, busbw_Bps)})
        return data_parallel_step_s(dataclasses.replace(_replica(), tensors=(11 << 20,) * 5), 2, p)

    assert step(1e-3, 1e15) - step(0.0, 1e15) == pytest.approx(4e-3, abs=1e-7)  # the wire: 58 ns at 1 PB/s
    assert step(1e-6, 1e9) - step(0.0, 1e9) == pytest.approx(0.0, abs=1e-9)  # issued while the first runs
    wire = 5 * (11 << 20) / 1e9  # 5 chunks at 1 GB/s
    assert step(0.0, 1e9) - step(0.0, 1e15) >= 2 * wire * 0.99  # broadcast and reduction both on the wire


@pytest.mark.parametrize("timed,stretch", [(((1, 1e-3), (2, 2e-3)), 2.0), (((1, 1e-3), (2, 0.5e-3)), 1.0), ((), 1.0)])
def test_autograds_device_threads_take_as_much_longer_together_as_the_probes_backward_did(timed, stretch):
    """Timed over two GPUs twice as long as over one, each device thread's backward host work doubles (4 layers of
    20 us, on the critical path with the GPUs idle); faster together is read as no slower; untimed, as alone."""
    base = data_parallel_step_s(_replica(layers=4, host_s=10e-6), 2, _profile(gil=HELD))
    p = _profile(gil=dataclasses.replace(HELD, calls={"backward": timed} if timed else {}))
    assert data_parallel_step_s(_replica(layers=4, host_s=10e-6), 2, p) - base == pytest.approx((stretch - 1) * 80e-6)


def test_a_call_timed_at_one_gpu_count_costs_the_same_at_every_count():
    p = _profile(gil=dataclasses.replace(HELD, calls={"gather": ((2, 90e-6),)}))
    without = _profile(gil=HELD)
    for gpus in (2, 5):
        extra = data_parallel_step_s(_replica(), gpus, p) - data_parallel_step_s(_replica(), gpus, without)
        assert extra == pytest.approx(90e-6 - (gpus - 1) * 8e-6)


def test_data_parallel_says_whether_its_calls_were_timed():
    timed = data_parallel(_profile(gil=dataclasses.replace(GIL, calls=CALLS))).assumptions
    assert any("calls" in a and "timed" in a and "2-3 GPUs" in a for a in timed)
    assert any("calls" in a and "not timed" in a for a in data_parallel(_profile()).assumptions)


def test_the_forward_threads_pay_their_wake_ups_but_gain_nothing_from_gil_free_parts_while_others_sleep():
    """One forward thread keeps the GIL while the others sleep: what a launch runs without the GIL does not let
    another thread's launch in, and every release while others sleep pays a wake-up (at most one per GIL launch:
    4 x 4 layer forwards, 3 scatters, a broadcast, 3 gathers, the loss, the backward call, 3 gradient scatters
    and the reduce)."""
    held = data_parallel_step_s(_replica(), 4, _profile(gil=HELD))
    released = data_parallel_step_s(_replica(), 4, _profile(gil=dataclasses.replace(HELD, released_s=6e-6)))
    assert released == pytest.approx(held)
    woken = data_parallel_step_s(_replica(), 4, _profile(gil=dataclasses.replace(HELD, wake=((0.0, 1e-6),))))
    assert held < woken <= held + (16 + 13) * 1e-6 + 1e-12


def test_ddp_beats_data_parallel_and_the_text_model_never_gains_from_data_parallel():
    figures = data_parallel(_profile(bandwidth_Bps=300e9, latency_s=5e-6)).figures
    for g in range(2, 9):
        assert figures[f"ddp_mlp_{g}gpus_s"] < figures[f"dp_mlp_{g}gpus_s"]
        assert figures[f"dp_text_{g}gpus_speedup_ratio"] < 1.0
    assert figures["dp_mlp_1gpus_s"] == pytest.approx(figures["ddp_mlp_1gpus_s"], rel=0.01)
    assert figures["ddp_mlp_8gpus_speedup_ratio"] > 5


@pytest.mark.parametrize("model", ["text", "mlp"])
def test_on_one_gpu_data_parallel_and_ddp_price_the_same_plain_step_without_hws_runner(model):
    """Measured, the two differ by DataParallel's scatter alone; hw's runner's per-step cost (host.step_s, a fitted
    intercept: 0 to 0.37 ms on five calibrations of one machine kind) is no part of a plain step."""
    p = _profile(gil=dataclasses.replace(GIL, backward_call_s=150e-6), bandwidth_Bps=300e9, latency_s=5e-6)
    runner = dataclasses.replace(p, host=dataclasses.replace(p.host, step_s=300e-6))
    figures = data_parallel(p).figures
    assert figures[f"dp_{model}_1gpus_s"] == pytest.approx(figures[f"ddp_{model}_1gpus_s"], rel=0.05)
    assert data_parallel(runner).figures == pytest.approx(figures)


def test_the_text_models_step_pays_one_module_call_and_one_backward_call_on_either_interface():
    base = _profile(gil=HELD, bandwidth_Bps=300e9, latency_s=5e-6)
    calls = _profile(gil=dataclasses.replace(HELD, module_call_s=40e-6, backward_call_s=150e-6), bandwidth_Bps=300e9,
                     latency_s=5e-6)
    before, after = data_parallel(base).figures, data_parallel(calls).figures
    for kind in ("dp", "ddp"):
        assert after[f"{kind}_text_1gpus_s"] - before[f"{kind}_text_1gpus_s"] == pytest.approx(190e-6)
    # DataParallel over 4 GPUs: four forward threads each call the module, under one GIL; one backward call
    assert after["dp_text_4gpus_s"] - before["dp_text_4gpus_s"] == pytest.approx(4 * 40e-6 + 150e-6)
    assert any("150.0 us" in a for a in data_parallel(calls).assumptions)
    assert any("not measured" in a and "module call" in a for a in data_parallel(base).assumptions)


def test_the_text_models_two_matmuls_cost_a_matmuls_launch_where_it_was_timed():
    """Forward's addmm and the weight gradient's mm: each costs matmul_launch_s instead of an elementwise launch."""
    base = _profile(gil=HELD, bandwidth_Bps=300e9, latency_s=5e-6)
    timed = _profile(gil=dataclasses.replace(HELD, matmul_launch_s=50e-6), bandwidth_Bps=300e9, latency_s=5e-6)
    before, after = data_parallel(base).figures, data_parallel(timed).figures
    for kind in ("dp", "ddp"):
        assert after[f"{kind}_text_1gpus_s"] - before[f"{kind}_text_1gpus_s"] == pytest.approx(2 * (50e-6 - 8e-6))


def test_zero_grad_costs_its_timed_fixed_part_and_each_further_module_and_tensor():
    """DataParallel's zero_grad runs over its wrapper and the model (5 modules, 3 tensors here); untimed, nothing."""
    timed = dataclasses.replace(HELD, zero_grad_s=20e-6, zero_grad_module_s=2e-6, zero_grad_param_s=3e-6)
    replica = dataclasses.replace(_replica(), tensors=(100, 100, 100))
    extra = data_parallel_step_s(replica, 1, _profile(gil=timed)) - data_parallel_step_s(replica, 1, _profile(gil=HELD))
    assert extra == pytest.approx(20e-6 + 5 * 2e-6 + 2 * 3e-6)


@pytest.mark.parametrize("gpus", [1, 3])
def test_the_step_ends_with_the_timed_final_sync_and_an_idle_sync_of_each_further_gpu(gpus):
    timed = dataclasses.replace(HELD, step_sync_s=30e-6)
    extra = data_parallel_step_s(_replica(), gpus, _profile(gil=timed)) - data_parallel_step_s(_replica(), gpus,
                                                                                                _profile(gil=HELD))
    assert extra == pytest.approx(30e-6 - SYNC_S)


def test_a_timed_linear_prices_the_text_models_forward_backward_and_loss_on_either_interface():
    """The Linear's forward and its backward nodes replace the module call and matmul launches; the loss its launch."""
    base = _profile(gil=HELD, bandwidth_Bps=300e9, latency_s=5e-6)
    linear = dataclasses.replace(HELD, linear_forward_s=70e-6, linear_backward_s=90e-6, loss_s=30e-6)
    before, after = data_parallel(base).figures, data_parallel(_profile(gil=linear, bandwidth_Bps=300e9,
                                                                         latency_s=5e-6)).figures
    for kind in ("dp", "ddp"):  # forward 70 for 8, backward 90 for 2 x 8, the loss 30 for 8
        assert after[f"{kind}_text_1gpus_s"] - before[f"{kind}_text_1gpus_s"] == pytest.approx(62e-6 + 74e-6 + 22e-6)
    # DataParallel over 4 GPUs: four forward threads under one GIL, four device threads' backward in parallel
    assert after["dp_text_4gpus_s"] - before["dp_text_4gpus_s"] == pytest.approx(4 * 62e-6 + 74e-6 + 22e-6)


def test_ddps_own_costs_are_paid_over_two_gpus_and_more_by_parameter_tensor_not_on_one():
    base = _profile(gil=HELD, bandwidth_Bps=300e9, latency_s=5e-6)
    ddp = _profile(gil=dataclasses.replace(HELD, ddp_forward_s=100e-6, ddp_backward_s=200e-6, ddp_param_s=10e-6),
                   bandwidth_Bps=300e9, latency_s=5e-6)
    before, after = data_parallel(base).figures, data_parallel(ddp).figures
    assert after["ddp_text_1gpus_s"] == pytest.approx(before["ddp_text_1gpus_s"])  # the module alone
    for g in (2, 4):  # the text's Linear: two parameter tensors
        assert after[f"ddp_text_{g}gpus_s"] - before[f"ddp_text_{g}gpus_s"] == pytest.approx(310e-6)
        assert after[f"dp_text_{g}gpus_s"] == pytest.approx(before[f"dp_text_{g}gpus_s"])


def test_data_parallel_over_one_gpu_pays_its_scatter_only_where_timed_on_one():
    one = dataclasses.replace(HELD, calls={"scatter": ((1, 70e-6), (2, 100e-6))})
    two = dataclasses.replace(HELD, calls={"scatter": ((2, 100e-6), (3, 130e-6))})  # not read down to one GPU
    plain = data_parallel_step_s(_replica(), 1, _profile(gil=HELD))
    assert data_parallel_step_s(_replica(), 1, _profile(gil=one)) - plain == pytest.approx(70e-6)
    assert data_parallel_step_s(_replica(), 1, _profile(gil=two)) == pytest.approx(plain)


def test_data_parallel_says_its_speedups_from_three_gpus_are_upper_bounds():
    assert any("upper bounds" in a and "three threads" in a for a in data_parallel(_profile()).assumptions)


def test_a_cpu_calibration_predicts_the_launch_experiment_and_says_why_not_the_rest():
    result = data_parallel(_profile(gil=dataclasses.replace(GIL, replicate_module_s=None)))
    assert "launch_threads8_speedup_ratio" in result.figures and not any(k.startswith("dp_") for k in result.figures)
    assert any("replicate_module_s" in a for a in result.assumptions)


# --- Hogwild ---------------------------------------------------------------------------------------------

def test_processor_sharing_ends_jobs_as_their_share_allows():
    env = simpy.Environment()
    shared = SharedRate(env, lambda n: 1.0 / n)  # one unit per second in all
    ends = {}

    def job(name, units, start):
        yield env.timeout(start)
        yield shared.serve(units)
        ends[name] = env.now

    env.process(job("a", 1.0, 0.0))
    env.process(job("b", 3.0, 0.0))
    env.process(job("c", 1.0, 1.0))
    env.run()
    # 0-1: a and b at 1/2 (a has 0.5 left); 1-2.5: a, b, c at 1/3: a ends at 2.5, c has 0.5 left, b 2.0; then 1/2 each
    assert ends == {"a": pytest.approx(2.5), "c": pytest.approx(3.5), "b": pytest.approx(5.0)}


def test_core_speed_is_linear_between_measured_counts():
    assert [core_speed(CPU, n) for n in (1, 2, 4, 9)] == pytest.approx([1.0, 1 - 0.2 / 3, 0.8, 0.8])


def test_processes_beyond_the_cores_run_at_the_speed_measured_for_that_many():
    """Time-sharing 4 cores: 8 processes at 0.6 of a core's speed alone (measured), 16 beyond the last probe."""
    cpu = dataclasses.replace(CPU, core_speed={1: 1.0, 4: 0.8, 8: 0.6})
    assert 1 / hogwild_step_s(cpu, 8) == pytest.approx(4 * 0.6 / CPU.step_s)
    assert 1 / hogwild_step_s(cpu, 6) == pytest.approx(4 * 0.7 / CPU.step_s)
    assert 1 / hogwild_step_s(cpu, 16) == pytest.approx(4 * 0.6 / CPU.step_s)


@pytest.mark.parametrize("n", HOGWILD_PROCESSES)
def test_hogwild_scales_with_busy_cores_then_shares_them(n):
    t = hogwild_step_s(CPU, n)
    busy = min(n, CPU.cores)
    assert 1 / t == pytest.approx(busy * core_speed(CPU, n) / CPU.step_s)


def test_hogwild_is_held_to_the_memory_bandwidth_once_it_binds():
    nbytes = step_bytes(hogwild_model(CPU))
    bandwidth = 2 * nbytes / CPU.step_s  # two processes' worth
    cpu = dataclasses.replace(CPU, cores=16, core_speed={1: 1.0}, bandwidth_Bps=bandwidth, core_bandwidth_Bps=1e15)
    assert 1 / hogwild_step_s(cpu, 1) == pytest.approx(1 / CPU.step_s)
    assert 1 / hogwild_step_s(cpu, 8) == pytest.approx(bandwidth / nbytes)


def test_hogwild_scenario_prints_what_it_assumes():
    result = hogwild(_profile())
    assert result.figures["hogwild_procs1_speedup_ratio"] == 1.0
    assert result.figures["hogwild_procs16_speedup_ratio"] == pytest.approx(4 * 0.8)
    assert any("4 cores" in a for a in result.assumptions) and any("tests" in a for a in result.assumptions)
