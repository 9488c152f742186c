"""`python -m hw scenario`: each measurement runs on the CPU at tiny sizes and names parsim's figures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from hw.calibrate.kernels import elementwise_cost, fit_kernel, launch_cost_s, matmul_cost, sync_cost_s  # noqa: E402
from parsim.profile import KernelCost  # noqa: E402


def _hw(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hw", *argv], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name,keys", [
    ("async", {"sync_each_s", "sync_once_s", "speedup_ratio"}),
    ("overlap", {"pinned_serial_s", "pinned_overlapped_s", "pinned_default_stream_s", "pageable_serial_s",
                 "pageable_overlapped_s", "pageable_default_stream_s", "pinned_default_stream_ratio"}),
    ("copy-streams", {"compute_stream_s", "copy_streams_s", "speedup_ratio"}),
    ("pipelined-resnet", {"single_gpu_s", "model_parallel_s", "pipelined_m4_s", "best_speedup_ratio"}),
    ("recompute", {"kept_m1_s", "recomputed_m32_s", "best_recomputed_over_best_kept_ratio"}),  # no peaks on a CPU
])
def test_scenario_runs_on_cpu_and_reports_parsims_figures(name, keys, tmp_path):
    out = tmp_path / "r.json"
    result = _hw("scenario", name, "--cpu", "--out", str(out))
    assert result.returncode == 0, result.stderr
    measured = json.loads(out.read_text())["measured"]
    assert keys <= measured.keys() and all(v > 0 for v in measured.values())


def test_scenario_without_a_gpu_says_so_in_one_line(capsys):
    from clirun import run

    from hw.__main__ import main

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    status, _, err = run(main, ["scenario", "async"], capsys)  # in this process: refused before any work
    assert status == 2
    assert err.strip().splitlines() == [
        "error: no CUDA GPU is visible; run on a GPU machine, or pass --cpu for a smoke test"]


def test_fit_kernel_recovers_fixed_cost_and_rate():
    work = [1e3, 1e5, 1e7, 1e9]
    fit = fit_kernel(work, [KernelCost(5e-6, 2e11).time_s(w) for w in work])
    assert fit.fixed_s == pytest.approx(5e-6, rel=1e-6) and fit.rate == pytest.approx(2e11, rel=1e-6)


def test_cost_probes_return_positive_times_on_cpu():
    cpu = torch.device("cpu")
    assert launch_cost_s(cpu, n=200) > 0 and sync_cost_s(cpu, n=20) >= 0
    for fit, samples in (elementwise_cost(cpu, [1000, 100_000], repeat=3), matmul_cost(cpu, [32, 64], repeat=3)):
        assert fit.rate > 0 and len(samples) == 2
