"""Issue 17's hostile inputs to `python -m parsim`, each a named regression case: one `error:` line, exit status 2,
no traceback, nothing written (the report: shared/reports/hostile-inputs-2026-11-23.md, by cause).

Run in this process (parsim.cli.main) from a scratch folder; the FIFO, /dev/full and umask cases, which need a real
process, are in test_inputs_outputs.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from clirun import refused, run

from parsim.cli import main
from parsim.profile import load_profile
from parsim.runtimes import RUNTIMES

FIXTURE = Path(__file__).parent / "data" / "results-fixture.csv"
SMALL = ["--gpus", "2", "--layers", "2", "--hidden", "64", "--tokens", "64", "--microbatches", "2"]
SHIPPED = load_profile().to_json()


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A scratch folder, the current one, holding a good model, profile, schedule CSV and results CSV, and a folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.json").write_text(json.dumps({"tokens": 64, "layers": [{"kind": "mlp", "hidden": 64,
                                                                                 "count": 2}]}))
    (tmp_path / "profile.json").write_text(json.dumps(SHIPPED))
    (tmp_path / "s.csv").write_text("0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n")
    shutil.copy(FIXTURE, tmp_path / "results.csv")
    (tmp_path / "dir").mkdir()
    return tmp_path


def _write(path: str, content: str | bytes) -> str:
    Path(path).write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def _profile(**edits) -> str:
    """A profile file: the shipped one with `edits` ("links.nvlink.latency_s": value) applied."""
    doc = json.loads(json.dumps(SHIPPED))
    for dotted, value in edits.items():
        *path, last = dotted.split(".")
        node = doc
        for key in path:
            node = node[key]
        node[last] = value
    return _write("edited-profile.json", json.dumps(doc))


def _model(doc: object) -> str:
    return _write("bad-model.json", json.dumps(doc))


def _mlp(**fields) -> dict:
    return {"tokens": 64, "layers": [{"kind": "mlp", "hidden": 64, "count": 2, **fields}]}


DEEP = "[" * 100_000 + "]" * 100_000
BINARY = bytes([0xFF, 0xFE, 0x00, 0x80, 0x81]) * 20

# --- exceptions that escaped as tracebacks: output paths -----------------------------------------------------------
OUTPUT_CASES = {
    "predict_trace_is_a_directory": (["predict", *SMALL, "--trace", "dir"], "it is a folder"),
    "predict_plot_is_a_directory": (["predict", *SMALL, "--plot", "dir"], "it is a folder"),
    "plan_trace_is_a_directory": (["plan", "--gpus", "2", "--layers", "2", "--jobs", "1", "--trace", "dir"],
                                  "it is a folder"),
    "predict_trace_name_of_300_characters": (["predict", *SMALL, "--trace", "t" * 300 + ".json"], "bytes long"),
    "predict_plot_name_of_300_characters": (["predict", *SMALL, "--plot", "p" * 300 + ".png"], "bytes long"),
    "predict_trace_in_a_missing_folder": (["predict", *SMALL, "--trace", "nope/t.json"], "does not exist"),
    "predict_trace_ending_in_a_slash": (["predict", *SMALL, "--trace", "new/"], "names a folder"),
    "predict_trace_is_a_device": (["predict", *SMALL, "--trace", "/dev/null"], "character device"),
    "compare_out_is_a_regular_file": (["compare", "--measured", "results.csv", "--out", "s.csv"], "is not a folder"),
    "compare_out_under_a_regular_file": (["compare", "--measured", "results.csv", "--out", "s.csv/x"],
                                         "Not a directory"),
    "compare_timeline_missing_leaves_no_out_folder_made": (
        ["compare", "--timeline", "t.json.gz", "--point", "1f1b,2,4,4x256x1024", "--out", "nope/deeper"],
        "cannot read trace t.json.gz"),
    "compare_bad_csv_leaves_no_out_folder_made": (["compare", "--measured", "s.csv", "--out", "new/deeper"],
                                                  "results s.csv"),
    "predict_trace_and_plot_the_same_file": (["predict", *SMALL, "--trace", "x.png", "--plot", "x.png"],
                                             "already another output"),
}


@pytest.mark.parametrize("argv,message", OUTPUT_CASES.values(), ids=OUTPUT_CASES.keys())
def test_an_output_path_that_cannot_be_written_is_refused_before_any_work(scratch, capsys, argv, message):
    refused(main, argv, capsys, scratch, message)


def test_an_output_in_a_read_only_folder_is_refused_before_any_work(scratch, capsys):
    import os

    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    (scratch / "ro").mkdir(mode=0o555)
    refused(main, ["predict", *SMALL, "--trace", "ro/t.json"], capsys, scratch, "is not writable")
    refused(main, ["compare", "--measured", "results.csv", "--out", "ro"], capsys, scratch, "is not writable")


# --- numbers: absurd sizes on the command line and in model files --------------------------------------------------
NUMBER_CASES = {
    "hidden_of_90_digits": (["predict", "--hidden", "1" + "0" * 90], "--hidden: must be at most 1,000,000,000"),
    "hidden_of_400_digits": (["predict", "--hidden", "9" * 400], "--hidden: must be at most"),
    "tokens_of_90_digits": (["predict", "--tokens", "1" + "0" * 90], "--tokens: must be at most"),
    "images_of_300_digits": (["predict", "--conv", "--images", "1" + "0" * 300], "--images: must be at most"),
    "layers_of_10_to_the_12": (["predict", "--layers", "1" + "0" * 12], "--layers: must be at most 100,000,000"),
    "gpus_as_a_float": (["predict", "--gpus", "2.5"], "expected a whole number, got '2.5'"),
    "microbatches_as_nan": (["predict", "--microbatches", "nan"], "expected a whole number"),
    "memory_limit_nan": (["plan", "--memory-limit", "nan"], "--memory-limit: must be a finite number above 0"),
    "memory_limit_inf": (["plan", "--memory-limit", "inf"], "--memory-limit: must be a finite number"),
    "memory_limit_1e400": (["plan", "--memory-limit", "1e400"], "--memory-limit: must be a finite number"),
    "memory_limit_negative": (["plan", "--memory-limit", "-8"], "--memory-limit: must be a finite number above 0"),
    "jobs_absurd": (["plan", "--jobs", "1000000"], "--jobs: must be at most 1,024"),
    "compare_gpu_negative": (["compare", "--timeline", "t.json", "--point", "1f1b,2,4,4x64x64", "--gpu", "-1"],
                             "--gpu: must be at least 0"),
    "compare_point_of_400_digits": (["compare", "--timeline", "t.json", "--point", "1f1b," + "9" * 400 + ",4,4x64x64"],
                                    "--point takes"),
    "model_spec_hidden_of_400_digits": (
        ["compare", "--timeline", "t.json", "--point", "1f1b,2,4,4x" + "9" * 400 + "x64"], "--hidden must be at most"),
    "model_file_hidden_1e400": (lambda: ["predict", "--model", _write("m.json", '{"tokens": 64, "layers": '
                                                                       '[{"kind": "mlp", "hidden": 1e400}]}')],
                                "layers[0].hidden must be a whole number, got inf"),
    "model_file_tokens_infinity": (lambda: ["predict", "--model", _write("m.json", '{"tokens": Infinity, "layers": '
                                                                          '[{"kind": "mlp", "hidden": 64}]}')],
                                   "tokens must be a whole number, got inf"),
    "model_file_tokens_nan": (lambda: ["predict", "--model", _write("m.json", '{"tokens": NaN, "layers": '
                                                                     '[{"kind": "mlp", "hidden": 64}]}')],
                              "tokens must be a whole number, got nan"),
    "model_file_conv_side_10_to_the_183": (lambda: ["predict", "--model", _model(
        {"images": 8, "layers": [{"kind": "conv", "hidden": 4, "side": 10**183}]})], "layers[0].side must be at most"),
    "model_file_count_10_to_the_12": (lambda: ["predict", "--model", _model(_mlp(count=10**12))],
                                      "layers[0].count must be at most 100,000,000"),
    "model_file_counts_add_past_the_limit": (lambda: ["predict", "--model", _model(
        {"tokens": 64, "layers": [{"kind": "mlp", "hidden": 64, "count": 10**8}] * 2})],
        "counts in all must be at most"),
    # issue 49: a Llama's sequence past what its config was built for
    "preset_seq_len_past_max_positions": (["predict", "--model", "llama-3-8b", "--seq-len", "1000000000",
                                           "--global-batch", "8"], "past the config's max_position_embeddings 8,192"),
    "model_file_hidden_of_5000_digits": (lambda: ["predict", "--model", _write(
        "m.json", '{"tokens": 64, "layers": [{"kind": "mlp", "hidden": 1' + "0" * 5000 + "}]}")],
        "is not valid JSON"),
}


@pytest.mark.parametrize("argv,message", NUMBER_CASES.values(), ids=NUMBER_CASES.keys())
def test_an_absurd_number_is_one_line_naming_the_flag_or_field(scratch, capsys, argv, message):
    refused(main, argv() if callable(argv) else argv, capsys, scratch, message)


# --- files: nesting, devices, binary bytes, wrong types ------------------------------------------------------------
FILE_CASES = {
    "model_of_100000_nested_brackets": (lambda: ["predict", "--model", _write("m.json", DEEP)], "nests 100,000 levels"),
    "profile_of_100000_nested_brackets": (lambda: ["predict", "--profile", _write("p.json", DEEP)], "nests 100,000"),
    "model_nested_inside_a_valid_object": (lambda: ["predict", "--model", _write(
        "m.json", '{"tokens": 64, "x": ' + DEEP + ', "layers": [{"kind": "mlp", "hidden": 64}]}')], "nests 100,001"),
    "profile_nested_inside_a_valid_object": (lambda: ["predict", "--profile", _write(
        "p.json", json.dumps(SHIPPED)[:-1] + ', "x": ' + DEEP + "}")], "levels deep"),
    "dev_zero_as_model": (["predict", "--model", "/dev/zero"], "/dev/zero is a character device, not a regular file"),
    "dev_zero_as_profile": (["predict", "--profile", "/dev/zero"], "is a character device"),
    "dev_urandom_as_model": (["predict", "--model", "/dev/urandom"], "is a character device"),
    "dev_urandom_as_profile": (["sweep", "--profile", "/dev/urandom"], "is a character device"),
    "dev_zero_as_schedule_csv": (["predict", "--schedule", "/dev/zero.csv"], "cannot read schedule /dev/zero.csv"),
    "dev_null_as_measured_csv": (["compare", "--measured", "/dev/null"], "is a character device"),
    "dev_zero_as_timeline": (["compare", "--timeline", "/dev/zero", "--point", "1f1b,2,4,4x64x64", "--out", "dir"],
                             "is a character device"),
    "folder_as_model": (["predict", "--model", "dir"], "model file dir is a folder"),
    "folder_as_profile": (["predict", "--profile", "dir"], "profile dir is a folder"),
    "folder_as_measured_csv": (["compare", "--measured", "dir"], "results dir is a folder"),
    "binary_bytes_as_profile": (lambda: ["predict", "--profile", _write("p.json", BINARY)],
                                "is not UTF-8 text (byte 0xff at offset 0)"),
    "binary_bytes_as_model": (lambda: ["predict", "--model", _write("m.json", BINARY)], "is not UTF-8 text"),
    "binary_bytes_as_schedule_csv": (lambda: ["predict", "--schedule", _write("b.csv", BINARY)], "is not UTF-8 text"),
    "binary_bytes_as_measured_csv": (lambda: ["compare", "--measured", _write("b.csv", BINARY)], "is not UTF-8 text"),
    "binary_bytes_as_timeline": (lambda: ["compare", "--timeline", _write("t.json", BINARY), "--point",
                                          "1f1b,2,4,4x64x64"], "is not UTF-8 text"),
    "nul_bytes_in_a_schedule_csv": (lambda: ["predict", "--schedule", _write("n.csv", "0F0\0,0B0\n")], "NUL byte"),
    "gzip_trace_that_is_not_gzip": (lambda: ["compare", "--timeline", _write("t.json", b"\x1f\x8bnot gzip"),
                                             "--point", "1f1b,2,4,4x64x64"], "not a readable gzip file"),
    "trace_without_trace_events": (lambda: ["compare", "--timeline", _write("t.json", "[1, 2]"), "--point",
                                            "1f1b,2,4,4x64x64"], "no \"traceEvents\" list"),
    "trace_kernel_without_a_time": (lambda: ["compare", "--timeline", _write("t.json", json.dumps(
        {"traceEvents": [{"cat": "kernel", "name": "gemm"}]})), "--point", "1f1b,2,4,4x64x64"],
        "kernel event 0's ts must be a finite number"),
    "model_layers_not_a_list": (lambda: ["predict", "--model", _model({"tokens": 64, "layers": 3})],
                                "needs a non-empty \"layers\" list"),
    "model_layer_not_an_object": (lambda: ["predict", "--model", _model({"tokens": 64, "layers": [5]})],
                                  "layers[0] must be an object"),
    "model_kind_not_a_string": (lambda: ["predict", "--model", _model(_mlp(kind=["mlp"]))], "kind must be a string"),
    "model_top_level_a_list": (lambda: ["predict", "--model", _model([1, 2])], "needs a non-empty \"layers\" list"),
    "profile_top_level_a_list": (lambda: ["predict", "--profile", _write("p.json", "[]")], "is not a parsim profile"),
}


@pytest.mark.parametrize("argv,message", FILE_CASES.values(), ids=FILE_CASES.keys())
def test_a_hostile_input_file_is_one_line_naming_the_file_and_rule(scratch, capsys, argv, message):
    refused(main, argv() if callable(argv) else argv, capsys, scratch, message)


# --- profiles: wrong types and extreme-but-finite values (the report's "step time inf s, speedup nanx") ----------
PROFILE_CASES = {
    "meta_carried_from_base_a_number_in_predict": ("predict", {"meta.carried_from_base": 3},
                                                   "meta.carried_from_base must be a list of names"),
    "meta_carried_from_base_a_number_in_plan": ("plan", {"meta.carried_from_base": 3}, "carried_from_base"),
    "meta_carried_from_base_a_number_in_sweep": ("sweep", {"meta.carried_from_base": 3}, "carried_from_base"),
    "meta_carried_from_base_a_string_list": ("predict", {"meta.carried_from_base": [1, 2]}, "carried_from_base"),
    "meta_gpu_count_a_string": ("predict", {"meta.gpu_count": "2"}, "meta.gpu_count must be a whole number"),
    "meta_gpu_a_number": ("predict", {"meta.gpu": 200}, "meta.gpu must be a string"),
    "meta_date_a_list": ("predict", {"meta.date": [2026]}, "meta.date must be a string"),
    "meta_not_an_object": ("predict", {"meta": [1]}, "meta must be an object"),
    "version_1_point_0": ("predict", {"version": 1.0}, "schema version 1.0"),
    "version_true": ("predict", {"version": True}, "schema version True"),
    "version_a_string": ("predict", {"version": "1"}, "schema version '1'"),
    "provisional_a_string": ("predict", {"provisional": "false"}, "provisional must be true or false"),
    "link_measured_a_number": ("predict", {"links.nvlink.measured": 0}, "nvlink.measured must be true or false"),
    "flops_per_s_denormal": ("predict", {"layers.mlp.forward.flops_per_s": 5e-324},
                             "layers.mlp.forward.flops_per_s must be a finite number from 0.001"),
    "flops_per_s_denormal_in_plan": ("plan", {"layers.mlp.forward.flops_per_s": 5e-324}, "flops_per_s"),
    "action_s_1e308": ("predict", {"host.action_s": 1e308}, "host.action_s must be 0 or a finite number above 0 "
                                                            "to 86400"),
    "latency_1_7e308": ("predict", {"links.nvlink.latency_s": 1.7e308}, "links.nvlink.latency_s"),
    "bandwidth_denormal": ("predict", {"links.nvlink.bandwidth_Bps": 5e-324}, "links.nvlink.bandwidth_Bps"),
    "bandwidth_denormal_with_json": ("predict --json", {"links.nvlink.bandwidth_Bps": 5e-324}, "bandwidth_Bps"),
    "fixed_s_negative": ("predict", {"layers.mlp.backward_input.fixed_s": -1e-3}, "fixed_s"),
    "host_s_infinity": ("predict", {"layers.mlp.forward.host_s": float("inf")}, "host_s must be 0 or a finite number"),
    "gpus_per_node_true": ("predict", {"gpus_per_node": True}, "gpus_per_node must be a whole number, got True"),
    "gpus_per_node_1_point_5": ("predict", {"gpus_per_node": 1.5}, "gpus_per_node must be a whole number"),
    "gpu_memory_bytes_infinity": ("plan", {"gpu_memory_bytes": float("inf")}, "gpu_memory_bytes must be"),
    "runtime_gpu_scale_1e300": ("predict --runtime torch", {"runtimes.torch.gpu_scale": 1e300}, "gpu_scale"),
    "resident_comm_rate_0": ("predict", {"resident_comm.rate": 0},
                             "resident_comm.rate must be a finite number above 0"),
    "resident_comm_rate_above_1": ("predict", {"resident_comm.rate": 1.5}, "resident_comm.rate must be"),
    "resident_comm_a_list": ("predict", {"resident_comm": [0.6]}, "resident_comm is missing or not an object"),
}


@pytest.mark.parametrize("command,edits,message", PROFILE_CASES.values(), ids=PROFILE_CASES.keys())
def test_a_profile_with_a_wrong_type_or_extreme_value_names_the_field(scratch, capsys, command, edits, message):
    command, *extra = command.split()
    small = SMALL if command != "plan" else ["--gpus", "2", "--layers", "2", "--jobs", "1"]
    if command == "sweep":
        small = ["--gpus", "2", "--layers", "2", "--microbatches", "2"]
    refused(main, [command, *small, *extra, "--profile", _profile(**edits)], capsys, scratch, message)


def test_a_prediction_that_comes_out_non_finite_names_the_profile_and_the_quantity(capsys):
    """Profiles built in code skip the loader's ranges: the prediction itself refuses a non-finite step."""
    from dataclasses import replace

    from parsim.errors import ProfileError
    from parsim.profile import LayerCosts, OpCost
    from parsim.schedules import build
    from parsim.sim.predict import predict
    from parsim.workload import mlp_model

    slow = OpCost(0.0, 0.0, 5e-324)
    shipped = load_profile()
    profile = replace(shipped, layers={**shipped.layers, "mlp": LayerCosts(slow, slow, slow)})
    with pytest.raises(ProfileError, match=r"gives 2 x mlp\(h=64\), 64 tokens a step time of inf s"):
        predict(build("1f1b", 2, 2), mlp_model(2, 64, 64), profile)


