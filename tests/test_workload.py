"""The workload: layer kinds, the conv net, splits into stages (equal, given, balanced by time) and their costs."""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import replace

import pytest
from conftest import make_profile
from hypothesis import given, settings
from hypothesis import strategies as st

from parsim.errors import ModelError
from parsim.profile import LayerCosts, OpCost
from parsim.workload import (
    Layer,
    Model,
    conv_model,
    layer_times,
    load_model,
    mlp_model,
    model_from_spec,
    model_label,
    model_spec,
    partition,
    partition_by_time,
    partitioned,
    stage_costs,
    stage_layers,
)


def _slowest(gpu: list[float], balance: tuple[int, ...], host: list[float] | None = None, fixed: float = 0.0) -> float:
    """The slowest stage of a split: its GPU time, or the slower of that and its host's (fixed + launches)."""
    bounds = list(itertools.accumulate(balance, initial=0))
    return max(max(sum(gpu[a:b]), fixed + sum(host[a:b])) if host else sum(gpu[a:b])
               for a, b in zip(bounds, bounds[1:]))


def _brute_force(gpu: list[float], stages: int, host: list[float] | None = None, fixed: float = 0.0) -> float:
    """The slowest stage of the best split, over every way to cut the layers."""
    n = len(gpu)
    return min(_slowest(gpu, tuple(b - a for a, b in zip((0, *cuts), (*cuts, n))), host, fixed)
               for cuts in itertools.combinations(range(1, n), stages - 1))


@pytest.mark.parametrize("seed", range(40))
def test_partition_by_time_is_as_good_as_every_split(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 9)
    stages = rng.randint(1, n)
    times = [rng.choice([rng.random(), rng.randint(1, 5), 0.0]) for _ in range(n)]
    balance = partition_by_time(times, stages)
    assert len(balance) == stages and min(balance) >= 1 and sum(balance) == n
    assert _slowest(times, balance) == pytest.approx(_brute_force(times, stages), rel=1e-12, abs=0)


@pytest.mark.parametrize("layers,stages", [(16, 1), (16, 2), (16, 3), (7, 7), (10, 4), (34, 8)])
def test_identical_layers_balance_to_the_equal_split(layers, stages):
    assert partition_by_time([0.37] * layers, stages) == tuple(len(r) for r in partition(layers, stages))


def test_a_slow_first_layer_gets_a_stage_of_its_own():
    assert partition_by_time([10.0, 1, 1, 1, 1, 1, 1, 1], 2) == (1, 7)


def test_balance_decides_the_stages_and_their_costs():
    model = replace(mlp_model(layers=6, hidden=64, tokens=64), balance=(1, 2, 3))
    assert stage_layers(model, 3) == [range(0, 1), range(1, 3), range(3, 6)]
    costs = stage_costs(model, 3, 2, make_profile())  # unit-rate layers: 1e12 FLOP/s, no fixed cost
    per_layer = 16 * 64**2 * 32 / 1e12
    assert [c.forward.gpu_s for c in costs] == pytest.approx([per_layer, 2 * per_layer, 3 * per_layer])
    assert [c.forward.chunks for c in costs] == [1, 2, 3]
    assert [c.stash_bytes for c in costs] == [k * 10 * 64 * 2 * 32 for k in (1, 2, 3)]


@pytest.mark.parametrize("balance,stages,message", [
    ((3, 2), 2, "add up to the model's 6 layers"), ((6, 0), 2, "positive"), ((2, 2, 2), 2, "schedule has 2"),
])
def test_a_bad_balance_is_one_clear_error(balance, stages, message):
    with pytest.raises(ModelError, match=message):
        stage_layers(Model(mlp_model(6, 64, 64).layers, 64, balance), stages)


def _conv_profile(slow: str | None = None):
    """The same rate for every kind, and 10x slower for the profile key `slow` (e.g. one shape of a kind)."""
    def costs(rate: float) -> LayerCosts:
        return LayerCosts(*[OpCost(0.0, 0.0, rate)] * 3)

    keys = ("mlp", "conv", "down") + ((slow,) if slow else ())
    return replace(make_profile(), layers={k: costs(1e11 if k == slow else 1e12) for k in keys})


