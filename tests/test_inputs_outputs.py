"""The edges every input and output passes (parsim.inputs, parsim.files): regular files only, bounded reads, strict
JSON, outputs checked first and written all or none with the user's umask; and the cases that need a real process
(a FIFO, stdout on /dev/full, the umask)."""

from __future__ import annotations

import gzip
import json
import os
import stat
import subprocess
import sys

import pytest

from parsim.errors import ParsimError
from parsim.files import Outputs, check_output, json_text, nonfinite_to_null, write_atomic
from parsim.inputs import gunzip, json_depth, parse_json, read_bytes, read_text


def _parsim(*argv: str, cwd=None, stdout=subprocess.PIPE, umask: int | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "parsim", *argv], stdout=stdout, stderr=subprocess.PIPE, text=True,
                          cwd=cwd, timeout=120, preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)


def _one_line(r: subprocess.CompletedProcess, message: str) -> None:
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr


# --- inputs: regular files only, never blocking (issue 20 lists the FIFO; it is this input layer's) ----------------
FIFO_INPUTS = {
    "model": ["predict", "--model", "FIFO"],
    "profile": ["predict", "--profile", "FIFO"],
    "schedule_csv": ["predict", "--schedule", "FIFO.csv"],
    "measured_csv": ["compare", "--measured", "FIFO"],
    "timeline": ["compare", "--timeline", "FIFO", "--point", "1f1b,2,4,4x64x64"],
}


@pytest.mark.parametrize("argv", FIFO_INPUTS.values(), ids=FIFO_INPUTS.keys())
def test_fifo_as_an_input_is_refused_without_blocking(tmp_path, argv):
    name = next(a for a in argv if a.startswith("FIFO"))
    os.mkfifo(tmp_path / name)  # nobody writes to it: opening it to read would block for ever
    r = _parsim(*argv, cwd=tmp_path)
    _one_line(r, f"{name} is a FIFO, not a regular file")


def test_fifo_as_profile_is_refused_by_the_reader_itself(tmp_path):
    os.mkfifo(tmp_path / "p.json")
    with pytest.raises(ParsimError, match="is a FIFO"):
        read_bytes(tmp_path / "p.json", "profile")


def test_a_file_past_the_size_cap_is_refused_unread(tmp_path):
    path = tmp_path / "big.json"
    path.write_bytes(b" " * 1001)
    with pytest.raises(ParsimError, match="is 1,001 bytes, past the 1,000 parsim reads"):
        read_bytes(path, "profile", limit=1000)
    assert read_bytes(path, "profile", limit=1001) == b" " * 1001


def test_a_gzip_bomb_is_refused_once_it_unpacks_past_the_cap():
    bomb = gzip.compress(b"0" * 10_000)
    with pytest.raises(ParsimError, match="unpacks to more than the 1,000 bytes"):
        gunzip(bomb, "trace t.json.gz", limit=1000)
    assert len(gunzip(bomb, "trace", limit=10_000)) == 10_000


def test_binary_bytes_are_one_error_not_a_unicode_decode_error(tmp_path):
    path = tmp_path / "m.json"
    path.write_bytes(b'{"tokens": \xff}')
    with pytest.raises(ParsimError, match=r"m.json is not UTF-8 text \(byte 0xff at offset 11\)"):
        read_text(path, "model file")


@pytest.mark.parametrize("text,depth", [("[]", 1), ('{"a": [[1], {"b": []}]}', 4), ('["[[[[", "]"]', 1),
                                        ('"\\"[[["', 0), ("[" * 70 + "]" * 70, 70)])
def test_json_depth_is_counted_outside_strings(text, depth):
    assert json_depth(text) == depth


def test_json_nested_past_the_limit_is_refused_before_it_is_parsed():
    with pytest.raises(ParsimError, match="nests 65 levels deep, past the 64"):
        parse_json("[" * 65 + "]" * 65, "doc")
    assert parse_json("[" * 64 + "]" * 64, "doc") is not None


# --- outputs: checked first, atomic, umask, all or none, strict JSON ------------------------------------------------
def test_an_output_onto_a_device_or_fifo_is_refused(tmp_path):
    os.mkfifo(tmp_path / "f")
    with pytest.raises(ParsimError, match="it is a FIFO, not a regular file"):
        check_output(tmp_path / "f", "--trace")
    with pytest.raises(ParsimError, match="it is a character device"):
        check_output("/dev/null", "--trace")


def test_outputs_are_written_together_or_not_at_all(tmp_path):
    with Outputs() as outputs:
        a, b = outputs.add(tmp_path / "a.json", "a"), outputs.add(tmp_path / "b.png", "b")
        outputs.write(a, "{}")
        assert not a.exists()  # nothing in place until every output is written
        outputs.write(b, b"png")
    assert a.read_text() == "{}" and b.read_bytes() == b"png"
    with pytest.raises(RuntimeError), Outputs() as outputs:
        c = outputs.add(tmp_path / "c.json", "c")
        outputs.write(c, "{}")
        outputs.add(tmp_path / "d.json", "d")
        raise RuntimeError("the work failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.png"]  # no c, no temporaries


def test_write_atomic_turns_an_os_error_into_one_parsim_error(tmp_path):
    with pytest.raises(ParsimError, match="cannot write output .*folder .*nope does not exist"):
        write_atomic(tmp_path / "nope" / "x", "x")


def test_json_text_refuses_nan_and_infinity_and_names_where():
    with pytest.raises(ParsimError, match=r"non-finite number at per_gpu.1.busy_s"):
        json_text({"per_gpu": [{"busy_s": 1.0}, {"busy_s": float("nan")}]})
    assert json.loads(json_text({"x": 1.5})) == {"x": 1.5}
    assert nonfinite_to_null({"r2": float("nan"), "xs": [float("inf"), 2.0]}) == {"r2": None, "xs": [None, 2.0]}


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)], ids=["022", "077", "002"])
def test_files_written_respect_the_umask(tmp_path, umask, mode):
    r = _parsim("predict", "--gpus", "2", "--microbatches", "2", "--trace", "t.json", "--plot", "g.png", cwd=tmp_path,
                umask=umask)
    assert r.returncode == 0, r.stderr
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()} == {"t.json": mode, "g.png": mode}


# --- stdout on a full device ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["predict"], ["predict", "--json"], ["sweep", "--gpus", "2", "--microbatches", "2"],
                                  ["scenario", "async"]], ids=["predict", "predict_json", "sweep", "scenario"])
def test_stdout_on_a_full_device_is_one_line_and_exit_2(argv):
    with open("/dev/full", "w") as full:
        r = _parsim(*argv, stdout=full)
    _one_line(r, "cannot write to standard output: No space left on device")


def test_stdout_on_a_full_device_keeps_no_output_file(tmp_path):
    with open("/dev/full", "w") as full:
        r = _parsim("predict", "--trace", "t.json", cwd=tmp_path, stdout=full)
    _one_line(r, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_stdout_closed_is_one_line_and_exit_2(tmp_path):
    """`predict >&-` (issue 49): Python starts with sys.stdout None; it gave an AttributeError traceback."""
    r = subprocess.run([sys.executable, "-m", "parsim", "predict", "--trace", "t.json"], stdout=None,
                       stderr=subprocess.PIPE, text=True, cwd=tmp_path, timeout=120,
                       preexec_fn=lambda: os.close(1))
    _one_line(r, "standard output is closed")
    assert list(tmp_path.iterdir()) == []  # refused before any work
