"""timm's models as `hw profile timm:NAME` splits them (issue 45): the layers in turn compute the model's own forward;
a tiny one is profiled, predicted, run in hw's pipeline (gradients equal to one device's) and validated; what hw
does not split is refused in one line. timm needs torchvision, and PyPI's fails to import beside torch's CPU build
(CI's; pyproject's `timm` extra): there a stand-in of timm's layout (tests/timm_stand_in.py) is profiled and
predicted end to end, and refused, and the tests of timm's own models skip."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest
from clirun import one_error_line, run
from conftest import assert_same_gradients, one_device_step
from timm_stand_in import installed

from parsim.cli import main as parsim_main
from parsim.runtimes import get_runtime
from parsim.workload import load_model

torch = pytest.importorskip("torch")

from hw.__main__ import main as hw_main  # noqa: E402
from hw.run.ranks import spawn  # noqa: E402
from hw.run.runtimes import gradient_step_worker  # noqa: E402


def _timm():
    """timm, or a skip where it does not import (not installed, or beside a torchvision that does not load)."""
    try:
        import timm
    except (ImportError, RuntimeError, OSError) as e:
        pytest.skip(f"timm does not import here ({e.__class__.__name__}: {str(e).splitlines()[0]})")
    return timm


@pytest.mark.parametrize("name,kwargs,side,first", [
    ("vit_tiny_patch16_224", {"img_size": 32, "num_classes": 10}, 32, ["embed", "blocks.0", "blocks.1"]),
    ("test_vit", {}, 32, ["embed", "blocks.0"]),  # dynamic_img_size: the position table resampled to 2 x 2
    ("test_vit2", {}, 32, ["embed", "blocks.0"]),  # a register token, no class token, average pooling
    ("test_vit3", {"img_size": 32}, 32, ["embed", "blocks.0"]),  # attention pooling, over the prefix token too
    ("resnet18", {"num_classes": 10, "drop_rate": 0.2}, 32, ["stem", "layer1.0", "layer1.1", "layer2.0"]),
    ("test_resnet", {}, 64, ["stem", "layer1.0", "layer2.0"]),  # deep stem, average-pooled downsampling
    ("test_convnext", {}, 32, ["stem", "stages.0.blocks.0", "stages.1.downsample", "stages.1.blocks.0"]),
])
def test_a_timm_model_split_into_layers_computes_what_it_computes_whole(name, kwargs, side, first):
    """Each of the model's parameters in one layer, and the layers in turn give its own output (eval mode: its
    dropout, here resnet18's forward_head's, off in both)."""
    timm = _timm()
    from hw.usermodel.timm_models import timm_named

    torch.manual_seed(0)
    net = timm.create_model(name, pretrained=False, **kwargs)
    named = timm_named(name, net)
    assert [n for n, _ in named][:len(first)] == first and named[-1][0] == "head"
    params = [p for _, layer in named for p in layer.parameters()]
    assert len(params) == len({id(p) for p in params}) and {id(p) for p in params} == {id(p) for p in net.parameters()}
    x = torch.randn(3, 3, side, side)
    out = x
    for _, layer in named:
        out = layer.eval()(out)
    torch.testing.assert_close(out, net.eval()(x))


def test_a_model_hw_does_not_split_is_refused_in_one_line(tmp_path, capsys):
    _timm()
    out = tmp_path / "m.json"
    one_error_line(*run(hw_main, ["profile", "timm:test_efficientnet", "--cpu", "--batch", "4", "--out", str(out)],
                        capsys), "timm:test_efficientnet (EfficientNet) cannot be split into a pipeline's layers")
    one_error_line(*run(hw_main, ["profile", "timm:no_such_net", "--cpu", "--batch", "4", "--out", str(out)],
                        capsys), "timm:no_such_net: Unknown model")
    assert not out.exists()


def test_timm_that_does_not_import_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    """As PyPI's torchvision beside torch's CPU build makes it: a RuntimeError from its import, not an ImportError."""
    import importlib

    real = importlib.import_module

    def broken(name: str, *args: object) -> object:
        if name == "timm":
            raise RuntimeError("operator torchvision::nms does not exist")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", broken)
    one_error_line(*run(hw_main, ["profile", "timm:resnet50", "--cpu", "--batch", "4", "--out", str(tmp_path / "m")],
                        capsys), "needs timm, which is installed here but does not import (RuntimeError: operator")


@pytest.mark.parametrize("argv,message", [
    (["timm:resnet50", "--seq-len", "8"], "--seq-len and --layers go with a Hugging Face model"),
    (["timm:", "--image-size", "32"], "expected hf:"),
    (["user_nets:mlp", "--image-size", "32"], "--image-size goes with a torchvision or timm model"),
])
def test_bad_timm_arguments_are_refused_in_one_line(argv, message, tmp_path, capsys):
    one_error_line(*run(hw_main, ["profile", *argv, "--cpu", "--batch", "4", "--out", str(tmp_path / "m")], capsys),
                   message)


def test_a_stand_in_vit_is_split_profiled_and_predicted_end_to_end(monkeypatch, tmp_path, capsys):
    """The stand-in's ViT, by hw's own path (timm.create_model, the split, `hw profile`, `parsim predict`), on its
    default 16 x 16 images; at --image-size 32 rebuilt for them, as a ViT's position table is made for one size."""
    installed(monkeypatch)
    import timm

    from hw.usermodel.timm_models import timm_named

    torch.manual_seed(0)
    net = timm.create_model("vit_stand_in").eval()
    x = torch.randn(2, 3, 16, 16)
    out = x
    for _, layer in timm_named("vit_stand_in", net):
        out = layer(out)
    torch.testing.assert_close(out, net(x))
    for side, argv in ((16, []), (32, ["--image-size", "32"])):
        f = tmp_path / f"vit{side}.json"
        assert hw_main(["profile", "timm:vit_stand_in", *argv, "--cpu", "--batch", "4", "--microbatch-sizes", "1,2",
                        "--repeat", "1", "--out", str(f)]) == 0
        model = load_model(f)
        assert [layer.name for layer in model.layers] == ["embed", "blocks.0", "blocks.0", "blocks.0", "head"]
        assert model.layers[0].in_shape == (3, side, side) and model.layers[-1].out_shape == (10,)
        assert model.layers[0].params == 16 * 3 * 4 * 4 + 16 + 16 + ((side // 4) ** 2 + 1) * 16
    status, out_text, err = run(parsim_main, ["predict", "--model", str(f), "--gpus", "2", "--microbatches", "2"],
                                capsys)
    assert status == 0, err
    assert "timm:vit_stand_in (5 layers), 4 images" in out_text


@pytest.mark.parametrize("spec,message", [
    ("timm:efficientnet_stand_in", "timm:efficientnet_stand_in (EfficientNet) cannot be split into a pipeline's layers"),
    ("timm:no_such_net", "timm:no_such_net: Unknown model (no_such_net)"),
])
def test_a_stand_in_model_hw_does_not_split_is_refused_in_one_line(spec, message, monkeypatch, tmp_path, capsys):
    installed(monkeypatch)
    out = tmp_path / "m.json"
    one_error_line(*run(hw_main, ["profile", spec, "--cpu", "--batch", "4", "--out", str(out)], capsys), message)
    assert not out.exists()


@pytest.fixture(scope="module")
def vit_file(tmp_path_factory):
    """timm's own test ViT (6 blocks of width 64) on 32 x 32 images, profiled on the CPU."""
    _timm()
    out = tmp_path_factory.mktemp("timm") / "vit.json"
    assert hw_main(["profile", "timm:test_vit", "--image-size", "32", "--cpu", "--batch", "4",
                    "--microbatch-sizes", "1,2", "--repeat", "1", "--out", str(out)]) == 0
    return out


def test_a_timm_vit_is_profiled_as_embedding_blocks_and_head_and_predicted(vit_file, capsys):
    doc = json.loads(vit_file.read_text())
    assert [(e["name"], e["count"]) for e in doc["layers"]] == [("embed", 1), ("blocks.0", 6), ("head", 1)]
    assert doc["source"]["model"] == "timm:test_vit" and doc["source"]["image_size"] == 32
    model = load_model(vit_file)
    assert model.sample == "image" and model.layers[0].in_shape == (3, 32, 32) and model.layers[-1].out_shape == (1000,)
    status, out, err = run(parsim_main, ["predict", "--model", str(vit_file), "--gpus", "2", "--microbatches", "2",
                                         "--partition", "time"], capsys)
    assert status == 0, err
    assert "timm:test_vit (8 layers), 4 images" in out


def test_a_profiled_timm_model_pipelined_matches_one_device(vit_file):
    """Each rank rebuilds timm's model from the file's source and keeps its own layers: a pipelined step's loss and
    gradients are one device's, micro-batch after micro-batch (the position table's bicubic resampling, summed over
    the whole batch at once, rounds differently: 1e-10 relative)."""
    model = load_model(vit_file)
    schedule = get_runtime("hw").build("1f1b", 2, 2)
    results = spawn(gradient_step_worker, 2, (schedule, model, torch.float64, None, 1, "hw"), timeout_s=60,
                    deadline_s=180)
    assert_same_gradients(results, schedule.stage_to_rank[-1], *one_device_step(model, 2))


def test_hw_validate_measures_and_predicts_a_profiled_timm_model(vit_file, tmp_path):
    out = tmp_path / "v"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one intra-op thread per rank
    r = subprocess.run([sys.executable, "-m", "hw", "validate", "--cpu", "--gpus", "1,2", "--runtimes", "hw,torch",
                        "--schedules", "gpipe", "--microbatches", "2", "--models", f"{vit_file}:4", "--steps", "1",
                        "--warmup", "1", "--profile", "parsim/profiles/default.json", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [(row["gpus"], row["runtime"]) for row in rows] == [("1", "hw"), ("1", "torch"), ("2", "hw"),
                                                               ("2", "torch")]
    assert all(float(row["measured_s"]) > 0 and float(row["predicted_s"]) > 0 for row in rows)