def test_conv_net_is_resnet34_shaped():
    model = conv_model()
    assert [(layer.kind, layer.hidden, layer.side) for layer in model.layers] == (
        [("conv", 64, 56)] * 3 + [("down", 128, 28)] + [("conv", 128, 28)] * 3 + [("down", 256, 14)]
        + [("conv", 256, 14)] * 5 + [("down", 512, 7)] + [("conv", 512, 7)] * 2)
    assert sum(layer.params for layer in model.layers) == 21_272_448  # ResNet-34's blocks, without stem and head
    assert sum(layer.flops_per_token for layer in model.layers) == pytest.approx(7.09e9, rel=1e-3)
    assert model.tokens == 256 and model.sample == "image"
    assert [layer.cost_key for layer in model.layers[2:5]] == ["conv@64x56", "down@128x28", "conv@128x28"]


def test_balance_by_time_follows_the_profile():
    model = conv_model(images=8, widths=(8, 16), blocks=(2, 2), side=8)  # conv@8x8 x2, down@16x4, conv@16x4
    # at one rate, time goes with FLOPs: 18 x 8^2 x 8^2 MACs per conv block, 14 x 16^2 x 4^2 (0.78 of it) for down
    assert partitioned(model, "time", 2, 1, _conv_profile()).balance == (2, 2)
    times = layer_times(model, 8, _conv_profile("conv@8x8"))  # the shape's own costs come before its kind's
    assert times[0].gpu_s == times[1].gpu_s == pytest.approx(10 * times[3].gpu_s)
    assert partitioned(model, "time", 2, 1, _conv_profile("conv@8x8")).balance == (1, 3)


def test_layer_time_holds_its_kernels_and_their_launches():
    profile = replace(make_profile(), layers={"mlp": LayerCosts(*[OpCost(1e-3, 0.0, 1e12)] * 3)})
    big = 10**6
    times = layer_times(mlp_model(2, 64, big), big, profile)
    assert times[0] == (pytest.approx(3 * 16 * 64**2 * big / 1e12), 3e-3)


@pytest.mark.parametrize("seed", range(30))
def test_partition_by_time_with_host_costs_is_as_good_as_every_split(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 8)
    stages = rng.randint(1, n)
    gpu, host = ([rng.choice([rng.random(), rng.randint(1, 5), 0.0]) for _ in range(n)] for _ in range(2))
    fixed = rng.choice([0.0, 1.0])
    balance = partition_by_time(gpu, stages, host, fixed)
    assert _slowest(gpu, balance, host, fixed) == pytest.approx(_brute_force(gpu, stages, host, fixed), rel=1e-12, abs=0)


def _scan_every_cut(gpu: list[float], stages: int, host: list[float] | None, fixed: float) -> tuple[int, ...]:
    """partition_by_time's dynamic programme with every cut tried at each step (its first form, O(stages x n^2))."""
    from parsim.workload.partition import prefix_sums

    n, inf = len(gpu), float("inf")
    g, h = prefix_sums(gpu), prefix_sums(host) if host is not None else None
    def time(a, b):
        return g[b] - g[a] if h is None else max(g[b] - g[a], fixed + h[b] - h[a])
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, n - (stages - k) + 1):
            for j in range(k - 1, i):
                slowest = max(best[k - 1][j], time(j, i))
                if slowest < best[k][i]:
                    best[k][i], cut[k][i] = slowest, j
    equal = partition(n, stages)
    if max(time(r.start, r.stop) for r in equal) <= best[stages][n] * (1 + 1e-12):
        return tuple(len(r) for r in equal)
    balance, i = [], n
    for k in range(stages, 0, -1):
        balance.append(i - cut[k][i])
        i = cut[k][i]
    return tuple(reversed(balance))


_TIMES = st.one_of(st.floats(0, 1), st.integers(0, 3).map(float), st.sampled_from([0.0, 0.1, 0.2, 0.3, 1e-9]))


@settings(max_examples=300, deadline=None)
@given(gpu=st.lists(_TIMES, min_size=1, max_size=40), data=st.data())
def test_partition_by_time_bisects_to_the_cut_a_scan_of_every_cut_finds(gpu, data):
    """The same balance, ties and zeros included (where several cuts give the slowest stage, the first)."""
    stages = data.draw(st.integers(1, len(gpu)))
    host = data.draw(st.none() | st.lists(_TIMES, min_size=len(gpu), max_size=len(gpu)))
    fixed = data.draw(st.sampled_from([0.0, 0.25, 1.0])) if host is not None else 0.0
    assert partition_by_time(gpu, stages, host, fixed) == _scan_every_cut(gpu, stages, host, fixed)


