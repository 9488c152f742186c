"""parsim is the half that runs anywhere: no module of it imports torch (only `torch:` schedules do, lazily)."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import pkgutil, importlib, sys
import parsim
for m in pkgutil.walk_packages(parsim.__path__, "parsim."):
    if not m.name.endswith("__main__"):
        importlib.import_module(m.name)
from parsim.cli import main
main(["predict", "--schedule", "1f1b", "--gpus", "4", "--json"])
assert "torch" not in sys.modules, "parsim imported torch"
"""


def test_no_parsim_module_nor_a_prediction_imports_torch():
    r = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


WITHOUT_TORCH = """
import contextlib, io, json, runpy, sys
sys.modules["torch"] = None  # as if torch were not installed: `import torch` raises ModuleNotFoundError
answers = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    sys.argv = ["hw", *argv]
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
        try:
            runpy.run_module("hw", run_name="__main__", alter_sys=True)
            status = 0
        except SystemExit as e:
            status = e.code
    answers.append([argv, status, err.getvalue()])
print(json.dumps(answers))
"""


def test_every_hw_command_without_torch_names_the_extra_in_one_line_and_exits_2():
    import json

    from hw.__main__ import COMMANDS

    argvs = [[], ["--help"], ["bogus"], *([name] for name in COMMANDS), *([name, "--help"] for name in COMMANDS),
             ["calibrate", "--cpu", "--out", "never-written.json"]]
    r = subprocess.run([sys.executable, "-c", WITHOUT_TORCH, json.dumps(argvs)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    for argv, status, text in json.loads(r.stdout):
        assert status == 2 and text.count("\n") == 1 and 'pip install ".[hw]"' in text, (argv, text)