# --- compare --measured CSVs ---------------------------------------------------------------------------------------
def _results(**cells) -> str:
    """results.csv with its second row's `cells` replaced (line 3 of the file)."""
    import csv
    import io

    rows = list(csv.DictReader(FIXTURE.open()))
    rows[1].update(cells)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(dict.fromkeys([*rows[0], *cells])))
    writer.writeheader()
    writer.writerows(rows)
    return _write("edited.csv", buf.getvalue())


CSV_CASES = {
    "measured_s_inf": ({"measured_s": "inf"}, "line 3: measured_s must be a number from 1e-09 to 1e+06, got inf"),
    "measured_s_nan": ({"measured_s": "nan"}, "line 3: measured_s"),
    "measured_max_s_1e308": ({"measured_max_s": "1e308"}, "line 3: measured_max_s"),
    "measured_s_denormal": ({"measured_s": "5e-324"}, "line 3: measured_s"),
    "min_above_median_above_max": ({"measured_min_s": "0.03", "measured_s": "0.02", "measured_max_s": "0.01"},
                                   "line 3: measured_min_s <= measured_s <= measured_max_s must hold"),
    "min_above_median": ({"measured_min_s": "1"}, "measured_min_s <= measured_s"),
    "predicted_s_negative": ({"predicted_s": "-1"}, "line 3: predicted_s"),
    "gpus_of_400_digits": ({"gpus": "9" * 400}, "line 3: gpus must be a whole number from 1 to"),
    "microbatches_zero": ({"microbatches": "0"}, "line 3: microbatches must be"),
    "hidden_a_float": ({"hidden": "16.7"}, "line 3: hidden must be a whole number, got '16.7'"),
    # issue 49: each bad cell names its column; a schedule cell never opens a file
    "gpus_one_point_oh": ({"gpus": "1.0"}, "line 3: gpus must be a whole number, got '1.0'"),
    "measured_s_text": ({"measured_s": "abc"}, "line 3: measured_s must be a number, got 'abc'"),
    "schedule_unknown": ({"schedule": "foo"}, "line 3: schedule: "),
    "schedule_a_csv_file": ({"schedule": "x.csv"}, "line 3: schedule must name a schedule, got a file name"),
    "torch_schedule_unknown": ({"schedule": "Nope", "runtime": "torch"}, "line 3: schedule: the torch runtime"),
    "peak_bytes_inf": ({"predicted_peak_bytes": "inf"}, "line 3: predicted_peak_bytes"),
    "host_probe_s_nan": ({"host_probe_s": "nan"}, "line 3: host_probe_s"),
    "schedule_empty": ({"schedule": ""}, "line 3: schedule is empty"),
    "data_parallel_negative": ({"data_parallel": "-2"}, "line 3: data_parallel"),
}


