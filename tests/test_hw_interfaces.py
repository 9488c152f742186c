"""hw's side of the data-parallel interfaces on the CPU: threads launching ops, a tiny Hogwild, the calibration,
and measured figures that pair up with parsim's predicted ones."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from hw.gil import gil_costs, launch_loop_s, launch_times  # noqa: E402
from hw.hogwild import hogwild_steps, probe_counts, rates, run_processes  # noqa: E402
from parsim.errors import ParsimError  # noqa: E402
from parsim.profile import load_profile  # noqa: E402
from parsim.scenarios import SCENARIOS, compare_figures  # noqa: E402

CPU = torch.device("cpu")


def _hw(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hw", *argv], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("threads", [1, 3])
def test_threads_launching_cpu_ops_take_positive_time_per_launch(threads):
    assert launch_loop_s(CPU, threads, 50) > 0
    times = launch_times(CPU, tuple(dict.fromkeys((1, threads))), launches=50, rounds=2)
    assert all(len(t["rounds_s"]) == 2 and t["per_launch_s"] > 0 for t in times.values())


def test_gil_costs_keep_their_raw_rounds():
    costs, raw = gil_costs(CPU, threads=2, launches=50, rounds=2)
    assert costs.threads == 2 and costs.launch_s > 0 and costs.contended_launch_s > 0 and costs.thread_s > 0
    assert costs.replicate_module_s is None  # replicate needs a GPU
    assert set(raw["times"]) == {"1", "2"}


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


@pytest.mark.parametrize("cores,counts", [(1, (1,)), (2, (1, 2)), (6, (1, 2, 4, 6)), (16, (1, 2, 4, 8, 16))])
def test_core_probe_counts_run_up_to_every_core(cores, counts):
    assert probe_counts(cores) == counts


def test_calibrate_interfaces_adds_both_sections_to_the_base(tmp_path):
    out = tmp_path / "p.json"
    result = _hw("calibrate", "--interfaces", "--cpu", "--out", str(out))
    assert result.returncode == 0, result.stderr
    profile = load_profile(out)
    assert profile.gil is not None and profile.cpu is not None and profile.cpu.step_model == "1x16x8"
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
                                  gil=GilCosts(8e-6, 4e-6, 8, 5e-5, 1e-5, "tests"),
                                  cpu=CpuCosts(2, {1: 1.0, 2: 0.9}, 1e10, 2e10, 1e-3, "1x16x8", "tests"))
    rows = compare_figures(SCENARIOS[name](profile), doc["measured"])
    assert {figure for figure, *_ in rows} == set(doc["measured"])  # every measured figure has a prediction
    assert all(measured > 0 for _, _, measured, _ in rows)
