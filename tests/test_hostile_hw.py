"""Issue 17's hostile inputs to `python -m hw ... --cpu`: refused with one line and exit 2 before any process is
spawned or anything calibrated, and nothing written (run in this process: each is refused in well under a second)."""

from __future__ import annotations

import json

import pytest
from clirun import refused

pytest.importorskip("torch")

from hw.__main__ import main  # noqa: E402
from parsim.profile import load_profile  # noqa: E402

TINY = ["--cpu", "--gpus", "2", "--layers", "2", "--hidden", "16", "--tokens", "8", "--microbatches", "2"]
GRID = ["--cpu", "--gpus", "2", "--schedules", "1f1b", "--microbatches", "2", "--models", "2x16x8"]


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """The current folder, with a good profile, a profile whose meta is wrong, a binary file and a folder."""
    monkeypatch.chdir(tmp_path)
    doc = load_profile().to_json()
    (tmp_path / "profile.json").write_text(json.dumps(doc))
    (tmp_path / "meta.json").write_text(json.dumps({**doc, "meta": {**doc["meta"], "carried_from_base": 3}}))
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00\x80" * 8)
    (tmp_path / "dir").mkdir()
    return tmp_path


CASES = {
    # every command that starts CPU ranks: at most CPU_RANKS of them (issue 49: 37 on 2 cores, then a traceback)
    "measure_cpu_ranks_past_the_bound": (["measure", "--cpu", "--gpus", "64", "--layers", "64", "--hidden", "8",
                                          "--tokens", "64", "--microbatches", "1"], "--cpu runs at most 16"),
    "validate_cpu_ranks_past_the_bound": (["validate", "--cpu", "--gpus", "1,17", "--schedules", "gpipe",
                                           "--microbatches", "2", "--models", "34x16x64"], "--cpu runs at most 16"),
    "calibrate_cpu_ranks_past_the_bound": (["calibrate", "--cpu", "--gpus", "17", "--out", "p.json"],
                                           "--cpu runs at most 16"),
    # steps of one job: bounded before any rank starts (issue 49)
    "measure_steps_past_the_bound": (["measure", "--steps", "100000"], "--steps: must be at most 10,000"),
    "validate_warmup_past_the_bound": (["validate", "--cpu", "--warmup", "20000", "--out", "v"],
                                       "--warmup: must be at most 10,000"),
    # recomputation: a mode hw knows, a schedule and runtime that can run it (issue 44)
    "measure_recompute_unknown": (["measure", "--cpu", "--recompute", "sometimes"], "invalid choice: 'sometimes'"),
    "measure_recompute_split_backward": (["measure", "--cpu", "--gpus", "2", "--schedule", "zb-h1", "--recompute",
                                          "always"], "splits its backward"),
    "measure_recompute_torch": (["measure", "--cpu", "--gpus", "2", "--runtime", "torch", "--recompute", "always"],
                                "--recompute runs on hw's runner only"),
    "validate_recompute_unknown": (["validate", "--cpu", "--recompute", "never,some", "--out", "v"],
                                   "unknown recompute mode(s) some"),
    # an empty list is refused, not read as "the default grid" (a script's empty $MODELS ran the MLP stacks instead)
    "validate_models_empty": (["validate", "--cpu", "--models", "", "--out", "v"], "--models names none"),
    # hw measure
    "measure_trace_is_a_directory": (["measure", *TINY, "--trace", "dir"], "--trace dir: it is a folder"),
    "measure_trace_in_a_missing_folder": (["measure", *TINY, "--trace", "nope/t.json"], "folder nope does not exist"),
    "measure_trace_of_rank_1_name_too_long": (["measure", *TINY, "--trace", "t" * 249 + ".json"],
                                              "bytes long, past the 255"),
    "measure_trace_empty": (["measure", *TINY, "--trace", ""], "--trace: expected a file name"),
    "measure_copy_streams_on_the_cpu": (["measure", *TINY, "--copy-streams"], "--copy-streams posts messages on a "
                                                                               "dedicated CUDA stream: GPU only"),
    "measure_profile_missing_without_partition_time": (["measure", *TINY, "--profile", "nope.json"],
                                                       "cannot read profile nope.json"),
    "measure_profile_binary": (["measure", *TINY, "--profile", "bin.json"], "is not UTF-8 text"),
    "measure_model_file_binary": (["measure", "--cpu", "--gpus", "2", "--model", "bin.json"], "is not UTF-8 text"),
    "measure_model_dev_zero": (["measure", "--cpu", "--gpus", "2", "--model", "/dev/zero"], "character device"),
    "measure_schedule_csv_a_device": (["measure", *TINY, "--schedule", "/dev/zero.csv"], "cannot read schedule"),
    "measure_schedule_csv_stage_99999999999": (lambda root: (root / "s.csv").write_text("99999999999F0\n") and [
        "measure", *TINY, "--schedule", "s.csv"], "cannot read torch action '99999999999F0'"),
    "measure_timeout_nan": (["measure", *TINY, "--timeout", "nan"], "--timeout: must be a finite number above 0"),
    "measure_timeout_inf": (["measure", *TINY, "--timeout", "inf"], "--timeout: must be a finite number"),
    "measure_timeout_1e400": (["measure", *TINY, "--timeout", "1e400"], "--timeout: must be a finite number"),
    "measure_timeout_zero": (["measure", *TINY, "--timeout", "0"], "--timeout: must be a finite number above 0"),
    "measure_steps_zero": (["measure", *TINY, "--steps", "0"], "--steps: must be at least 1"),
    "measure_warmup_negative": (["measure", *TINY, "--warmup", "-1"], "--warmup: must be at least 0"),
    "measure_gpus_of_400_digits": (["measure", "--cpu", "--gpus", "9" * 400], "--gpus: must be at most"),
    "measure_microbatches_10_to_the_400": (["measure", "--cpu", "--microbatches", "1" + "0" * 400],
                                           "--microbatches: must be at most"),
    "measure_hidden_of_90_digits": (["measure", "--cpu", "--hidden", "1" + "0" * 90], "--hidden: must be at most"),
    "measure_balance_a_comma": (["measure", *TINY, "--balance", ","], "--balance: expected whole numbers"),
    # hw calibrate
    "calibrate_out_is_a_directory_with_force": (["calibrate", "--cpu", "--out", "dir", "--force"],
                                                "--out dir: it is a folder"),
    "calibrate_out_in_a_missing_folder": (["calibrate", "--cpu", "--out", "nope/p.json"], "folder nope does not exist"),
    "calibrate_samples_name_too_long": (["calibrate", "--cpu", "--out", "p" * 245 + ".json"],
                                        "the samples beside --out"),
    "calibrate_out_empty": (["calibrate", "--cpu", "--out", ""], "--out: expected a file name"),
    "calibrate_base_binary": (["calibrate", "--cpu", "--out", "new.json", "--base", "bin.json"],
                              "profile bin.json is not UTF-8 text"),
    "calibrate_base_a_device": (["calibrate", "--cpu", "--out", "new.json", "--base", "/dev/zero"], "character device"),
    "calibrate_hidden_a_comma": (["calibrate", "--cpu", "--hidden", ","], "--hidden: expected whole numbers"),
    "calibrate_hidden_nan": (["calibrate", "--cpu", "--hidden", "nan"], "--hidden: expected a whole number"),
    "calibrate_hidden_zero": (["calibrate", "--cpu", "--hidden", "0,64"], "--hidden: must be at least 1"),
    "calibrate_gpus_zero": (["calibrate", "--cpu", "--gpus", "0"], "--gpus: must be at least 1"),
    # hw validate
    "validate_out_is_a_regular_file": (["validate", *GRID, "--profile", "profile.json", "--out", "profile.json"],
                                       "--out profile.json exists and is not a folder"),
    "validate_out_in_a_missing_folder": (["validate", *GRID, "--profile", "profile.json", "--out", "nope/v"],
                                         "folder nope does not exist"),
    "validate_out_results_csv_is_a_directory": (lambda root: (root / "v" / "results.csv").mkdir(parents=True) or [
        "validate", *GRID, "--profile", "profile.json", "--out", "v"], "v/results.csv: it is a folder"),
    "validate_profile_meta_carried_from_base_a_number": (["validate", *GRID, "--profile", "meta.json", "--out", "v"],
                                                         "carried_from_base must be a list of names"),
    "validate_profile_binary": (["validate", *GRID, "--profile", "bin.json", "--out", "v"], "is not UTF-8 text"),
    "validate_gpus_a_comma": (["validate", "--cpu", "--gpus", ",", "--out", "v"], "--gpus: expected whole numbers"),
    "validate_microbatches_empty_item": (["validate", "--cpu", "--microbatches", "1,,2"], "--microbatches: expected"),
    "validate_data_parallel_zero": (["validate", "--cpu", "--data-parallel", "0"],
                                    "--data-parallel: must be at least 1"),
    "validate_gpus_of_400_digits": (["validate", "--cpu", "--gpus", "9" * 400], "--gpus: must be at most"),
    "validate_steps_zero": (["validate", *GRID, "--steps", "0"], "--steps: must be at least 1"),
    "validate_timeout_nan": (["validate", *GRID, "--timeout", "nan"], "--timeout: must be a finite number"),
    "validate_out_empty": (["validate", *GRID, "--out", ""], "--out: expected a file name"),
    "validate_grid_that_cannot_run_leaves_no_out_folder": (
        ["validate", *GRID[:-1], "2x16x7", "--profile", "profile.json", "--out", "v"], "no point of the grid can run"),
    # hw scenario
    "scenario_cpu_with_a_missing_profile": (["scenario", "async", "--cpu", "--profile", "nope.json"],
                                            "--profile is for the prediction shown beside a full-size run"),
    "scenario_missing_profile": (["scenario", "async", "--profile", "nope.json"], "cannot read profile nope.json"),
    "scenario_profile_binary": (["scenario", "overlap", "--profile", "bin.json"], "is not UTF-8 text"),
    "scenario_out_is_a_directory": (["scenario", "async", "--cpu", "--out", "dir"], "--out dir: it is a folder"),
    "scenario_out_in_a_missing_folder": (["scenario", "async", "--cpu", "--out", "nope/x.json"], "does not exist"),
    "scenario_out_empty": (["scenario", "async", "--cpu", "--out", ""], "--out: expected a file name"),
}


