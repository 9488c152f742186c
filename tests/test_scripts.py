"""The diagnostic scripts under scripts/ still import: they name hw's and parsim's functions, which move."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPTS_DIR = Path(__file__).parent.parent / "scripts"
SCRIPTS = sorted(SCRIPTS_DIR.glob("*.py"))


def _script(name: str):
    """scripts/NAME.py imported as a module (its main() runs only as __main__)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_each_script_imports(path):
    _script(path.stem)


def test_gil_handoffs_variants_name_a_placement_and_what_a_launch_does_with_memory():
    handoffs = _script("gil_handoffs")
    assert handoffs.variant("free") == ("free", "alloc")
    assert handoffs.variant("spread-out") == ("spread", "out")
    assert handoffs.variant("free-del") == ("free", "del")
    with pytest.raises(SystemExit, match="unknown variant"):
        handoffs.variant("free-leak")


@pytest.mark.parametrize("memory", ["alloc", "out", "keep", "del"])
def test_gil_handoffs_loop_logs_every_launch_of_every_thread_whatever_it_does_with_memory(memory, monkeypatch):
    import torch

    handoffs = _script("gil_handoffs")
    monkeypatch.setattr(handoffs, "WINDOW_S", 0.02)
    monkeypatch.setitem(handoffs.KEPT, "cpu", 50_000)
    run = handoffs.logged_loop(torch.device("cpu"), 2, "free", handoffs.physical_cpus(), memory)
    assert all(n > 0 for n in run["launches"])
    assert [len(log) for log in run["logs"]] == run["launches"]
    assert run["per_launch_s"] > 0
