"""`parsim compare` on a small committed CSV (a test fixture, not a measurement)."""

from __future__ import annotations

import csv
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from parsim.compare import Point, mark_host_sensitive, ranking_lines, read_points, repredict, summary
from parsim.errors import ParsimError

FIXTURE = Path(__file__).parent / "data" / "results-fixture.csv"


def test_summary_leaves_out_excluded_points_and_reports_median_and_worst():
    points = read_points(FIXTURE)
    s = summary(points)
    assert s["points"] == 5 and s["excluded"] == 1
    errors = sorted(abs(p.predicted_s / p.measured_s - 1) for p in points if not p.excluded)
    assert s["median_abs_error"] == pytest.approx(errors[2])
    assert s["max_abs_error"] == pytest.approx(errors[-1])


def _timed(schedule: str, m: int, measured_s: float, predicted_s: float) -> Point:
    return Point(schedule, 2, m, 16, 2048, 8192, measured_s, measured_s, measured_s, 1.0, predicted_s, 1.0)


def test_ranking_says_where_the_predicted_fastest_schedule_is_not_the_measured_fastest_and_by_how_much():
    points = [_timed("gpipe", 4, 0.030, 0.031), _timed("1f1b", 4, 0.032, 0.033),  # right
              _timed("gpipe", 8, 0.050, 0.041), _timed("1f1b", 8, 0.040, 0.042),  # wrong: gpipe is 25% slower
              _timed("gpipe", 16, 0.09, 0.08)]  # one schedule: nothing to rank
    lines = ranking_lines(points)
    assert lines[1] == "fastest schedule: predicted right at 1 of 2 points"
    assert lines[2].endswith("predicted fastest gpipe (31.00 ms)")
    assert "m=8" in lines[3] and lines[3].endswith("predicted fastest gpipe (41.00 ms), which measured +25.0%")


def test_of_schedules_predicted_equally_fast_the_ranking_names_the_one_predicted_to_need_less_memory():
    points = [replace(_timed("gpipe", 16, 0.069, 0.0718), predicted_peak_bytes=9 << 30),
              replace(_timed("1f1b", 16, 0.065, 0.0718), predicted_peak_bytes=3 << 30)]
    assert ranking_lines(points)[1] == "fastest schedule: predicted right at 1 of 1 points"