@pytest.mark.parametrize("cells,message", CSV_CASES.values(), ids=CSV_CASES.keys())
def test_a_bad_measured_row_is_one_line_naming_the_row(scratch, capsys, cells, message):
    refused(main, ["compare", "--measured", _results(**cells), "--out", "dir"], capsys, scratch, message)


# --- schedule CSVs that exhausted memory ----------------------------------------------------------------------------
SCHEDULE_CASES = {
    "stage_99999999999": ("99999999999F0", "cannot read torch action '99999999999F0'"),
    "stage_999999999": ("999999999F0,999999999B0", "stage 0 never computes"),
    "microbatch_999999999": ("0F999999999,0B999999999", "cannot run micro-batches 0 to 999999999"),
    "digits_past_the_int_limit": ("0F" + "9" * 5000, "cannot read torch action"),
}


@pytest.mark.parametrize("row,message", SCHEDULE_CASES.values(), ids=SCHEDULE_CASES.keys())
def test_a_schedule_csv_naming_a_huge_index_is_refused_at_once(scratch, capsys, row, message):
    refused(main, ["predict", "--schedule", _write("huge.csv", row + "\n")], capsys, scratch, message)


# --- partial output: several outputs of one command are all or none -----------------------------------------------
PARTIAL_CASES = {
    "predict_trace_then_plot_in_a_missing_folder": ["predict", *SMALL, "--trace", "t.json", "--plot", "nope/g.png"],
    "predict_trace_then_plot_a_directory": ["predict", *SMALL, "--trace", "t.json", "--plot", "dir"],
    "compare_out_where_a_plot_name_is_a_directory": ["compare", "--measured", "results.csv", "--out", "out"],
}