@pytest.mark.parametrize("argv,message", CASES.values(), ids=CASES.keys())
def test_hostile_hw_input_is_refused_before_any_work(scratch, capsys, argv, message):
    argv = argv(scratch) if callable(argv) else argv
    refused(main, argv, capsys, scratch, message)
    assert not (scratch / "dir.samples.json").exists() and not (scratch / "nope").exists()


def test_validate_keeps_an_earlier_runs_results_unless_forced(scratch, capsys):
    """hw validate wrote over an --out folder's results.csv without a word (issue 49): nothing a user had is lost."""
    (scratch / "grid").mkdir()
    (scratch / "grid" / "results.csv").write_text("mine")
    refused(main, ["validate", *GRID, "--out", "grid"], capsys, scratch, "holds an earlier run's results.csv; pass "
                                                                       "--force")
    assert (scratch / "grid" / "results.csv").read_text() == "mine"


def testcpu_defaults_are_tiny_as_cpus_help_says(scratch, monkeypatch):
    """`hw measure --cpu` and `hw validate --cpu` with their default models were refused as too large for the CPU
    (issue 49): with --cpu and no model given, both run a tiny one, and pass the CPU's size check."""
    from hw.__main__ import parser_for
    from hw.measure import command as measure_command
    from hw.measure import validate

    args = parser_for("measure")[0].parse_args(["measure", "--cpu"])
    measure_command.cpu_defaults(args)
    assert (args.layers, args.hidden, args.tokens) == measure_command.CPU_MODEL
    args = parser_for("measure")[0].parse_args(["measure", "--cpu", "--hidden", "32"])  # a model flag: the user's
    measure_command.cpu_defaults(args)
    assert (args.layers, args.hidden, args.tokens) == (None, 32, None)
    seen = {}
    monkeypatch.setattr(validate, "_validate", lambda args, out, given, models, runtimes, grid, *_: seen.update(
        models=[m.name for m in models], points=sum(len(turns) for _, turns in grid)) or 0)
    assert main(["validate", "--cpu", "--out", "v"]) == 0  # past the CPU's size check, which refused the defaults
    assert seen["models"] == ["4 x mlp(h=64), 256 tokens"] and seen["points"] > 0


@pytest.mark.parametrize("env,message", [
    ({"RANK": "0"}, "RANK is set but WORLD_SIZE is not"),
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE is set but RANK is not"),
    ({"RANK": "abc", "WORLD_SIZE": "2"}, "RANK='abc' in the environment: expected a whole number"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE='0' in the environment"),
    ({"RANK": "3", "WORLD_SIZE": "2"}, "RANK 3 is not below WORLD_SIZE 2"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR is not set"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}, "MASTER_PORT is not set"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "99999"}, "MASTER_PORT='99999'"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500", "LOCAL_RANK": "-1"},
     "LOCAL_RANK='-1'"),
])
@pytest.mark.parametrize("command", [["measure", "--cpu", "--gpus", "2"], ["validate", "--cpu", "--out", "v"]])
def test_a_launchers_partial_or_malformed_environment_is_one_line_naming_the_variable(scratch, capsys, monkeypatch,
                                                                                       env, message, command):
    """What a launcher (torchrun) sets, partly or wrongly (issue 49): refused before any rank starts or waits."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    refused(main, command, capsys, scratch, message)
