"""hw's tensor parallelism on the CPU with gloo: torch's ColwiseParallel/RowwiseParallel on each TP group's DeviceMesh
under hw's runner and torch's pipelining runtime, its loss and every gradient equal to the unsplit model's on one
device (fp64)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import assert_same_gradients  # noqa: E402
from test_hw_executor import MODEL, _reference  # noqa: E402

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
    loss, grads = _reference(MODEL)
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