@pytest.mark.parametrize("argv", PARTIAL_CASES.values(), ids=PARTIAL_CASES.keys())
def test_a_command_whose_last_output_fails_leaves_none_of_them(scratch, capsys, argv):
    (scratch / "out").mkdir()
    (scratch / "out" / "results-speedups.png").mkdir()  # the second of compare's two plots
    refused(main, argv, capsys, scratch)
    assert not (scratch / "t.json").exists() and not (scratch / "out" / "results-step-times.png").exists()


def test_compare_writes_both_plots_when_it_can(scratch, capsys):
    status, out, _ = run(main, ["compare", "--measured", "results.csv", "--out", "dir"], capsys)
    assert status == 0 and "plots: " in out
    assert sorted(p.name for p in (scratch / "dir").iterdir()) == ["results-speedups.png", "results-step-times.png"]


@pytest.mark.parametrize("out", [None, "new/deeper"])
def test_compare_writes_its_plots_to_the_current_folder_or_out_made_if_missing_never_beside_the_csv(scratch, capsys,
                                                                                                    out):
    (scratch / "data").mkdir()
    shutil.copy(scratch / "results.csv", scratch / "data" / "results.csv")
    status, printed, _ = run(main, ["compare", "--measured", "data/results.csv", *(["--out", out] if out else [])],
                             capsys)
    folder = scratch / (out or "")
    assert status == 0 and f"plots: {Path(out or '') / 'results-step-times.png'}" in printed
    assert (folder / "results-step-times.png").exists() and (folder / "results-speedups.png").exists()
    assert sorted(p.name for p in (scratch / "data").iterdir()) == ["results.csv"]


