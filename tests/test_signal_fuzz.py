"""Signals at random times (issue 49): predict, plan and `hw measure --cpu` stopped by SIGINT, SIGTERM or SIGHUP at a
moment hypothesis draws keep the promise: an exit status of 0, 2, 128 + the signal's number (or the signal itself
before the command has started), no traceback, nothing alive 5 s later, no partial file (scripts/signal_fuzz.py,
whose two-minute random run over both CLIs is committed under data/signal-fuzz/)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

_SPEC = importlib.util.spec_from_file_location("scripts_signal_fuzz",
                                               Path(__file__).parent.parent / "scripts" / "signal_fuzz.py")
fuzz = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = fuzz  # as an import does: dataclasses look their module up there
_SPEC.loader.exec_module(fuzz)


@st.composite
def runs(draw):
    """(command, signal, delay): the delay anywhere from the command's start-up to about its end."""
    command = draw(st.sampled_from(["predict", "plan", "hw-measure"]))
    latest = fuzz.LATEST_S.get(command, fuzz.LATEST_DEFAULT_S)
    return command, draw(st.sampled_from(fuzz.SIGNALS)), draw(st.floats(fuzz.EARLIEST_S, latest))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=runs())
def test_a_signal_at_any_moment_keeps_the_promise(run):
    outcome = fuzz.run_once(*run)
    assert outcome.problems == (), outcome


def test_a_partial_output_is_found(tmp_path):
    """The check itself: a temporary file left, a JSON cut short, a PNG without its end."""
    (tmp_path / ".step.json.abc.tmp").write_text("{")
    (tmp_path / "cut.json").write_text('{"a": [1, 2')
    (tmp_path / "cut.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 10)
    (tmp_path / "whole.json").write_text('{"a": 1}')
    found = fuzz.broken_files(tmp_path)
    assert len(found) == 3 and not any("whole.json" in f for f in found)
