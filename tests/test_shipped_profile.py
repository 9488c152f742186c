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


def same_up_to_rounding(made, committed) -> bool:
    """Equal JSON but for floats' last digits: a least-squares fit's result differs in them between BLAS kernels
    (numpy picks one by processor; OPENBLAS_CORETYPE, set on some machines, picks another)."""
    if isinstance(made, dict) and isinstance(committed, dict):
        return made.keys() == committed.keys() and all(same_up_to_rounding(made[k], committed[k]) for k in made)
    if isinstance(made, list) and isinstance(committed, list):
        return len(made) == len(committed) and all(map(same_up_to_rounding, made, committed))
    if isinstance(made, float) and isinstance(committed, float):
        return made == pytest.approx(committed, rel=1e-9, abs=1e-300)
    return made == committed


def test_same_up_to_rounding_tells_a_changed_figure_from_a_rounding():
    assert same_up_to_rounding({"a": [1.0000000000001, "x"]}, {"a": [1.0, "x"]})
    assert not same_up_to_rounding({"a": [1.001, "x"]}, {"a": [1.0, "x"]})
    assert not same_up_to_rounding({"a": 1.0, "b": 2}, {"a": 1.0})


def test_the_refit_profile_is_what_refit_stages_makes_of_its_calibration(tmp_path):
    _script("refit_stages").refit(FINAL / "profile.json", tmp_path / "p.json", FINAL / "profile.samples.json")
    assert same_up_to_rounding(json.loads((tmp_path / "p.json").read_text()),
                               json.loads((FINAL / "profile-refit.json").read_text()))


def test_the_releveled_profile_is_the_refit_one_with_the_gradient_add_measured_on_2026_11_25(tmp_path):
    """host.grad_add_s: the median of three H200 calibrations (data/validation/h200-2026-11-25-gradadd/), carried."""
    _script("relevel_host").relevel(FINAL / "profile-refit.json", tmp_path / "p.json", FINAL / "profile.samples.json",
                                    4.27e-5)
    made = json.loads((tmp_path / "p.json").read_text())
    committed = json.loads((FINAL / "profile-gradadd.json").read_text())
    made["meta"].pop("host_level"), committed["meta"].pop("host_level")  # it names its samples' path
    assert same_up_to_rounding(made, committed) and "host.grad_add_s" in committed["meta"]["carried_from_base"]


def test_the_shipped_profile_is_what_compose_profile_makes_of_its_five_sources(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the command it records names its inputs from the repository's root
    _script("compose_profile").compose(Path("data/validation/h200-2026-11-24-final/profile-gradadd.json"),
                                       Path("data/calibration/h200x2-2026-11-23-shipped.json"),
                                       Path("data/interfaces/h200-2026-11-24-1/profile.json"),
                                       Path("data/calibration/h200-2026-11-24-resident/profile.json"),
                                       Path("data/tensor-parallel/nvidia-h200-x2-2026-11-28-b/profile.json"),
                                       tmp_path / "p.json")
    made = json.loads((tmp_path / "p.json").read_text())
    shipped = json.loads((ROOT / "parsim/profiles/default.json").read_text())
    made["meta"].pop("composed"), shipped["meta"].pop("composed")  # it names its output's path
    assert same_up_to_rounding(made, shipped)
