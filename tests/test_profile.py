"""The profile loader: the shipped profile loads; anything malformed fails with one clear message."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
from conftest import make_profile

from parsim.errors import ProfileError
from parsim.profile import VERSION, from_json, load_profile, save_profile


def _default_doc() -> dict:
    return load_profile().to_json()


def test_shipped_profile_loads_and_names_its_origin():
    profile = load_profile()
    assert profile.gpus_per_node >= 1
    assert "mlp" in profile.layers
    assert "H200" in profile.describe()


def test_save_then_load_round_trips(tmp_path):
    profile = make_profile(latency_s=2e-5, bandwidth_Bps=3e11, action_s=1e-5)
    path = tmp_path / "p.json"
    save_profile(profile, path)
    assert load_profile(path) == profile
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]  # no temporary left behind


def test_a_host_gradient_add_round_trips_and_a_profile_without_one_writes_none():
    profile = make_profile(latency_s=2e-5, bandwidth_Bps=3e11, action_s=1e-5)
    adding = dataclasses.replace(profile, host=dataclasses.replace(profile.host, grad_add_s=4e-5))
    assert from_json(json.loads(json.dumps(adding.to_json()))).host.grad_add_s == 4e-5
    assert "grad_add_s" not in profile.to_json()["host"]  # older profiles' files stay as they were


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(version=VERSION + 1), "schema version"),
    (lambda d: d.pop("version"), "schema version None"),
    (lambda d: d.update(schema="other"), "not a parsim profile"),
    (lambda d: d["links"].pop("nvlink"), r"links.nvlink is missing"),
    (lambda d: d["links"]["nvlink"].update(bandwidth_Bps=-1),
     r"nvlink.bandwidth_Bps must be a finite number from 0.001 to 1e\+40, got -1"),
    (lambda d: d["links"]["nvlink"].update(bandwidth_Bps=0), r"bandwidth_Bps must be a finite number from"),
    (lambda d: d["host"].update(p2p_s="fast"), r"host.p2p_s must be 0 or a finite number"),
    (lambda d: d["host"].update(grad_add_s=-4e-5), r"host.grad_add_s must be 0 or a finite number .* got -4e-05"),
    (lambda d: d["layers"]["mlp"]["forward"].update(fixed_s=float("nan")), r"forward.fixed_s must be"),
    (lambda d: d["layers"]["mlp"].pop("backward_weight"), r"backward_weight is missing"),
    (lambda d: d.update(layers={}), r"layers is empty"),
    (lambda d: d.update(gpus_per_node=0), r"gpus_per_node must be at least 1, got 0"),
])
def test_malformed_profile_fails_with_a_message_naming_the_field(tmp_path, edit, message):
    doc = copy.deepcopy(_default_doc())
    edit(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match=message):
        load_profile(path)


def test_an_allreduce_compute_share_round_trips_is_absent_where_unmeasured_and_stays_within_0_and_1():
    profile = load_profile()
    assert all("compute_share" not in c for c in profile.to_json()["collectives"].values())  # files stay as they were
    spec = dataclasses.replace(profile.collectives["allreduce"], compute_share=0.67)
    sharing = dataclasses.replace(profile, collectives={"allreduce": spec})
    assert from_json(json.loads(json.dumps(sharing.to_json()))).collectives["allreduce"].compute_share == 0.67
    doc = sharing.to_json()
    doc["collectives"]["allreduce"]["compute_share"] = 1.5
    with pytest.raises(ProfileError, match="compute_share"):
        from_json(doc)


def test_truncated_profile_says_it_may_be_truncated(tmp_path):
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(_default_doc())[:200])
    with pytest.raises(ProfileError, match="not valid JSON.*truncated"):
        load_profile(path)


def test_missing_profile_file_is_a_profile_error(tmp_path):
    with pytest.raises(ProfileError, match="cannot read profile"):
        load_profile(tmp_path / "nope.json")


@pytest.mark.parametrize("doc", [None, [], "x", 3, {"schema": "parsim.profile"}])
def test_non_object_documents_are_rejected(doc):
    with pytest.raises(ProfileError):
        from_json(doc)


def test_a_cost_fitted_at_the_layers_hidden_size_wins_over_the_kinds():
    import dataclasses

    from parsim.profile import LayerCosts, OpCost
    from parsim.workload import mlp_model, stage_costs

    slow = OpCost(0.0, 0.0, 1e9)
    base = make_profile()
    profile = dataclasses.replace(base, layers={**base.layers, "mlp@64": LayerCosts(slow, slow, slow)})
    at_64 = stage_costs(mlp_model(2, 64, 64), 1, 1, profile)[0].forward.gpu_s
    at_128 = stage_costs(mlp_model(2, 128, 64), 1, 1, profile)[0].forward.gpu_s
    assert at_64 == pytest.approx(2 * 16 * 64**2 * 64 / 1e9)  # the mlp@64 rate
    assert at_128 == pytest.approx(2 * 16 * 128**2 * 64 / 1e12)  # the generic mlp rate
