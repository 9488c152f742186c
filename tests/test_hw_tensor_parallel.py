"""hw's tensor parallelism on the CPU with gloo: torch's ColwiseParallel/RowwiseParallel on each TP group's DeviceMesh
under hw's runner and torch's pipelining runtime, its loss and every gradient equal to the unsplit model's on one
device (fp64)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import assert_same_gradients, one_device_step  # noqa: E402
from test_hw_executor import MODEL  # noqa: E402

from hw.run.ranks import spawn  # noqa: E402
from hw.run.runtimes import check_runs, gradient_step_worker  # noqa: E402
from hw.run.tensor_parallel import place  # noqa: E402
from parsim.errors import ParsimError  # noqa: E402
from parsim.runtimes import get_runtime  # noqa: E402


@pytest.mark.parametrize("runtime,name,ranks,t,microbatches", [
    ("hw", "1f1b", 1, 2, 2), ("hw", "gpipe", 1, 4, 3), ("hw", "1f1b", 2, 2, 4),
    ("torch", "gpipe", 1, 2, 2), ("torch", "1f1b", 2, 2, 4)])
def test_tensor_parallel_stages_get_the_single_devices_loss_and_gradients(runtime, name, ranks, t, microbatches):
    """2 processes (TP 2), 4 (TP 4; TP 2 x PP 2): each rank's gathered gradients are the whole model's."""
    schedule = get_runtime(runtime).build(name, ranks, microbatches)
    results = spawn(gradient_step_worker, ranks * t, (schedule, MODEL, torch.float64, None, 1, runtime, "never", t),
                    timeout_s=30, deadline_s=120)
    last = schedule.stage_to_rank[-1] * t
    loss, grads = one_device_step(MODEL)
    assert_same_gradients(results, last, loss, grads)
    for r in results:  # every TP rank of a stage, not only the last one merged: the whole gradients
        assert r.grads and all(torch.allclose(g, grads[k], rtol=1e-10, atol=1e-14) for k, g in r.grads.items())
    for r in results[last:last + t]:
        assert torch.allclose(r.loss, loss, rtol=1e-12, atol=0)


def test_ranks_are_laid_out_tp_innermost_then_pipeline_then_data_parallel():
    assert [place(g, 2, 2) for g in range(8)] == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1),
                                                   (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]


@pytest.mark.parametrize("runtime,dp,recompute,says", [("graphs", 1, "never", "CUDA graphs"),
                                                       ("hw", 2, "never", "one pipeline replica"),
                                                       ("hw", 1, "always", "does not recompute")])
def test_what_hw_does_not_run_under_tensor_parallelism_is_refused(runtime, dp, recompute, says):
    with pytest.raises(ParsimError, match=says):
        check_runs(runtime, dp, False, recompute, tensor_parallel=2)


def _hw(*argv: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "hw", *argv], capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("runtime,schedule,gpus", [("hw", "1f1b", 2), ("torch", "gpipe", 4)])
def test_measure_times_a_tensor_parallel_step_on_every_rank_of_its_groups(runtime, schedule, gpus):
    """hw measure --tensor-parallel 2 on 2 gloo processes (one pipeline rank) and 4 (two), end to end."""
    import json

    r = _hw("measure", "--cpu", "--gpus", str(gpus), "--tensor-parallel", "2", "--runtime", runtime, "--schedule",
            schedule, "--microbatches", "2", "--layers", "2", "--hidden", "16", "--tokens", "8", "--steps", "2",
            "--warmup", "1", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["config"]["tensor_parallel"] == 2 and out["config"]["gpus"] == gpus
    assert [s["rank"] for s in out["per_stage"]] == list(range(0, gpus, 2))  # each stage's TP index 0
    assert all(s["forward_s"] > 0 and s["backward_s"] > 0 for s in out["per_stage"])
    assert out["step_time_s"] > 0 and out["single_device_step_s"] > 0


def test_validate_measures_tensor_parallel_points_and_predicts_them_with_parsims_tp_model(tmp_path):
    """Each TP point's prediction is parsim's of the same configuration with its tensor_parallel (not tp=1's), and
    compare re-predicts the CSV to the same numbers."""
    from dataclasses import replace
    from pathlib import Path

    from parsim.compare import read_points, repredict
    from parsim.configuration import Configuration, predict
    from parsim.profile import load_profile
    from parsim.workload import model_from_spec

    shipped = Path(__file__).parent.parent / "parsim" / "profiles" / "default.json"
    out = tmp_path / "v"
    r = _hw("validate", "--cpu", "--gpus", "2", "--tensor-parallel", "1,2", "--runtimes", "hw,torch", "--schedules",
            "gpipe", "--microbatches", "2", "--models", "2x16x8", "--steps", "2", "--warmup", "1", "--profile",
            str(shipped), "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    points = read_points(out / "results.csv")
    assert sorted((p.tensor_parallel, p.runtime) for p in points) == [(1, "hw"), (1, "torch"), (2, "hw"),
                                                                      (2, "torch")]
    profile = load_profile(shipped)
    for p in points:
        config = Configuration(model_from_spec("2x16x8"), "gpipe", 2, 2, runtime=p.runtime,
                               tensor_parallel=p.tensor_parallel)
        assert p.predicted_s == pytest.approx(predict(config, profile)[0].step_time_s, rel=1e-12)
        assert p.measured_s > 0
    tp2 = [p for p in points if p.tensor_parallel == 2]
    assert tp2 and all(p.predicted_s != predict(replace(p, tensor_parallel=1).configuration(), profile)[0].step_time_s
                       for p in tp2)
    again = repredict([replace(p, predicted_s=1.0, predicted_peak_bytes=0) for p in points], profile)
    assert [p.predicted_s for p in again] == pytest.approx([p.predicted_s for p in points], rel=1e-12)
    assert [p.predicted_peak_bytes for p in again] == [p.predicted_peak_bytes for p in points]
    assert "gpipe tp2" in _hw_compare(out / "results.csv")


def _hw_compare(path) -> str:
    """`parsim compare` of this checkout on `path`, run in its folder (where it writes its plots)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    r = subprocess.run([sys.executable, "-m", "parsim", "compare", "--measured", str(path)], capture_output=True,
                       text=True, cwd=path.parent, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("argv,says", [
    (("--runtime", "graphs"), "tensor parallelism under the hw and torch runtimes"),
    (("--data-parallel", "2", "--gpus", "4"), "one pipeline replica"),
    (("--conv",), "no matmuls parsim splits"),
])
def test_measure_refuses_what_hw_does_not_run_under_tensor_parallelism_in_one_line(argv, says):
    r = _hw("measure", "--cpu", "--gpus", "2", "--tensor-parallel", "2", *argv)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_llama_transformer_split_two_ways_gets_the_single_devices_loss_and_gradients():
    """Vocab-parallel embedding, column/row-parallel attention (heads / 2 a process) and MLP, vocab-parallel head
    with its cross-entropy under loss_parallel: on 2 processes (TP 2) and 4 (TP 2 x PP 2, 1F1B), every gathered
    gradient and the loss equal the unsplit model's."""
    from conftest import one_device_step as llama_reference
    from test_hw_transformer import MODEL as LLAMA

    loss, grads = llama_reference(LLAMA)
    for name, ranks, microbatches, t in [("gpipe", 1, 2, 2), ("1f1b", 2, 3, 2)]:
        schedule = get_runtime("hw").build(name, ranks, microbatches)
        results = spawn(gradient_step_worker, ranks * t, (schedule, LLAMA, torch.float64, None, 1, "hw", "never", t),
                        timeout_s=30, deadline_s=120)
        last = schedule.stage_to_rank[-1] * t
        assert_same_gradients(results, last, loss, grads)
        for r in results:
            assert all(torch.allclose(g, grads[k], rtol=1e-10, atol=1e-14) for k, g in r.grads.items())
        for r in results[last:last + t]:
            assert torch.allclose(r.loss, loss, rtol=1e-12, atol=0)


def test_hw_splits_mlp_stacks_and_llama_transformers_and_refuses_the_rest_in_one_line():
    from dataclasses import replace

    from test_hw_transformer import LLAMA
    from test_hw_transformer import MODEL as LLAMA_MODEL

    from hw.run.tensor_parallel import check_model
    from parsim.workload import transformer_model

    check_model(MODEL)
    check_model(MODEL, "torch")
    check_model(LLAMA_MODEL)
    with pytest.raises(ParsimError, match="under the torch runtime on MLP stacks; this model has embed, head, llama"):
        check_model(LLAMA_MODEL, "torch")
    gpt = transformer_model(replace(LLAMA, variant="gpt", kv_heads=4, positions=12), 1, 6)
    with pytest.raises(ParsimError, match="this model has gpt layers"):
        check_model(gpt)
