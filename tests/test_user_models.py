"""Users' own models (issue 45): `hw profile` times each layer and writes a profiled model file; parsim prices it
as the layers measured (closed forms); hw runs the same layers in its pipeline (gradients equal to one device's);
what cannot be split is refused in one line."""

from __future__ import annotations

import json

import pytest
from clirun import one_error_line, run
from conftest import assert_same_gradients, make_profile, one_device_step

from parsim.cli import main as parsim_main
from parsim.profile import LayerCosts, OpCost
from parsim.runtimes import get_runtime
from parsim.schedules import build
from parsim.workload import Model, load_model, rank_peak_bytes, stage_costs
from parsim.workload.timed import Source, TimedLayer, priced

torch = pytest.importorskip("torch")

from hw.__main__ import main as hw_main  # noqa: E402
from hw.run.ranks import spawn  # noqa: E402
from hw.run.runtimes import gradient_step_worker  # noqa: E402

SOURCE = Source("tests:none")


def timed(name: str, fixed_s: float, rate: float, host_s: float = 0.0, out: int = 64, stash: int = 0,
          params: int = 10) -> TimedLayer:
    cost = OpCost(host_s, fixed_s, rate)
    return TimedLayer(name, SOURCE, LayerCosts(cost, cost, cost), (16,), (16,), params, 2, out, stash)


def test_a_timed_layers_costs_are_its_own_at_any_micro_batch():
    """fixed_s + samples / rate per op, from the layer's own costs, whatever the profile's layer table holds."""
    layers = (timed("a", 1e-3, 1e4), timed("b", 2e-3, 5e3))
    costs = stage_costs(Model(layers, 64), 1, 4, priced(make_profile(), layers))[0]
    assert costs.forward.gpu_s == pytest.approx((1e-3 + 16 / 1e4) + (2e-3 + 16 / 5e3), rel=1e-12)
    assert costs.backward.gpu_s == pytest.approx(2 * costs.forward.gpu_s, rel=1e-12)


def test_a_slower_host_scales_timed_layers_host_costs_too():
    """A profile slowed before the model's costs join it (compare's host sensitivity, the host probe) scales them."""
    layers = (timed("a", 1e-3, 1e4, host_s=1e-4),)
    slow = priced(make_profile().with_host_slower(2.5), layers)
    assert slow.layers["timed:a"].forward.host_s == pytest.approx(2.5e-4, rel=1e-12)
    assert priced(make_profile(), layers).layers["timed:a"].forward.host_s == 1e-4


def test_torchs_last_stage_keeps_every_output_and_merges_them_at_the_end():
    """torch's PipelineStage keeps the last stage's outputs for step() to merge and return: with nothing else held,
    the last rank's peak is its weights and gradients plus 2 x M outputs (M kept, and their merged copy); without
    them, its weights and gradients and a later backward's gradients, made apart before their add."""
    layers = (timed("a", 1e-3, 1e4, out=100), timed("b", 1e-3, 1e4, out=300))
    model, m = Model(layers, 64), 8
    schedule = get_runtime("torch").build("1f1b", 2, m)
    plain = rank_peak_bytes(model, schedule, 8, "none")
    kept = rank_peak_bytes(model, schedule, 8, "none", keeps_outputs=True)
    assert kept[0] == plain[0]
    assert plain[1] == 3 * (10 * 2) and kept[1] == 2 * (10 * 2) + 2 * m * 300 * 8


@pytest.fixture(scope="module")
def mlp_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("user") / "mlp.json"
    status = hw_main(["profile", "user_nets:mlp", "--cpu", "--batch", "8", "--microbatch-sizes", "1,2,4",
                      "--repeat", "1", "--out", str(out)])
    assert status == 0
    return out


