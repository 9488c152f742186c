"""`python -m hw validate` end to end at tiny sizes on the CPU (gloo): CSV, plots, and `parsim compare` on it."""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from parsim.compare import read_points, repredict  # noqa: E402
from parsim.profile import load_profile  # noqa: E402

SHIPPED = Path(__file__).parent.parent / "parsim" / "profiles" / "default.json"


def _hw_here(capsys, *argv: str):
    """`python -m hw ARGV` run in this process (a refusal: no torch start-up of a subprocess); its status, stderr."""
    from clirun import run

    from hw.__main__ import main

    status, _, err = run(main, list(argv), capsys)
    return status, err


def test_validate_measures_predicts_and_writes_what_compare_reads(tmp_path):
    out = tmp_path / "v"
    r = subprocess.run([sys.executable, "-m", "hw", "validate", "--cpu", "--gpus", "1,2", "--schedules", "1f1b",
                        "--microbatches", "1,2", "--models", "2x16x8", "--steps", "2", "--warmup", "1",
                        "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    points = read_points(out / "results.csv")
    assert [(p.gpus, p.microbatches) for p in points] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert all(p.measured_s > 0 and p.predicted_s > 0 for p in points)
    assert all(p.host_probe_s > 0 for p in points)  # every turn stepped the host probe too
    samples = json.loads((out / "samples.json").read_text())["points"]  # each row's raw steps, its probe's
    assert [(s["gpus"], s["microbatches"]) for s in samples] == [(p.gpus, p.microbatches) for p in points]
    for s, p in zip(samples, points):
        assert len(s["steps_s"]) == len(s["probe_steps_s"]) == 2  # --steps samples, each a block of steps
        assert statistics.median(statistics.mean(b) for b in s["steps_s"]) == pytest.approx(p.measured_s)
    assert (out / "profile.json").exists() and (out / "results-speedups.png").exists()
    again = subprocess.run([sys.executable, "-m", "parsim", "compare", "--measured", str(out / "results.csv")],
                           capture_output=True, text=True, cwd=tmp_path)  # its plots: into the current folder
    assert again.returncode == 0 and "median |error|" in again.stdout
    assert "at the host speed the probe measured in each turn" in again.stdout


def test_validate_refuses_more_gpus_than_the_machine_has(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    status, err = _hw_here(capsys, "validate", "--gpus", "2")
    assert status == 2 and "needs 2 CUDA GPUs; this machine has 0" in err


def test_validate_grid_covers_replicas_and_copy_streams(tmp_path):
    out = tmp_path / "v"  # the shipped profile: no calibration (the test above runs validate's own)
    r = subprocess.run([sys.executable, "-m", "hw", "validate", "--cpu", "--gpus", "2", "--data-parallel", "1,2",
                        "--copy-streams", "--schedules", "1f1b", "--microbatches", "2", "--models", "2x16x8",
                        "--profile", str(SHIPPED), "--steps", "1", "--warmup", "0", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    points = read_points(out / "results.csv")
    assert sorted((p.data_parallel, p.copy_streams) for p in points) == [(1, False), (1, True), (2, False), (2, True)]
    assert {p.label for p in points} == {"1f1b", "1f1b copy-streams", "1f1b dp2", "1f1b dp2 copy-streams"}


def test_validate_runs_a_tiny_conv_net_named_by_its_spec(tmp_path):
    out, spec, shipped = tmp_path / "v", "conv:8:4-8:1-2:8", SHIPPED  # kind-level conv, down costs
    r = subprocess.run([sys.executable, "-m", "hw", "validate", "--cpu", "--gpus", "2", "--schedules", "gpipe",
                        "--microbatches", "2", "--models", spec, "--profile", str(shipped), "--steps", "1",
                        "--warmup", "0", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [(row["model"], row["layers"], row["hidden"], row["tokens"]) for row in rows] == [(spec, "3", "4", "8")]
    point, = read_points(out / "results.csv")
    assert point.model == "3 x conv+down(C=4/8, S=8/4), 8 images" and point.model in r.stdout
    again, = repredict([point], load_profile(shipped))
    assert again.predicted_s == pytest.approx(point.predicted_s)


def test_validate_refuses_a_bad_model_spec_in_one_line(capsys):
    status, err = _hw_here(capsys, "validate", "--cpu", "--models", "2x16x8,conv:8:4")
    assert status == 2 and err.count("\n") == 1 and "bad model spec 'conv:8:4'" in err


def test_validate_runs_a_tiny_transformer_with_a_memory_prediction_per_point(tmp_path):
    """Predicted peak memory per point; measured only on a GPU (torch.cuda.max_memory_allocated), empty here."""
    from dataclasses import replace

    from conftest import transformer_profile

    from parsim.profile import save_profile

    out, spec, profile = tmp_path / "v", "llama:4:16:3:32:4:2:64:128", tmp_path / "p.json"
    shipped = load_profile()
    save_profile(replace(shipped, layers={**shipped.layers, **transformer_profile().layers}), profile)
    r = subprocess.run([sys.executable, "-m", "hw", "validate", "--cpu", "--gpus", "1", "--schedules",
                        "gpipe,interleaved-1f1b", "--microbatches", "1,2", "--models", spec, "--profile", str(profile),
                        "--steps", "1", "--warmup", "0", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [(row["schedule"], row["microbatches"], row["model"], row["tokens"]) for row in rows] == [
        ("gpipe", "1", spec, "4"), ("gpipe", "2", spec, "4"), ("interleaved-1f1b", "1", spec, "4"),
        ("interleaved-1f1b", "2", spec, "4")]
    assert all(int(row["predicted_peak_bytes"]) > 0 and row["measured_peak_bytes"] == "" for row in rows)
    gpipe1, gpipe2 = (int(row["predicted_peak_bytes"]) for row in rows[:2])
    assert gpipe2 < gpipe1  # the same activations held, less working memory on half the sequences
    assert "median |error|" in r.stdout and "peak memory" not in r.stdout  # nothing measured to compare it with
