"""parsim.predict(Configuration, profile): the one way to predict a configuration, as `parsim predict` prints it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import parsim
from parsim.cli import main
from parsim.configuration import Configuration, predict, prepare
from parsim.errors import ModelError, ParsimError
from parsim.outputs.report import to_json
from parsim.profile import load_profile
from parsim.runtimes import get_runtime
from parsim.runtimes.base import Runtime
from parsim.sim import predict as simulator
from parsim.workload import conv_model, mlp_model, partitioned

MLP = mlp_model(layers=8, hidden=256, tokens=1024)

# (configuration, the same as `parsim predict` flags)
CASES = [
    (Configuration(MLP, "1f1b", 4, 8), ["--schedule", "1f1b", "--gpus", "4", "--microbatches", "8"]),
    (Configuration(MLP, "interleaved-1f1b", 2, 4, virtual_stages=4),
     ["--schedule", "interleaved-1f1b", "--gpus", "2", "--microbatches", "4", "--virtual-stages", "4"]),
    (Configuration(MLP, "zbv", 4, 8, data_parallel=2, runtime="torch"),
     ["--schedule", "zbv", "--gpus", "4", "--microbatches", "8", "--data-parallel", "2", "--runtime", "torch"]),
    (Configuration(MLP, "gpipe", 2, 4, runtime="graphs", copy_streams=True, partition=(5, 3)),
     ["--schedule", "gpipe", "--gpus", "2", "--microbatches", "4", "--runtime", "graphs", "--copy-streams",
      "--balance", "5,3"]),
    (Configuration(conv_model(), "1f1b", 4, 8, partition="time"),
     ["--conv", "--schedule", "1f1b", "--gpus", "4", "--microbatches", "8", "--partition", "time"]),
]
MLP_FLAGS = ["--layers", "8", "--hidden", "256", "--tokens", "1024"]


@pytest.mark.parametrize("config,flags", CASES, ids=[c.schedule + "-" + c.runtime for c, _ in CASES])
def test_predict_is_what_the_predict_command_prints(config, flags, capsys):
    model_flags = [] if "--conv" in flags else MLP_FLAGS
    assert main(["predict", "--json", *model_flags, *flags]) == 0
    printed = json.loads(capsys.readouterr().out)
    prediction, _ = parsim.predict(config, load_profile())
    assert json.loads(json.dumps(to_json(prediction))) == printed


@pytest.mark.parametrize("config,flags", CASES, ids=[c.schedule + "-" + c.runtime for c, _ in CASES])
def test_predict_is_build_split_and_simulate_written_out(config, flags):
    """The steps every caller used to write out: build with the runtime, split priced as it pays, simulate."""
    profile, runtime = load_profile(), get_runtime(config.runtime)
    schedule = runtime.build(config.schedule, config.num_ranks, config.microbatches, config.virtual_stages)
    if isinstance(config.partition, tuple):
        model = replace(config.model, balance=config.partition)
    else:
        model = partitioned(config.model, config.partition, schedule.num_stages, config.microbatches,
                            runtime.costs(profile), config.data_parallel)
    old, _ = simulator.predict(schedule, model, profile, config.copy_streams, config.data_parallel, runtime)
    assert predict(config, profile)[0] == old


def test_the_profile_is_converted_once_for_a_split_by_time(monkeypatch):
    calls = []
    costs = Runtime.costs

    def counted(self, profile):
        calls.append(self.name)
        return costs(self, profile)

    monkeypatch.setattr(Runtime, "costs", counted)
    prepared = prepare(Configuration(MLP, "1f1b", 2, 4, runtime="torch", partition="time"), load_profile())
    assert prepared.model.balance is not None and calls == ["torch"]
    prepared.predict()
    assert calls == ["torch"]


def test_an_equal_split_needs_no_runtime_costs():
    """`hw measure --runtime torch` with a profile that has no torch costs still builds and splits its step."""
    profile = load_profile()
    bare = type(profile)(profile.gpus_per_node, profile.links, profile.host, profile.layers)
    prepared = prepare(Configuration(MLP, "1f1b", 2, 4, runtime="torch"), bare)
    assert prepared.schedule.num_stages == 2 and prepared.model.balance is None
    with pytest.raises(ParsimError, match="no costs for the 'torch' runtime"):
        prepared.predict()


@pytest.mark.parametrize("config,error", [
    (Configuration(MLP, "1f1b", 3, 4, data_parallel=2), "3 GPUs do not split into 2 data-parallel replicas"),
    (Configuration(MLP, "1f1b", 2, 4, partition=(4, 2, 2)), "gives 3 stages but the schedule has 2"),
    (Configuration(MLP, "1f1b", 16, 16), "cannot split 8 layers into 16 stages"),
    (Configuration(MLP, "1f1b", 2, 3), "do not split into 3 equal micro-batches"),
])
def test_prepare_refuses_what_cannot_run(config, error):
    with pytest.raises((ParsimError, ModelError), match=error):
        prepare(config, load_profile())
