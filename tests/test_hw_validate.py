"""`python -m hw validate` end to end at tiny sizes on the CPU (gloo): CSV, plots, and `parsim compare` on it."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch")

from parsim.compare import read_points  # noqa: E402


def test_validate_measures_predicts_and_writes_what_compare_reads(tmp_path):
    out = tmp_path / "v"
    r = subprocess.run([sys.executable, "-m", "hw", "validate", "--cpu", "--gpus", "1,2", "--schedules", "1f1b",
                        "--microbatches", "1,2", "--models", "2x16x8", "--steps", "2", "--warmup", "1",
                        "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    points = read_points(out / "results.csv")
    assert [(p.gpus, p.microbatches) for p in points] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert all(p.measured_s > 0 and p.predicted_s > 0 for p in points)
    assert (out / "profile.json").exists() and (out / "results-speedups.png").exists()
    again = subprocess.run([sys.executable, "-m", "parsim", "compare", "--measured", str(out / "results.csv")],
                           capture_output=True, text=True)
    assert again.returncode == 0 and "median |error|" in again.stdout


def test_validate_refuses_more_gpus_than_the_machine_has():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = subprocess.run([sys.executable, "-m", "hw", "validate", "--gpus", "2"], capture_output=True, text=True)
    assert r.returncode == 2 and "needs 2 CUDA GPUs; this machine has 0" in r.stderr


def test_validate_grid_covers_replicas_and_copy_streams(tmp_path):
    out = tmp_path / "v"
    r = subprocess.run([sys.executable, "-m", "hw", "validate", "--cpu", "--gpus", "2", "--data-parallel", "1,2",
                        "--copy-streams", "--schedules", "1f1b", "--microbatches", "2", "--models", "2x16x8",
                        "--steps", "1", "--warmup", "0", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    points = read_points(out / "results.csv")
    assert sorted((p.data_parallel, p.copy_streams) for p in points) == [(1, False), (1, True), (2, False), (2, True)]
    assert {p.label for p in points} == {"1f1b", "1f1b copy-streams", "1f1b dp2", "1f1b dp2 copy-streams"}
