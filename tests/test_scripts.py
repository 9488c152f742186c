"""The diagnostic scripts under scripts/ still import: they name hw's and parsim's functions, which move."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPTS_DIR = Path(__file__).parent.parent / "scripts"
SCRIPTS = sorted(SCRIPTS_DIR.glob("*.py"))


def _script(name: str):
    """scripts/NAME.py imported as a module (its main() runs only as __main__)."""
    spec = importlib.util.spec_from_file_location(f"scripts_{name}", SCRIPTS_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import does: dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_each_script_imports(path):
    _script(path.stem)


def test_gil_handoffs_variants_name_a_placement_and_what_a_launch_does_with_memory():
    handoffs = _script("gil_handoffs")
    assert handoffs.variant("free") == ("free", "alloc")
    assert handoffs.variant("spread-out") == ("spread", "out")
    assert handoffs.variant("free-del") == ("free", "del")
    with pytest.raises(SystemExit, match="unknown variant"):
        handoffs.variant("free-leak")


@pytest.mark.parametrize("memory", ["alloc", "out", "keep", "del"])
def test_gil_handoffs_loop_logs_every_launch_of_every_thread_whatever_it_does_with_memory(memory, monkeypatch):
    import torch

    handoffs = _script("gil_handoffs")
    monkeypatch.setattr(handoffs, "WINDOW_S", 0.02)
    monkeypatch.setitem(handoffs.KEPT, "cpu", 50_000)
    run = handoffs.logged_loop(torch.device("cpu"), 2, "free", handoffs.physical_cpus(), memory)
    assert all(n > 0 for n in run["launches"])
    assert [len(log) for log in run["logs"]] == run["launches"]
    assert run["per_launch_s"] > 0


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

    from hw.resident import Chunk

    chunk = Chunk(64, 8, 2, torch.device("cpu"))
    chunk.net.float()
    chunk.x, chunk.dy = chunk.x.float().detach().requires_grad_(), chunk.dy.float()
    chunk()
    assert all(p.grad is not None for p in chunk.net.parameters())


def test_relevel_host_keeps_each_widths_gpu_costs_and_with_the_calibrations_grad_add_gives_its_host_costs(tmp_path):
    from parsim.profile import load_profile

    relevel = _script("relevel_host")
    calibration = Path(__file__).parent.parent / "data/validation/h200-2026-11-25-gradadd/call2/profile.json"
    own = load_profile(calibration)
    for grad_add_s, name in ((None, "same.json"), (0.0, "none.json")):
        relevel.relevel(calibration, tmp_path / name, calibration.with_name("profile.samples.json"), grad_add_s)
    same, none = load_profile(tmp_path / "same.json"), load_profile(tmp_path / "none.json")
    assert same.host.grad_add_s == own.host.grad_add_s > 0 and none.host.grad_add_s == 0
    assert same.host.step_s == pytest.approx(own.host.step_s, rel=1e-9)
    for key, costs in own.layers.items():
        for op in ("forward", "backward_input", "backward_weight"):
            ours, theirs, plain = getattr(costs, op), getattr(same.layers[key], op), getattr(none.layers[key], op)
            assert theirs.gpu_s(1e12) == plain.gpu_s(1e12) == ours.gpu_s(1e12)
            assert theirs.host_s == pytest.approx(ours.host_s, rel=1e-9)


def test_gil_trial_simulation_paces_one_thread_at_its_launch_and_hands_every_release_over():
    trial = _script("gil_trial")
    segs = [(5e-6, 1e-6), (2e-6, 0.5e-6)]  # two releases a launch: held, then GIL-free
    alone, wakes = trial.simulate(1, segs, lambda idle, sleepers: 3e-6)
    assert alone == pytest.approx(8.5e-6) and wakes == []
    both, wakes = trial.simulate(3, segs, lambda idle, sleepers: 3e-6)  # every release a hand-off: held + wake-ups
    assert both == pytest.approx(5e-6 + 2e-6 + 2 * 3e-6, rel=0.01)  # launches end unevenly within a round
    assert {w[3] for w in wakes} == {0, 1}  # woken by the dispatch's release and by the free's


def test_gil_trial_splits_a_launch_into_its_releases_keeping_its_held_and_free_time():
    trial = _script("gil_trial")
    for releases in (1, 2, 4):
        segs = trial.segments(8e-6, 1.2e-6, 0.5, releases, hold=3e-6)
        assert len(segs) == releases
        assert sum(h for h, _ in segs) == pytest.approx(8e-6 + 3e-6)  # the hold is held too, before the dispatch
        assert sum(f for _, f in segs) == pytest.approx(1.2e-6)
        assert segs[0][0] >= 3e-6 and all(f > 0 for _, f in segs)
