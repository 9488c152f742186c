"""The maintained tools under scripts/: each says what it is for, imports, and does its job on a small case."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).parent.parent
SCRIPTS_DIR = REPO / "scripts"
SCRIPTS = sorted(SCRIPTS_DIR.glob("*.py"))
SHELL = sorted(SCRIPTS_DIR.glob("*.sh"))


def _script(name: str):
    """scripts/NAME.py imported as a module (its main() runs only as __main__)."""
    spec = importlib.util.spec_from_file_location(f"scripts_{name}", SCRIPTS_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import does: dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_scripts_holds_the_maintained_tools_only():
    assert len(list(SCRIPTS_DIR.iterdir())) <= 12  # experiments live in lab/


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_each_tool_imports_and_says_what_it_is_for(path):
    assert (_script(path.stem).__doc__ or "").strip()


@pytest.mark.parametrize("path", SHELL, ids=lambda p: p.name)
def test_each_shell_tool_parses_and_names_its_usage(path):
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    assert "usage:" in path.read_text()


def test_check_predictions_grid_is_what_parsims_parser_accepts():
    from parsim.cli import main

    points = _script("check_predictions_unchanged").grid("profile.json", quick=True)
    assert len(points) > 50 and all(argv[:2] == ["predict", "--json"] for argv in points)
    assert main(points[0]) == 0  # the first point predicts


def test_compose_profile_carries_what_the_main_profile_lacks(tmp_path):
    from parsim.profile import load_profile

    shipped = REPO / "parsim/profiles/default.json"
    line = _script("compose_profile").compose(shipped, shipped, shipped, shipped, shipped, tmp_path / "p.json")
    composed = load_profile(tmp_path / "p.json")
    assert "wrote" in line and composed.layers == load_profile(shipped).layers


def test_peer_reference_pairs_each_schedule_with_its_one_gpu_step():
    lines = [{"schedule": "single", "layers": 8, "d": 512, "tokens": 4096, "step_s": 0.02, "gpus": 1, "mb": 1},
             {"schedule": "1f1b", "layers": 8, "d": 512, "tokens": 4096, "step_s": 0.012, "gpus": 2, "mb": 8},
             {"schedule": "other", "layers": 8, "d": 512, "tokens": 4096, "step_s": 0.5, "gpus": 2, "mb": 8}]
    (row,) = _script("peer_reference").rows(lines)
    assert row["schedule"] == "1f1b" and row["measured_single_gpu_s"] == 0.02 and row["measured_s"] == 0.012


def test_torch_orders_check_reads_a_torch_schedules_actions():
    from parsim.runtimes.torch_pipelining import TORCH

    check = _script("torch_orders_check")
    acts = check.actions(TORCH.build, "1f1b", 2, 4)
    assert acts is not None and len(acts) == 2 and all(acts)


def test_graphs_gpu_check_finds_the_graphed_gradients_equal_on_the_cpu_stand_in():
    import torch

    from parsim.workload import mlp_model

    row = _script("graphs_gpu_check").check(mlp_model(2, 16, 16), "1f1b", None, 2, False, torch.device("cpu"),
                                            torch.float32)
    assert row["ok"] and row["bitwise_equal_to_hw_eager"] == row["grad_tensors"]


def test_trace_summary_finds_the_compute_streams_waits_and_the_nccl_time_beside_the_actions():
    summary = _script("trace_summary")
    gpu = lambda name, ts, dur: {"cat": "gpu_user_annotation", "name": name, "ts": ts, "dur": dur}  # noqa: E731
    events = [gpu("hw:F(s0,m0)", 0.0, 100.0), gpu("hw:F(s0,m1)", 130.0, 100.0), gpu("hw:B(s0,m0)", 400.0, 50.0),
              {"cat": "user_annotation", "name": "hw:F(s0,m0)", "ts": -50.0, "dur": 10.0},  # the host's: not used
              {"cat": "kernel", "name": "ncclDevKernel_SendRecv", "ts": 200.0, "dur": 100.0},  # 30 us beside F(s0,m1)
              {"cat": "kernel", "name": "ampere_gemm", "ts": 0.0, "dur": 90.0}]
    s = summary.from_trace(events)
    assert s.on_gpu and s.span_us == 450.0 and s.busy_us == 250.0
    assert s.waits == [(170.0, "B(s0,m0)"), (30.0, "F(s0,m1)")]
    assert s.nccl_us == 100.0 and s.nccl_beside_us == 30.0


def test_trace_summary_reads_each_ranks_timeline_from_a_measure_report():
    summary = _script("trace_summary")
    report = {"config": {"device": "NVIDIA H200"},
              "timeline": [{"rank": 0, "actions": [["F(s0,m0)", 0.0, 1e-3], ["F(s0,m1)", 1.5e-3, 2e-3]]},
                           {"rank": 1, "actions": [["F(s1,m0)", 0.0, 1e-3]]}]}
    logged = "UserWarning: the profiler ...\n" + json.dumps(report, indent=2) + "\nUSDT: profiler_stop\n"
    first, second = summary.from_report(summary.load(logged))  # as gpu-session logs it, warnings around it
    assert first.on_gpu and first.waits == [(pytest.approx(500.0), "F(s0,m1)")] and second.waits == []


def test_trace_summary_simulates_the_reports_step_with_parsim_rank_by_rank():
    summary = _script("trace_summary")
    config = {"schedule": "1f1b", "gpus": 2, "data_parallel": 1, "runtime": "hw", "copy_streams": False,
              "microbatches": 2, "stages": 2, "model": "4 x mlp(h=256), 512 tokens", "layers": 4, "balance": [2, 2],
              "hidden": 256, "tokens": 512}
    first, second = summary.predicted({"config": config}, None)
    assert first.on_gpu and second.on_gpu
    held = {name: wait for wait, name in first.waits}
    assert held.get("B(s0,m0)", 0.0) > 0  # rank 0 waits for rank 1's backward to come back
    with pytest.raises(SystemExit, match="MLP stacks only"):
        summary.predicted({"config": {**config, "model": "conv net"}}, None)


def test_resident_probe_chunk_runs_a_forward_and_backward_on_the_cpu():
    import torch

    from hw.calibrate.resident import Chunk

    chunk = Chunk(64, 8, 2, torch.device("cpu"))
    chunk.net.float()
    chunk.x, chunk.dy = chunk.x.float().detach().requires_grad_(), chunk.dy.float()
    chunk()
    assert all(p.grad is not None for p in chunk.net.parameters())