# --- silent nonsense: accepted without a word, exit 0 ---------------------------------------------------------------
SILENT_CASES = {
    "sweep_microbatches_only_commas": (["sweep", "--microbatches", ",,,"], "--microbatches: expected whole numbers"),
    "sweep_microbatches_an_empty_item": (["sweep", "--microbatches", "4,,8"], "expected whole numbers separated"),
    "sweep_microbatches_empty": (["sweep", "--microbatches", ""], "expected whole numbers separated"),
    "predict_balance_a_comma": (["predict", "--balance", ","], "--balance: expected whole numbers separated"),
    "predict_balance_empty": (["predict", "--balance", ""], "--balance: expected whole numbers"),
    "predict_trace_empty": (["predict", "--trace", ""], "--trace: expected a file name, got an empty string"),
    "predict_plot_empty": (["predict", "--plot", ""], "--plot: expected a file name"),
    "predict_model_empty": (["predict", "--model", ""], "--model: expected a file name"),
    "predict_profile_empty": (["predict", "--profile", ""], "--profile: expected a file name"),
    "plan_trace_empty": (["plan", "--trace", ""], "--trace: expected a file name"),
    "compare_out_empty": (["compare", "--measured", "results.csv", "--out", ""], "--out: expected a file name"),
    "compare_measured_empty": (["compare", "--measured", ""], "--measured: expected a file name"),
    "model_count_16_point_7": (lambda: ["predict", "--model", _model(_mlp(count=16.7))],
                               "layers[0].count must be a whole number, got 16.7"),
    "model_count_2_point_0": (lambda: ["predict", "--model", _model(_mlp(count=2.0))], "count must be a whole number"),
    "model_hidden_true": (lambda: ["predict", "--model", _model(_mlp(hidden=True))],
                          "layers[0].hidden must be a whole number, got True"),
    "model_tokens_a_string": (lambda: ["predict", "--model", _model({**_mlp(), "tokens": "64"})],
                              "tokens must be a whole number, got '64'"),
    "model_dtype_bytes_false": (lambda: ["predict", "--model", _model(_mlp(dtype_bytes=False))], "dtype_bytes"),
    "model_count_zero": (lambda: ["predict", "--model", _model(_mlp(count=0))], "count must be at least 1"),
    "an_unknown_argument_holding_a_carriage_return": (["predict", "--nope", "x\ry"], "--nope x\\ry"),
    "a_file_name_holding_a_newline": (["predict", "--profile", "no\nsuch.json"], "profile no\\nsuch.json"),
}


