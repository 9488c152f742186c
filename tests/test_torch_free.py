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
