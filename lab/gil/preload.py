"""Run a script under an LD_PRELOAD library built from C (lab/gil/gil_locks.py, lab/gil/gil_trace.py)."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path


def preloaded(source: Path, library: Path) -> ctypes.CDLL:
    """`library`, in a process that has it preloaded. In the first process: build it from `source` (where there is
    no C compiler, one built elsewhere must be at `library`), run this script again under it, and exit with its
    status."""
    if library.name in os.environ.get("LD_PRELOAD", ""):
        return ctypes.CDLL(str(library))
    if shutil.which("cc") is not None or not library.exists():
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(library), str(source), "-ldl", "-lpthread"],
                       check=True)
    env = dict(os.environ, LD_PRELOAD=str(library))
    sys.exit(subprocess.run([sys.executable, *sys.argv], env=env).returncode)
