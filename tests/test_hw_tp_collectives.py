"""`hw calibrate --tp-collectives`: tensor parallelism's collectives timed at its sizes (gloo on the CPU) and fitted to
the ring formula parsim prices them by."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from hw.calibrate.tp_collectives import fit_collectives, tp_sizes  # noqa: E402
from hw.calibrate.tp_host import DEPTHS, fit_tp_host  # noqa: E402
from parsim.profile import load_profile  # noqa: E402
from parsim.workload.tensor_parallel import collective_s  # noqa: E402


def test_the_fit_recovers_the_latency_and_bus_bandwidth_of_rows_made_by_parsims_formula():
    world, latency, busbw = 4, 20e-6, 300e9
    passes = {"allreduce": 2, "reduce_scatter": 1, "all_gather": 1}
    rows = [{"kind": k, "bytes": n, "seconds": latency + p * (world - 1) / world * n / busbw}
            for k, p in passes.items() for n in tp_sizes(cpu=False) for _ in range(3)]
    specs, _ = fit_collectives(rows, world)
    assert set(specs) == {"tp_allreduce", "tp_reduce_scatter", "tp_all_gather"}
    for spec in specs.values():
        assert spec.latency_s == pytest.approx(latency, rel=1e-3) and spec.busbw_Bps == pytest.approx(busbw, rel=1e-3)


def test_dtensor_host_cost_is_the_split_slope_less_the_whole_one_over_the_matrices():
    """Rows made with a per-matrix cost (2 matrices an MLP block, 7 a Llama block) on top of a whole layer's own
    host time and a per-action rest: the fit gives the per-matrix cost back; a split stack cheaper than the whole
    one gives 0, never a negative cost."""
    f, b = 400e-6, 700e-6
    rows = []
    for kind, matrices, own in (("mlp", 2, 50e-6), ("llama", 7, 300e-6)):
        for k in DEPTHS:
            for variant, extra in (("split", matrices), ("whole", 0)):
                rows.append({"kind": kind, "layers": k, "variant": variant,
                             "forward_s": 1e-4 + k * (own + extra * f), "backward_s": 2e-4 + k * (2 * own + extra * b)})
    fit = fit_tp_host(rows)
    assert fit.forward_s == pytest.approx(f, rel=1e-9) and fit.backward_s == pytest.approx(b, rel=1e-9)
    assert fit.per_kind["llama"]["forward_s"] == pytest.approx(7 * f, rel=1e-9)
    whole = {(r["kind"], r["layers"]): r["forward_s"] for r in rows if r["variant"] == "whole"}
    cheaper = [r | {"forward_s": whole[r["kind"], r["layers"]] * 0.9} if r["variant"] == "split" else r for r in rows]
    assert fit_tp_host(cheaper).forward_s == 0.0


def test_tp_sizes_are_a_micro_batchs_activation_in_bf16():
    assert tp_sizes(cpu=False)[0] == 256 * 2048 * 2 and tp_sizes(cpu=False)[-1] == 8192 * 8192 * 2


def test_calibrate_tp_collectives_adds_them_to_the_base_and_parsim_prices_tp_by_them(tmp_path):
    out = tmp_path / "p.json"
    r = subprocess.run([sys.executable, "-m", "hw", "calibrate", "--tp-collectives", "--cpu", "--gpus", "2", "--out",
                        str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    profile, base = load_profile(out), load_profile(None)
    assert {"tp_allreduce", "tp_reduce_scatter", "tp_all_gather"} <= profile.collectives.keys()
    assert profile.collectives["allreduce"] == base.collectives["allreduce"]  # the rest is --base's
    assert profile.layers == base.layers
    spec = profile.collectives["tp_allreduce"]
    assert spec.measured and spec.latency_s > 0
    n = 1 << 20
    assert collective_s(profile, "allreduce", n, 2) == pytest.approx(spec.latency_s + n / 2 / spec.busbw_Bps * 2)
    assert "tp_allreduce" in r.stdout and (tmp_path / "p.samples.json").exists()
    # DTensor's host cost, timed beside the collectives (on gloo a split layer's host waits for its collectives)
    fit = profile.meta["tp_collectives"]["tp_host"]
    assert (profile.host.tp_forward_s, profile.host.tp_backward_s) == (fit["forward_s"], fit["backward_s"])
    assert set(fit["per_kind"]) == {"mlp", "llama"} and "DTensor per split matrix" in r.stdout
    assert dataclasses.replace(profile.host, tp_forward_s=base.host.tp_forward_s,
                               tp_backward_s=base.host.tp_backward_s) == base.host  # the rest of the host's is --base's


def test_calibrate_tp_collectives_needs_two_gpus_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "hw", "calibrate", "--tp-collectives", "--cpu", "--gpus", "1",
                        "--out", str(tmp_path / "p.json")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "needs --gpus 2 or more" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "p.json").exists()