def test_profile_writes_alike_layers_once_with_their_measured_bytes(mlp_file):
    doc = json.loads(mlp_file.read_text())
    assert [(e["name"], e["count"]) for e in doc["layers"]] == [("0", 4), ("4", 1)]
    block, head = doc["layers"]
    assert block["params"] == 2 * 16 + (16 * 32 + 32) + (32 * 16 + 16) and head["params"] == 16 * 8 + 8
    assert block["out_bytes_per_token"] == 16 * 4 and head["out_bytes_per_token"] == 8 * 4  # fp32 on the CPU
    assert block["stash_bytes_per_token"] > 0 and doc["profiled"]["microbatch_sizes"] == [1, 2, 4]
    # tensors saved for autograd: LayerNorm's input, weight, bias, mean and rstd, each Linear's input and weight,
    # GELU's input; the head's Linear alone (its loss's are not the layer's: hw computes it outside a checkpoint)
    assert (block["saved_tensors"], head["saved_tensors"]) == (5 + 2 + 1 + 2, 2)
    model = load_model(mlp_file)
    assert model.tokens == 8 and len(model.layers) == 5
    assert [layer.saved_tensors for layer in model.layers] == [10, 10, 10, 10, 2]


def test_a_profiled_layer_costs_what_was_measured_at_each_size_timed(mlp_file):
    doc = json.loads(mlp_file.read_text())
    model = load_model(mlp_file)
    for entry, layer in zip(doc["layers"], (model.layers[0], model.layers[4])):
        for n, measured in zip(entry["measured"]["samples"], entry["measured"]["forward_s"]):
            assert layer.costs.forward.gpu_s(n) == pytest.approx(measured, rel=1e-9)


def test_parsim_predicts_a_profiled_model_file(mlp_file, capsys):
    status, out, err = run(parsim_main, ["predict", "--model", str(mlp_file), "--gpus", "2", "--microbatches", "4",
                                         "--partition", "time"], capsys)
    assert status == 0, err
    assert "user_nets:mlp (5 layers), 8 samples" in out
    assert "layers timed on CPU" in out and "the rest priced by the profile's NVIDIA H200" in out


@pytest.mark.parametrize("runtime,name", [("hw", "1f1b"), ("torch", "gpipe"), ("graphs", "1f1b")])
def test_a_profiled_model_pipelined_matches_one_device(mlp_file, runtime, name):
    """hw rebuilds the user's layers from the file's source: a pipelined step's loss and gradients are one device's."""
    model = load_model(mlp_file)
    schedule = get_runtime(runtime).build(name, 2, 4)
    results = spawn(gradient_step_worker, 2, (schedule, model, torch.float64, None, 1, runtime), timeout_s=30,
                    deadline_s=120)
    assert_same_gradients(results, schedule.stage_to_rank[-1], *one_device_step(model))


@pytest.mark.parametrize("net", ["TinyResNet", "TinyViT"])
def test_a_vision_model_split_into_layers_computes_what_it_computes_whole(net):
    """torchvision's ResNet and VisionTransformer layouts (tiny stand-ins, with their forward) split as hw splits
    them: the layers in turn give the model's own output, and classify."""
    import user_nets

    from hw.usermodel.sources import vision_layers

    torch.manual_seed(0)
    model = getattr(user_nets, net)().eval()
    layers = vision_layers(Source("torchvision:stand-in", image_size=16), model)
    x = torch.randn(3, 3, 16, 16)
    out = x
    for _, layer in layers.named:
        out = layer(out)
    assert torch.allclose(out, model(x), atol=1e-6)
    assert layers.source.target == "classes" and layers.source.classes == 10 and layers.source.sample == "image"


def test_a_resnet_is_split_into_stem_blocks_and_head(tmp_path):
    out = tmp_path / "resnet.json"
    assert hw_main(["profile", "user_nets:resnet", "--cpu", "--batch", "4", "--repeat", "1", "--out", str(out)]) == 0
    model = load_model(out)
    assert len(model.layers) == 1 + 5 + 1 and model.layers[-1].out_shape == (10,)


