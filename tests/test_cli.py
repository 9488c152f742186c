"""`python -m parsim`: the commands a user types, their outputs and their errors."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from parsim.cli import main
from parsim.profile import load_profile


def test_predict_json_has_the_documented_keys(capsys):
    assert main(["predict", "--schedule", "1f1b", "--gpus", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"step_time_s", "speedup", "bubble_fraction", "per_gpu"} <= out.keys()
    assert len(out["per_gpu"]) == 4
    assert all({"busy_s", "peak_activation_bytes"} <= g.keys() for g in out["per_gpu"])
    assert 0 < out["bubble_fraction"] < 1 and out["step_time_s"] > 0


def test_predict_table_names_the_profile_it_used(capsys):
    assert main(["predict"]) == 0
    out = capsys.readouterr().out
    assert "step time" in out and "speedup" in out and "profile" in out and "H200" in out


def test_trace_is_chrome_trace_json_with_a_track_per_stream_and_link(tmp_path, capsys):
    path = tmp_path / "t.json"
    assert main(["predict", "--gpus", "2", "--microbatches", "2", "--trace", str(path)]) == 0
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    bookkeeping = {"host0 bookkeeping", "host1 bookkeeping"} if load_profile().host.step_s else set()  # per step
    assert names == {"host0", "host1", "gpu0 compute", "gpu1 compute", "link 0->1", "link 1->0"} | bookkeeping
    spans = [e for e in events if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    assert {e["name"] for e in spans} >= {"F(s0,m0)", "B(s1,m1)", "SEND_F(s0,m0)->RECV_F(s1,m0)"}


def test_plot_writes_a_png(tmp_path, capsys):
    path = tmp_path / "g.png"
    assert main(["predict", "--gpus", "2", "--microbatches", "4", "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_prints_a_row_per_schedule_and_count(capsys):
    assert main(["sweep", "--gpus", "2", "--microbatches", "1,4", "--layers", "4"]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()[2:]]
    assert rows == ["gpipe", "gpipe", "1f1b", "1f1b"]


@pytest.mark.parametrize("argv,message", [
    (["predict", "--schedule", "nope"], "unknown schedule 'nope'"),
    (["predict", "--microbatches", "0"], "must be at least 1"),
    (["predict", "--gpus", "-2"], "must be at least 1"),
    (["predict", "--gpus", "32"], "cannot split 16 layers into 32 stages"),
    (["predict", "--microbatches", "3"], "do not split into 3 equal micro-batches"),
    (["predict", "--profile", "/nonexistent.json"], "cannot read profile"),
    (["predict", "--model", "/nonexistent.json"], "cannot read model file"),
    (["sweep", "--schedules", "gpipe,zz"], "unknown schedule"),
    (["predict", "--gpus", "4096", "--microbatches", "4096", "--layers", "4096", "--tokens", "4096"], "past the"),
    (["predict", "--schedule", "1f1b", "--virtual-stages", "2"], "one stage per GPU"),
    (["predict", "--schedule", "interleaved-1f1b", "--microbatches", "6", "--tokens", "6"], "multiple of the GPU count"),
    (["predict", "--gpus", "2", "--balance", "10,5"], "add up to the model's 16 layers"),
    (["predict", "--gpus", "4", "--balance", "8,8"], "gives 2 stages but the schedule has 4"),
    (["predict", "--gpus", "2", "--balance", "8,x"], "expected a whole number"),
    (["predict", "--gpus", "2", "--balance", "8,8", "--partition", "time"], "not both"),
    (["predict", "--partition", "fastest"], "invalid choice"),
    (["predict", "--conv", "--layers", "4"], "--conv takes --images, not --layers"),
    (["predict", "--images", "64"], "--images goes with --conv"),
    (["predict", "--conv", "--images", "100", "--microbatches", "8", "--gpus", "2"], "100 images do not split"),
])
def test_bad_input_gives_one_line_and_exit_2(argv, message):
    result = subprocess.run([sys.executable, "-m", "parsim", *argv], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


@pytest.mark.parametrize("extra,message", [([], "no costs for layer kind 'conv' (conv@64x56)"),
                                           (["--partition", "time"], "calibrate them with `python -m hw calibrate --conv`")])
def test_conv_net_with_a_profile_without_conv_costs_says_what_to_calibrate(tmp_path, extra, message):
    from parsim.profile import load_profile, save_profile

    shipped = load_profile(None)
    path = tmp_path / "mlp-only.json"
    save_profile(replace(shipped, layers={k: v for k, v in shipped.layers.items() if k.startswith("mlp")}), path)
    result = subprocess.run([sys.executable, "-m", "parsim", "predict", "--conv", "--profile", str(path), *extra],
                            capture_output=True, text=True)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and message in lines[0]


def test_a_reader_that_leaves_early_ends_the_command_quietly():
    """`python -m parsim ... | head`: the closed pipe ends the command with no traceback."""
    program = ("import sys\n"
               "from parsim.cli import run_command\n"
               "def flood(args):\n"
               "    while True:\n"
               "        print('x' * 1000)\n"
               "sys.exit(run_command(flood, None))\n")
    proc = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()
    assert proc.wait(timeout=60) == 141
    assert proc.stderr.read() == b""


def test_trace_into_a_missing_folder_is_a_clear_error(tmp_path):
    result = subprocess.run([sys.executable, "-m", "parsim", "predict", "--trace", str(tmp_path / "no" / "t.json")],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "does not exist" in result.stderr and "Traceback" not in result.stderr


def test_model_file_drives_the_prediction(tmp_path, capsys):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"tokens": 1024, "layers": [{"kind": "mlp", "hidden": 512, "count": 6}]}))
    assert main(["predict", "--gpus", "3", "--microbatches", "4", "--model", str(path), "--json"]) == 0
    assert "6 x mlp(h=512), 1024 tokens" in json.loads(capsys.readouterr().out)["model"]


@pytest.mark.parametrize("argv", [["--schedule", "zbv"], ["--schedule", "dualpipev"],
                                  ["--schedule", "looped-bfs", "--virtual-stages", "2"]])
def test_predict_runs_the_v_shaped_and_breadth_first_schedules(argv, capsys):
    assert main(["predict", *argv, "--gpus", "4", "--microbatches", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [g["stages"] for g in out["per_gpu"]][0] == ([0, 7] if argv[1] != "looped-bfs" else [0, 4])
def _conv_profile(tmp_path) -> str:
    """The shipped profile with conv and down costs (the MLP's fitted rates, for the tests' sake)."""
    from parsim.profile import load_profile, save_profile

    shipped = load_profile(None)
    path = tmp_path / "conv-profile.json"
    save_profile(replace(shipped, layers={**shipped.layers, "conv": shipped.layers["mlp"],
                                          "down": shipped.layers["mlp"]}), path)
    return str(path)


def test_conv_net_with_conv_costs_predicts_balanced_by_time(tmp_path, capsys):
    profile = _conv_profile(tmp_path)
    assert main(["predict", "--conv", "--gpus", "2", "--microbatches", "8", "--profile", profile, "--json"]) == 0
    equal = json.loads(capsys.readouterr().out)
    assert main(["predict", "--conv", "--gpus", "2", "--microbatches", "8", "--profile", profile,
                 "--partition", "time", "--json"]) == 0
    balanced = json.loads(capsys.readouterr().out)
    assert equal["model"] == "16 x conv+down(C=64/128/256/512, S=56/28/14/7), 256 images"
    assert balanced["model"].startswith(equal["model"] + ", balance ") and balanced["sample"] == "image"
    assert balanced["step_time_s"] <= equal["step_time_s"]
    assert main(["plan", "--conv", "--gpus", "2", "--profile", profile, "--partition", "time", "--top", "3"]) == 0
    assert "[" in capsys.readouterr().out  # the balances of the ranked configurations


def test_sweep_balances_each_point_for_its_microbatch_size(tmp_path, capsys):
    profile = _conv_profile(tmp_path)
    assert main(["sweep", "--conv", "--gpus", "2", "--microbatches", "1,64", "--schedules", "gpipe",
                 "--profile", profile, "--partition", "time", "--json"]) == 0
    models = [r["model"] for r in json.loads(capsys.readouterr().out)]
    assert len(models) == 2 and all(", balance " in m for m in models)
