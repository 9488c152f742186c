"""The shipped profile is what its recorded commands make of the committed measurements."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")  # refit_stages reads hw's stage corrections

ROOT = Path(__file__).parent.parent
FINAL = ROOT / "data/validation/h200-2026-11-24-final"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_refit_profile_is_what_refit_stages_makes_of_its_calibration(tmp_path):
    _script("refit_stages").refit(FINAL / "profile.json", tmp_path / "p.json", FINAL / "profile.samples.json")
    assert json.loads((tmp_path / "p.json").read_text()) == json.loads((FINAL / "profile-refit.json").read_text())


def test_the_releveled_profile_is_the_refit_one_with_the_gradient_add_measured_on_2026_11_25(tmp_path):
    """host.grad_add_s: the median of three H200 calibrations (data/validation/h200-2026-11-25-gradadd/), carried."""
    _script("relevel_host").relevel(FINAL / "profile-refit.json", tmp_path / "p.json", FINAL / "profile.samples.json",
                                    4.27e-5)
    made = json.loads((tmp_path / "p.json").read_text())
    committed = json.loads((FINAL / "profile-gradadd.json").read_text())
    made["meta"].pop("host_level"), committed["meta"].pop("host_level")  # it names its samples' path
    assert made == committed and "host.grad_add_s" in committed["meta"]["carried_from_base"]


def test_the_shipped_profile_is_what_compose_profile_makes_of_its_four_sources(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the command it records names its inputs from the repository's root
    _script("compose_profile").compose(Path("data/validation/h200-2026-11-24-final/profile-gradadd.json"),
                                       Path("data/calibration/h200x2-2026-11-23-shipped.json"),
                                       Path("data/interfaces/h200-2026-11-24-1/profile.json"),
                                       Path("data/calibration/h200-2026-11-24-resident/profile.json"), tmp_path / "p.json")
    made = json.loads((tmp_path / "p.json").read_text())
    shipped = json.loads((ROOT / "parsim/profiles/default.json").read_text())
    made["meta"].pop("composed"), shipped["meta"].pop("composed")  # it names its output's path
    assert made == shipped
