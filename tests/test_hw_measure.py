"""`python -m hw measure` on the CPU: the report's shape, and its errors."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest

torch = pytest.importorskip("torch")


def _measure(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hw", "measure", *argv], capture_output=True, text=True, timeout=300)


def test_measure_on_cpu_prints_the_documented_json(tmp_path):
    trace = tmp_path / "trace.json"
    r = _measure("--cpu", "--gpus", "2", "--microbatches", "2", "--layers", "2", "--hidden", "16", "--tokens", "8",
                 "--steps", "2", "--warmup", "1", "--json", "--trace", str(trace))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {"step_time_s", "step_time_min_s", "step_time_max_s", "single_device_step_s", "speedup",
            "per_stage", "config"} <= out.keys()
    assert out["step_time_min_s"] <= out["step_time_s"] <= out["step_time_max_s"]
    assert [s["rank"] for s in out["per_stage"]] == [0, 1]
    assert all(s["forward_s"] > 0 and s["backward_s"] > 0 for s in out["per_stage"])
    assert out["config"]["schedule"] == "1f1b" and out["config"]["dtype"] == "fp32"
    for rank in out["timeline"]:  # each rank's computes on its own clock, in the order they ran
        names = [name for name, _, _ in rank["actions"]]
        assert sorted(names) == sorted(f"{op}(s{rank['rank']},m{i})" for op in "FB" for i in range(2)), names
        assert all(0 <= start <= end for _, start, end in rank["actions"])
        assert [end for _, _, end in rank["actions"]] == sorted(end for _, _, end in rank["actions"])
    # stderr is a pipe here, no terminal: nothing of the profiler's own logging there (torch 2.13's "USDT: ...")
    assert "USDT:" not in r.stderr and "STAGE:" not in r.stderr and "profiler_" not in r.stderr, r.stderr
    for rank, path in enumerate((trace, tmp_path / "trace.rank1.json")):  # every rank profiles its own step
        labels = {e["name"] for e in json.loads(path.read_text())["traceEvents"] if e["name"].startswith("hw:")}
        assert {f"hw:F(s{rank},m0)", f"hw:B(s{rank},m1)"} <= labels, labels  # each action, named as parsim does


def test_measure_runs_a_conv_net_split_as_parsim_splits_it(tmp_path):
    """--partition time balances by the profile given, as `parsim predict --partition time` does."""
    from dataclasses import replace

    from parsim.profile import load_profile, save_profile

    shipped = load_profile(None)
    slow_first = replace(shipped.layers["mlp"].forward, flops_per_s=1e3)  # conv@4x8 far slower than the rest
    conv = replace(shipped.layers["mlp"], forward=slow_first)
    save_profile(replace(shipped, layers={"mlp": shipped.layers["mlp"], "conv@4x8": conv,
                                          "conv": shipped.layers["mlp"], "down": shipped.layers["mlp"]}),
                 tmp_path / "p.json")
    (tmp_path / "m.json").write_text(json.dumps({"images": 8, "layers": [
        {"kind": "conv", "hidden": 4, "side": 8, "count": 2}, {"kind": "down", "hidden": 8, "side": 4},
        {"kind": "conv", "hidden": 8, "side": 4}]}))
    r = _measure("--cpu", "--gpus", "2", "--microbatches", "2", "--model", str(tmp_path / "m.json"), "--steps", "1",
                 "--warmup", "0", "--json", "--partition", "time", "--profile", str(tmp_path / "p.json"))
    assert r.returncode == 0, r.stderr
    config = json.loads(r.stdout)["config"]
    assert config["balance"] == [1, 3] and config["model"].endswith("8 images, balance 1/3")


def test_measure_without_enough_gpus_says_so_before_starting_anything():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = _measure("--gpus", "4")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "error: --gpus 4 needs 4 CUDA GPUs; this machine has 0 (pass --cpu to run the ranks on the CPU)"]


@pytest.mark.parametrize("argv,message", [
    (["--cpu", "--microbatches", "0"], "--microbatches: must be at least 1"),
    (["--cpu", "--gpus", "4", "--layers", "2"], "cannot split 2 layers into 4 stages"),
    (["--cpu", "--gpus", "2", "--tokens", "10", "--microbatches", "4"], "10 tokens do not split into 4 equal"),
    (["--cpu", "--gpus", "2", "--layers", "4", "--balance", "3,2"], "add up to the model's 4 layers"),
    (["--cpu", "--gpus", "2", "--layers", "4", "--balance", "1,1,2"], "gives 3 stages but the schedule has 2"),
    (["--cpu", "--gpus", "2", "--conv", "--hidden", "8"], "--conv takes --images, not --hidden"),
    (["--cpu", "--gpus", "3", "--data-parallel", "2"], "--gpus 3 does not split into 2 equal pipeline replicas"),
])
def test_bad_measure_input_is_one_line_and_exit_2(argv, message, capsys):
    from clirun import run

    from hw.__main__ import main

    status, _, err = run(main, ["measure", *argv], capsys)  # in this process: refused before any rank starts
    assert status == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err


def test_balancing_the_conv_net_by_a_profile_without_conv_costs_says_what_to_calibrate(tmp_path):
    from dataclasses import replace

    from parsim.profile import load_profile, save_profile

    shipped = load_profile(None)
    path = tmp_path / "mlp-only.json"
    save_profile(replace(shipped, layers={k: v for k, v in shipped.layers.items() if k.startswith("mlp")}), path)
    r = _measure("--cpu", "--gpus", "2", "--conv", "--partition", "time", "--profile", str(path))
    assert r.returncode == 2 and "calibrate them with `python -m hw calibrate --conv`" in r.stderr
    assert "Traceback" not in r.stderr


def test_each_rank_writes_its_trace_beside_rank_zeros():
    from hw.measure.steps import trace_path

    assert trace_path("out/t.json", 0) == "out/t.json"
    assert trace_path("out/t.json", 3) == "out/t.rank3.json"
    assert trace_path("out.d/trace", 1) == "out.d/trace.rank1"


TINY = ["--cpu", "--gpus", "2", "--microbatches", "4", "--layers", "2", "--hidden", "16", "--tokens", "8",
        "--steps", "2", "--warmup", "1", "--timeout", "5"]


def _torchrun(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "hw", *argv], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_a_rank_killed_mid_step_ends_the_run_with_one_line_naming_it():
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "hw", "measure", *TINY], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HW_KILL_AT": "1:3"})
    assert r.returncode == 2 and time.monotonic() - t0 < 60
    assert r.stderr.strip().splitlines() == ["error: rank 1 was killed by signal 9; every other rank was stopped"]


def test_measure_runs_as_torchruns_ranks_and_reports_once():
    r = _torchrun("measure", *TINY, "--json")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count('"step_time_s"') == 1 and [s["rank"] for s in json.loads(r.stdout)["per_stage"]] == [0, 1]


def test_under_torchrun_a_killed_rank_makes_its_peer_and_torchrun_fail():
    t0 = time.monotonic()
    r = _torchrun("measure", *TINY, env={"HW_KILL_AT": "1:3"})
    assert r.returncode != 0 and time.monotonic() - t0 < 90
    # whichever comes first: the survivor's own one-line error, or torchrun stopping it and naming the kill
    assert "did another rank die?" in r.stderr or "Signal 9 (SIGKILL)" in r.stderr


def test_commands_that_start_their_own_processes_refuse_torchrun():
    r = _torchrun("validate", "--cpu")
    assert r.returncode != 0 and "starts its own processes; run it without torchrun" in r.stderr


def test_measure_runs_pipeline_replicas_with_data_parallelism():
    r = _measure(*TINY, "--gpus", "4", "--data-parallel", "2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["config"]["gpus"] == 4 and out["config"]["data_parallel"] == 2
    assert [s["rank"] for s in out["per_stage"]] == [0, 1]  # replica 0's pipeline reports its stages


def test_measure_can_skip_the_one_device_baseline_a_big_model_would_not_fit():
    """The baseline is the whole batch in one micro-batch on one GPU: Llama 3 8B's plan picks ran out of memory there
    on an H200 (data/recompute/plan-pick-nvidia-h200-x2-2026-11-28), so --no-baseline measures the pipeline alone."""
    r = _measure(*TINY, "--gpus", "2", "--no-baseline", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["speedup"] is None and out["single_device_step_s"] is None and out["step_time_s"] > 0
    text = _measure(*TINY, "--gpus", "2", "--no-baseline")
    assert text.returncode == 0 and "no one-device baseline run" in text.stdout, text.stderr


@contextmanager
def _thread_named(name: str):
    """A waiting thread whose OS name (what /proc shows, as torch names its autograd workers) is `name`."""
    libc = ctypes.CDLL(None)
    started, done, tid = threading.Event(), threading.Event(), []

    def body():
        libc.prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME
        tid.append(threading.get_native_id())
        started.set()
        done.wait()

    t = threading.Thread(target=body)
    t.start()
    started.wait()
    try:
        yield tid[0]
    finally:
        done.set()
        t.join()


def test_host_pinned_binds_the_autograd_worker_too_only_when_asked(monkeypatch):
    from hw.run.ranks import host_pinned

    before = os.sched_getaffinity(0)
    with _thread_named("pt_autograd_0") as worker, _thread_named("other") as other:
        with host_pinned(torch.device("cuda", 0), 0):
            assert len(os.sched_getaffinity(0)) == 1 and os.sched_getaffinity(worker) == before
        monkeypatch.setenv("HW_PIN", "same")
        with host_pinned(torch.device("cuda", 0), 0):
            assert os.sched_getaffinity(worker) == os.sched_getaffinity(0) and len(os.sched_getaffinity(0)) == 1
            assert os.sched_getaffinity(other) == before
        assert os.sched_getaffinity(worker) == before


def test_host_pinned_binds_the_thread_to_one_core_on_a_gpu_and_restores_it(monkeypatch):
    from hw.run.ranks import host_pinned

    before = os.sched_getaffinity(0)
    with host_pinned(torch.device("cuda", 0), 0):
        assert len(os.sched_getaffinity(0)) == 1 and os.sched_getaffinity(0) <= before
    assert os.sched_getaffinity(0) == before
    monkeypatch.setenv("HW_PIN", "0")
    with host_pinned(torch.device("cuda", 0), 0):
        assert os.sched_getaffinity(0) == before
    with host_pinned(torch.device("cpu"), 0):  # CPU ranks need their intra-op threads' cores
        assert os.sched_getaffinity(0) == before


def test_pace_covers_the_lead_and_block_times_from_one_timed_step(monkeypatch):
    """A job whose step takes 4 ms leads each timed sample with ceil(0.15 / 0.004) = 38 untimed steps and times
    ceil(0.05 / 0.004) = 13; a 40 ms step 4 and 2; a 0.4 s step one of each."""
    from hw.measure import steps as measure

    clock = [0.0]
    monkeypatch.setattr(measure.time, "perf_counter", lambda: clock[0])
    for step_s, expected in ((0.004, (38, 13)), (0.04, (4, 2)), (0.4, (1, 1))):
        clock[0] = 0.0

        def step(step_s: float = step_s) -> None:
            clock[0] += step_s

        assert measure.pace(step, lambda: None, None, torch.device("cpu")) == measure.Pace(*expected)


def test_stdout_on_a_full_device_keeps_what_hw_measured_and_names_it(tmp_path):
    """The rule when the report cannot be printed (issue 49): parsim's commands keep none of their files; hw's keep
    what they measured, written before the report, and the one error line names each file kept."""
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "hw", "measure", "--cpu", "--gpus", "2", "--microbatches", "2",
                            "--layers", "2", "--hidden", "16", "--tokens", "8", "--steps", "1", "--warmup", "0",
                            "--trace", "t.json"], stdout=full, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                           timeout=300)
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert r.returncode == 2 and len(errors) == 1, r.stderr
    assert errors[0] == ("error: cannot write to standard output: No space left on device; kept what it measured: "
                         "t.json, t.rank1.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "t.rank1.json"]


def test_a_graphed_jobs_own_memory_counts_its_pool_at_its_captures_peak():
    """What a graphed job holds between steps: weights, its static tensors and what its pool has allocated (the
    gradients are in the pool, not counted again); beyond that, its graphs' intermediates (the pool's peak at the
    captures less what stays allocated). On the CPU there is no pool: weights and gradients, as for hw's runner."""
    from hw.measure.steps import Config, Job, Stepper
    from hw.run.runtimes import job_groups
    from hw.run.stage_runner import Groups
    from parsim.schedules import build
    from parsim.workload import mlp_model

    s = build("1f1b", 1, 4)
    job = Job(s, mlp_model(4, 16, 24), Config(1, 0, "fp64"), runtime="graphs")
    stepper = Stepper(0, torch.device("cpu"), job, job_groups("graphs", s, Groups()))
    stepper()
    weights = sum(p.numel() * 8 for p in stepper.params)
    assert stepper.resident_bytes() == 2 * weights and stepper.captured_bytes() == 0
    stepper.runner.graph_pool_bytes = {"reserved": 10_000, "allocated": 6_000, "peak": 9_000}
    assert stepper.resident_bytes() == weights + stepper.runner.static_bytes() + 6_000
    assert stepper.captured_bytes() == 3_000 and stepper.runner.static_bytes() == 2 * 24 * 16 * 8
