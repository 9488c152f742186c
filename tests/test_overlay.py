"""`parsim compare --timeline`: a profiled trace laid over the simulated step."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from parsim.errors import ParsimError
from parsim.outputs.overlay import measured_kernels


def _trace(path, kernels):
    doc = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": n, "ts": ts, "dur": dur} for n, ts, dur in kernels]
           + [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5}]}
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def test_measured_kernels_start_at_the_first_kernel_and_put_nccl_apart(tmp_path):
    trace = _trace(tmp_path / "t.json.gz", [("gemm", 1000, 50), ("ncclDevKernel_SendRecv", 1060, 10), ("gelu", 1080, 5)])
    compute, comm = measured_kernels(trace)
    assert compute == [(0.0, 50e-6), (80e-6, 5e-6)] and comm == [(60e-6, 10e-6)]


def test_a_trace_without_kernels_or_not_json_gets_a_clear_error(tmp_path):
    with pytest.raises(ParsimError, match="no GPU kernels"):
        measured_kernels(_trace(tmp_path / "cpu.json.gz", []))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ParsimError, match="trace .*bad.json is not valid JSON"):
        measured_kernels(bad)


@pytest.mark.parametrize("spec", ["4x256x1024", "conv:8:4-8:1-2:8"])
def test_compare_timeline_writes_the_overlay_png(tmp_path, spec):
    (tmp_path / "traces").mkdir()
    trace = _trace(tmp_path / "traces" / "step.json.gz", [("gemm", 0, 500), ("gemm", 600, 900)])
    r = subprocess.run([sys.executable, "-m", "parsim", "compare", "--timeline", str(trace), "--point",
                        f"1f1b,2,4,{spec}", "--gpu", "1"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    png = tmp_path / "step-overlay.png"  # in the current folder, not beside the trace
    assert png.read_bytes()[:4] == b"\x89PNG" and "timeline: step-overlay.png" in r.stdout
    assert [p.name for p in (tmp_path / "traces").iterdir()] == ["step.json.gz"]


@pytest.mark.parametrize("argv,message", [
    ([], "needs --measured"),
    (["--timeline", "t.json", "--point", "1f1b,2"], "--point takes"),
    (["--timeline", "t.json", "--point", "1f1b,2,4,4x256x1024", "--gpu", "2"], "--gpu must name"),
    (["--timeline", "t.json", "--point", "1f1b,2,4,conv:x"], "bad model spec 'conv:x'"),
])
def test_compare_timeline_bad_input_gets_one_line(argv, message):
    r = subprocess.run([sys.executable, "-m", "parsim", "compare", *argv], capture_output=True, text=True)
    assert r.returncode == 2 and message in r.stderr and r.stderr.count("\n") == 1