@pytest.mark.parametrize("argv,message", SILENT_CASES.values(), ids=SILENT_CASES.keys())
def test_nonsense_once_accepted_silently_is_refused(scratch, capsys, argv, message):
    refused(main, argv() if callable(argv) else argv, capsys, scratch, message)


def test_the_good_files_of_these_cases_run(scratch, capsys):
    """The scratch folder's model, profile and schedule are good: the cases above fail for what they change."""
    status, out, err = run(main, ["predict", "--gpus", "2", "--microbatches", "2", "--model", "model.json",
                                  "--profile", "profile.json", "--schedule", "s.csv", "--json"], capsys)
    assert status == 0, err
    assert json.loads(out)["step_time_s"] > 0


# --- found by the argument-list fuzzing (test_hostile_properties.py) -------------------------------------------------
@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_every_runtime_plots_its_timeline(scratch, capsys, runtime):
    """torch's runtime adds ops of its own, labelled by name: the Gantt chart labelled every op by micro-batch."""
    gpus = ["--gpus", "1", "--microbatches", "1"] if runtime == "graphs-step" else SMALL[:2]
    status, _, err = run(main, ["predict", *gpus, "--runtime", runtime, "--plot", "g.png"], capsys)
    assert status == 0, err
    assert (scratch / "g.png").read_bytes()[:4] == b"\x89PNG"