@pytest.mark.parametrize("variant", ["llama", "gpt2"])
def test_a_tiny_transformers_model_is_profiled_predicted_and_run(variant, tmp_path, capsys):
    pytest.importorskip("transformers")
    config = tmp_path / "config.json"
    sizes = ({"model_type": "llama", "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
              "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 64} if variant == "llama" else
             {"model_type": "gpt2", "n_embd": 32, "n_head": 4, "n_layer": 2, "vocab_size": 64, "n_positions": 16,
              "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0})
    config.write_text(json.dumps(sizes))
    out = tmp_path / "model.json"
    assert hw_main(["profile", f"hf:{config}", "--seq-len", "8", "--cpu", "--batch", "4", "--repeat", "1",
                    "--out", str(out)]) == 0
    model = load_model(out)
    assert [layer.name for layer in model.layers][::3] == ["embed", "head"] and model.sample == "sequence"
    status, stdout, err = run(parsim_main, ["predict", "--model", str(out), "--gpus", "2", "--microbatches", "2"],
                              capsys)
    assert status == 0, err
    schedule = build("1f1b", 2, 2)
    results = spawn(gradient_step_worker, 2, (schedule, model, torch.float64), timeout_s=60, deadline_s=180)
    assert results[1].loss is not None and torch.isfinite(results[1].loss)


@pytest.mark.parametrize("spec,message", [
    ("user_nets:two_outputs", "returns tuple, not one tensor"),
    ("user_nets:not_layers", "not an nn.Sequential or a list of modules"),
    ("user_nets:mismatched", "cannot take the output of the one before"),
    ("user_nets:missing", "cannot import it"),
    ("resnet50", "expected hf:"),
    ("user_nets:mlp --seq-len 8", "--seq-len and --layers go with a Hugging Face model"),
    ("user_nets:mlp --image-size 32", "--image-size goes with a torchvision or timm model"),
    ("user_nets:mlp --microbatch-sizes 3", "time at least two micro-batch sizes"),
    ("user_nets:mlp --microbatch-sizes 1,3", "must divide --batch 4"),
    ("hf:gpt-2", "give the tokens per sequence (--seq-len)"),
])
def test_a_model_that_cannot_be_split_is_refused_in_one_line(spec, message, tmp_path, capsys):
    out = tmp_path / "m.json"
    line = one_error_line(*run(hw_main, ["profile", *spec.split(), "--cpu", "--batch", "4", "--out", str(out)],
                               capsys), message)
    assert line and not out.exists()


@pytest.mark.parametrize("edit,message", [
    (lambda d: d["layers"][0].pop("costs"), "lacks its \"costs\""),
    (lambda d: d["layers"].append(dict(d["layers"][0])), "is named '0' as an earlier entry is"),
    (lambda d: d["source"].update(target="hinge"), "target mse or classes"),
    (lambda d: d["layers"][0]["costs"]["forward"].update(flops_per_s=-1), "flops_per_s"),
    (lambda d: d.update(samples=0), "samples"),
    (lambda d: d["layers"][0].update(saved_tensors=-1), "saved_tensors"),
])
def test_a_broken_profiled_model_file_is_refused_in_one_line(mlp_file, edit, message, tmp_path, capsys):
    doc = json.loads(mlp_file.read_text())
    edit(doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    one_error_line(*run(parsim_main, ["predict", "--model", str(bad), "--gpus", "1"], capsys), message)


def test_a_profiled_model_is_timed_at_one_sequence_length(tmp_path, mlp_file, capsys):
    doc = json.loads(mlp_file.read_text())
    doc["source"] = dict(doc["source"], seq_len=8)
    f = tmp_path / "seq.json"
    f.write_text(json.dumps(doc))
    one_error_line(*run(parsim_main, ["plan", "--model", str(f), "--gpus", "2", "--seq-len", "16"], capsys),
                   "was timed at 8 tokens per sequence")


def test_hw_measure_refuses_selective_recompute_of_a_profiled_model_in_one_line(mlp_file, capsys):
    """A profiled model's layers are whole modules of the user's: hw has no attention core of theirs to checkpoint,
    nor parsim its cost apart."""
    argv = ["measure", "--cpu", "--gpus", "2", "--model", str(mlp_file), "--recompute", "selective"]
    one_error_line(*run(hw_main, argv, capsys), "timed whole")