def test_compare_prints_the_table_and_writes_both_plots(tmp_path):
    result = subprocess.run([sys.executable, "-m", "parsim", "compare", "--measured", str(FIXTURE),
                             "--out", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "median |error|" in result.stdout and "excluded: fixture" in result.stdout
    assert "\nall: " in result.stdout and "\nGPU-bound (not host-sensitive): " in result.stdout
    assert "\n  1f1b, GPU-bound: " in result.stdout and "\n  gpipe, GPU-bound: " in result.stdout  # per schedule
    pngs = sorted(p.name for p in tmp_path.iterdir())
    assert pngs == ["results-fixture-speedups.png", "results-fixture-step-times.png"]
    assert all((tmp_path / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)


def test_repredict_redoes_every_prediction_from_the_given_profile():
    from parsim.profile import load_profile
    from parsim.schedules import build
    from parsim.sim.predict import predict
    from parsim.workload import mlp_model

    profile = load_profile(None)
    points = read_points(FIXTURE)
    again = repredict(points, profile)
    for old, new in zip(points, again):
        expected, _ = predict(build(old.schedule, old.gpus, old.microbatches),
                              mlp_model(old.layers, old.hidden, old.tokens), profile)
        assert new.predicted_s == pytest.approx(expected.step_time_s)
        assert new.measured_s == old.measured_s and new.excluded == old.excluded


def test_compare_with_a_profile_prints_the_redone_table(tmp_path):
    result = subprocess.run([sys.executable, "-m", "parsim", "compare", "--measured", str(FIXTURE),
                             "--out", str(tmp_path), "--profile", "no-such-profile.json"], capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "no-such-profile.json" in result.stderr


def _write(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def test_missing_column_is_named(tmp_path):
    rows = list(csv.DictReader(FIXTURE.open()))
    for r in rows:
        del r["predicted_s"]
    with pytest.raises(ParsimError, match="lacks column.*predicted_s"):
        read_points(_write(tmp_path / "r.csv", rows))


@pytest.mark.parametrize("bad", ["-1", "nan", "abc", "0"])
def test_bad_time_names_the_line(tmp_path, bad):
    rows = list(csv.DictReader(FIXTURE.open()))
    rows[2]["measured_s"] = bad
    with pytest.raises(ParsimError, match="line 4"):
        read_points(_write(tmp_path / "r.csv", rows))


def test_data_parallel_must_divide_the_gpus(tmp_path):
    rows = list(csv.DictReader(FIXTURE.open()))
    for r in rows:
        r["data_parallel"] = "3"
    with pytest.raises(ParsimError, match="data_parallel 3 does not divide gpus"):
        read_points(_write(tmp_path / "r.csv", rows))


def test_repredict_of_a_replicated_point_predicts_the_replicated_step():
    from parsim.profile import load_profile
    from parsim.schedules import build
    from parsim.sim.predict import predict
    from parsim.workload import mlp_model

    point = replace(read_points(FIXTURE)[0], gpus=4, data_parallel=2, copy_streams=True)
    profile = load_profile(None)
    expected, _ = predict(build(point.schedule, 2, point.microbatches),
                          mlp_model(point.layers, point.hidden, point.tokens), profile, True, 2)
    assert repredict([point], profile)[0].predicted_s == pytest.approx(expected.step_time_s)


def test_a_dispatch_bound_point_is_host_sensitive_and_a_compute_bound_one_is_not():
    from parsim.profile import load_profile

    base = read_points(FIXTURE)[0]
    compute = replace(base, schedule="gpipe", gpus=1, microbatches=1, layers=16, hidden=2048, tokens=8192)
    dispatch = replace(base, schedule="gpipe", gpus=1, microbatches=64, layers=8, hidden=256, tokens=1024)
    marked = mark_host_sensitive([compute, dispatch], load_profile(None))
    assert [p.host_sensitive for p in marked] == [False, True]


def test_host_slower_profile_scales_every_host_cost_and_nothing_else():
    from parsim.profile import load_profile

    profile = load_profile(None)
    slow = profile.with_host_slower(2.0)
    assert slow.host.action_s == 2 * profile.host.action_s and slow.host.p2p_s == 2 * profile.host.p2p_s
    assert slow.host.step_s == 2 * profile.host.step_s
    for key, costs in profile.layers.items():
        assert slow.layers[key].forward.host_s == 2 * costs.forward.host_s
        assert slow.layers[key].backward_weight.fixed_s == costs.backward_weight.fixed_s
    assert slow.links == profile.links


def test_the_host_probes_speed_is_its_measured_step_over_its_prediction():
    from parsim.hostprobe import host_speed, probe
    from parsim.profile import load_profile
    from parsim.sim.predict import predict

    profile = load_profile(None)
    for gpus in (1, 2):
        predicted = predict(*probe(gpus), profile)[0].step_time_s
        assert host_speed(predicted, gpus, profile) == pytest.approx(1.0)
        assert host_speed(1.5 * predicted, gpus, profile) == pytest.approx(1.5)


def test_a_point_is_also_predicted_at_the_host_speed_its_turn_measured():
    from parsim.compare import at_measured_host, host_speed_lines, mark_host_sensitive
    from parsim.hostprobe import probe
    from parsim.profile import load_profile
    from parsim.sim.predict import predict

    profile = load_profile(None)
    probe_s = predict(*probe(1), profile)[0].step_time_s
    base = read_points(FIXTURE)[0]
    dispatch = replace(base, schedule="gpipe", gpus=1, microbatches=64, layers=8, hidden=256, tokens=1024,
                       excluded="")  # the host sets its pace: a host twice as slow doubles it
    compute = replace(dispatch, microbatches=1, layers=16, hidden=4096, tokens=16384)  # the GPU sets its pace
    plain = at_measured_host([replace(p, host_probe_s=probe_s) for p in (dispatch, compute)], profile)
    slow = at_measured_host([replace(p, host_probe_s=2 * probe_s) for p in (dispatch, compute)], profile)
    for p in plain:
        assert p.predicted_at_host_s == pytest.approx(repredict([p], profile)[0].predicted_s)
    assert slow[0].predicted_at_host_s == pytest.approx(2 * plain[0].predicted_at_host_s, rel=0.02)
    assert slow[1].predicted_at_host_s == pytest.approx(plain[1].predicted_at_host_s, rel=0.02)
    assert at_measured_host([dispatch], profile)[0].predicted_at_host_s == 0  # no probe in its row: none
    lines = host_speed_lines(slow)
    assert lines[-1].startswith("  hw: 2 points: median |error| ") and " / " in lines[-1]
    marked = mark_host_sensitive(slow, profile)  # per runtime, its GPU-bound points apart: the host does not move them
    assert [p.host_sensitive for p in marked] == [True, False]
    gpu_error = abs(marked[1].error)
    assert host_speed_lines(marked)[-1].endswith(f"; GPU-bound 1: median {gpu_error:.1%}, worst {gpu_error:.1%}")


def test_a_csv_without_the_model_column_names_the_mlp_stack_by_its_sizes(tmp_path):
    from parsim.profile import load_profile

    old = read_points(FIXTURE)  # written before `model` was
    assert all(p.spec == "" for p in old) and old[0].model == "16x h=2048, 8192 tokens"
    rows = list(csv.DictReader(FIXTURE.open()))
    for r in rows:
        r["model"] = f"{r['layers']}x{r['hidden']}x{r['tokens']}"
    new = read_points(_write(tmp_path / "r.csv", rows))
    assert [p.model for p in new] == [p.model for p in old]
    profile = load_profile(None)
    assert [p.predicted_s for p in repredict(new, profile)] == [p.predicted_s for p in repredict(old, profile)]


def test_the_model_column_names_a_conv_net_that_repredict_rebuilds(tmp_path):
    from parsim.profile import load_profile
    from parsim.schedules import build
    from parsim.sim.predict import predict
    from parsim.workload import conv_model

    rows = list(csv.DictReader(FIXTURE.open()))[:1]
    rows[0].update(model="conv:8:4-8:1-2:8", layers="3", hidden="4", tokens="8", gpus="2", microbatches="2")
    point, = read_points(_write(tmp_path / "r.csv", rows))
    assert point.model == "3 x conv+down(C=4/8, S=8/4), 8 images"
    profile = load_profile(None)  # its kind-level "conv" and "down" costs price the tiny net
    expected, _ = predict(build("gpipe", 2, 2), conv_model(8, (4, 8), (1, 2), 8), profile)
    assert repredict([point], profile)[0].predicted_s == pytest.approx(expected.step_time_s)
    assert mark_host_sensitive([point], profile)[0].host_sensitive in (True, False)


def test_a_bad_model_spec_names_the_line(tmp_path):
    rows = [{**r, "model": ""} for r in csv.DictReader(FIXTURE.open())]
    rows[1]["model"] = "conv:eight"
    with pytest.raises(ParsimError, match="line 3: bad model spec 'conv:eight'"):
        read_points(_write(tmp_path / "r.csv", rows))


def test_peak_memory_is_compared_where_a_row_has_both_predicted_and_measured(tmp_path):
    from parsim.compare import error_table

    rows = list(csv.DictReader(FIXTURE.open()))
    peaks = [(110, 100), (90, 100), (103, 100), ("", ""), (200, "")]  # GiB: +10%, -10%, +3%, none, not measured
    for row, (predicted, measured) in zip(rows, peaks):
        row["predicted_peak_bytes"] = predicted and predicted * 2**30
        row["measured_peak_bytes"] = measured and measured * 2**30
    path = tmp_path / "r.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    points = read_points(path)
    assert [p.memory_error for p in points[:5]] == [pytest.approx(0.1), pytest.approx(-0.1), pytest.approx(0.03),
                                                    None, None]
    table = error_table(points)
    assert "peak memory: 3 points: median |error| 10.0%, worst 10.0%" in table
    assert "peak memory" not in error_table(read_points(FIXTURE))  # a CSV without the columns: no such section


def test_a_recompute_column_is_read_repredicted_and_labelled(tmp_path):
    """hw validate's `recompute` column: each row predicted as it ran, named in the table; an unknown mode is its
    line's error."""
    from parsim.profile import load_profile

    rows = list(csv.DictReader(FIXTURE.open()))
    for r in rows:
        r["recompute"] = "always"
    points = read_points(_write(tmp_path / "r.csv", rows))
    assert {p.recompute for p in points} == {"always"} and "recompute=always" in points[0].label
    profile = load_profile(None)
    redone = repredict(points, profile)[0].predicted_s
    kept = repredict([replace(points[0], recompute="never")], profile)[0].predicted_s
    assert redone > kept
    selective = read_points(_write(tmp_path / "s.csv", [dict(r, recompute="selective") for r in rows]))
    assert "recompute=selective" in selective[0].label
    assert repredict(selective[:1], profile)[0].predicted_s == kept  # an MLP stack has no attention core
    rows[1]["recompute"] = "sometimes"
    with pytest.raises(ParsimError, match="line 3.*sometimes"):
        read_points(_write(tmp_path / "bad.csv", rows))


def test_a_csv_without_tensor_parallel_reads_as_one_and_a_tp_row_is_predicted_as_tp(tmp_path):
    """Old CSVs: tensor_parallel 1; a row with tensor_parallel 2 re-predicts as parsim's TP model does."""
    from parsim.configuration import predict
    from parsim.profile import load_profile

    old = read_points(FIXTURE)
    assert {p.tensor_parallel for p in old} == {1}
    rows = list(csv.DictReader(FIXTURE.open()))
    rows = [dict(r, tensor_parallel="2", gpus="2") for r in rows if r.get("runtime", "hw") in ("", "hw")][:1]
    point = read_points(_write(tmp_path / "r.csv", rows))[0]
    assert point.tensor_parallel == 2 and " tp2" in point.label
    profile = load_profile(None)
    expected, _ = predict(point.configuration(), profile)
    assert point.configuration().tensor_parallel == 2
    assert repredict([point], profile)[0].predicted_s == pytest.approx(expected.step_time_s)
    assert expected.step_time_s != predict(replace(point, tensor_parallel=1).configuration(), profile)[0].step_time_s
    rows[0]["tensor_parallel"] = "4"
    with pytest.raises(ParsimError, match="data_parallel 1 x tensor_parallel 4 does not divide gpus 2"):
        read_points(_write(tmp_path / "r.csv", rows))