def test_a_host_bound_stage_is_not_given_more_layers_for_its_light_kernels():
    # layers 2-3 have light kernels but cost the host as much as layers 0-1 cost the GPU
    gpu, host = [4.0, 4.0, 0.5, 0.5], [1.0, 1.0, 4.0, 4.0]
    assert partition_by_time([max(g, h) for g, h in zip(gpu, host)], 2) == (2, 2)
    assert partition_by_time(gpu, 2) == (1, 3)  # by GPU time alone: a stage of 3 layers doing 9 s of launching
    assert partition_by_time(gpu, 2, host) == (2, 2)


def test_a_profile_without_conv_costs_says_to_calibrate_them():
    with pytest.raises(ModelError, match=r"no costs for layer kind 'conv' \(conv@64x56\).*hw calibrate --conv"):
        stage_costs(conv_model(), 2, 4, make_profile())


def test_layers_must_chain():
    with pytest.raises(ModelError, match=r"layer 1 \(down@16x4\) takes 8x8x8 per sample but layer 0 \(conv@4x8\) "
                                         r"gives 4x8x8"):
        Model((Layer("conv", 4, side=8), Layer("down", 16, side=4)), 8)


@pytest.mark.parametrize("kind,hidden,side,message", [
    ("lstm", 8, 1, "unknown layer kind 'lstm'"), ("down", 7, 2, "divisible by 2"), ("mlp", 8, 2, "no side"),
    ("conv", 0, 2, ">= 1"),
])
def test_bad_layers_are_refused(kind, hidden, side, message):
    with pytest.raises(ModelError, match=message):
        Layer(kind, hidden, side=side)


def test_conv_model_file_loads_with_images(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"images": 32, "layers": [{"kind": "conv", "hidden": 16, "side": 8, "count": 2},
                                                          {"kind": "down", "hidden": 32, "side": 4}]}))
    model = load_model(path)
    assert [layer.cost_key for layer in model.layers] == ["conv@16x8", "conv@16x8", "down@32x4"]
    assert model.tokens == 32 and model.name == "3 x conv+down(C=16/32, S=8/4), 32 images"


@pytest.mark.parametrize("text,model,spec", [
    ("16x2048x8192", mlp_model(16, 2048, 8192), "16x2048x8192"),
    (" 8X256X1024 ", mlp_model(8, 256, 1024), "8x256x1024"),
    ("conv:256", conv_model(256), "conv:256"),
    ("conv:256:64-128-256-512:3-4-6-3:56", conv_model(256), "conv:256"),
    ("conv:8:4-8:1-2:8", conv_model(8, (4, 8), (1, 2), 8), "conv:8:4-8:1-2:8"),
    ("conv:4:8:2:4", conv_model(4, (8,), (2,), 4), "conv:4:8:2:4"),
])
def test_model_spec_names_the_model_and_round_trips(text, model, spec):
    assert model_from_spec(text) == model
    assert model_spec(model) == spec and model_from_spec(spec) == model


@pytest.mark.parametrize("text,message", [
    ("16x2048", "expected LAYERSxHIDDENxTOKENS .*, conv:IMAGES .* or conv:IMAGES:WIDTHS:BLOCKS:SIDE"),
    ("mlp", "expected LAYERSxHIDDENxTOKENS"), ("conv:", "expected LAYERSxHIDDENxTOKENS"),
    ("conv:8:4-8:1-2", "expected LAYERSxHIDDENxTOKENS"), ("conv:8:4-x:1-2:8", "expected LAYERSxHIDDENxTOKENS"),
    ("0x16x8", "'0x16x8': --layers must be at least 1"), ("conv:0", "--images must be at least 1"),
    ("conv:8:4-8:1:8", "a width and at least one block per group"), ("conv:8:4-8:1-2:7", "side 7 cannot halve"),
])
def test_bad_model_spec_is_one_message_naming_the_forms(text, message):
    with pytest.raises(ModelError, match=message):
        model_from_spec(text)


def test_a_model_no_spec_names_says_so():
    fp32 = Model((Layer("mlp", 16, dtype_bytes=4),) * 2, 8)  # specs name bf16 models
    with pytest.raises(ModelError, match="has no model spec"):
        model_spec(fp32)


def test_model_label_keeps_the_mlp_name_of_old_tables_and_names_a_conv_net_in_full():
    assert model_label(mlp_model(16, 2048, 8192)) == "16x h=2048, 8192 tokens"
    assert model_label(conv_model(8, (4, 8), (1, 2), 8)) == "3 x conv+down(C=4/8, S=8/4), 8 images"
