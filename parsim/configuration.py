"""One training-step configuration and its prediction: the one way every command checks, builds, splits and
simulates a step (model, schedule, GPUs, micro-batches, runtime, data parallelism, copy streams, split)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property

from parsim.errors import ParsimError
from parsim.profile import Profile
from parsim.runtimes import DEFAULT_RUNTIME, Runtime, get_runtime
from parsim.schedules import Schedule
from parsim.sim.predict import Prediction, Simulation, check_sizes, predict_schedule
from parsim.workload import Model, check_balance, microbatch_tokens, partitioned, stage_layers
from parsim.workload.recompute import check_mode
from parsim.workload.timed import priced

Partition = str | tuple[int, ...]  # "equal" layer counts, "time" (balanced by the profile), or layers per stage


@dataclass(frozen=True)
class Configuration:
    """What to predict (or run): a model on `gpus` GPUs, `data_parallel` replicas of a pipeline of
    gpus / data_parallel ranks, under `schedule`, run by `runtime`, its layers split as `partition` says."""

    model: Model  # its own balance, if any, is replaced by `partition`'s split
    schedule: str = "1f1b"  # a registered name, `torch:CLASS` or a torch schedule CSV
    gpus: int = 1  # all of them: pipeline ranks times data-parallel replicas
    microbatches: int = 1  # per replica and step
    virtual_stages: int | None = None  # stages per GPU, for the schedules that take them (None: theirs)
    data_parallel: int = 1
    runtime: str = DEFAULT_RUNTIME  # what runs the schedule (parsim.runtimes)
    copy_streams: bool = False  # messages on copy streams, not the compute stream (hw's runners)
    partition: Partition = "equal"
    recompute: str = "never"  # which micro-batches' forwards run again in their backward (parsim.workload.recompute)

    @property
    def num_ranks(self) -> int:
        """GPUs in one pipeline."""
        return self.gpus // self.data_parallel


@dataclass(frozen=True)
class Prepared:
    """A configuration checked and its schedule built as its runtime orders it; its model split into the schedule's
    stages and the profile as the runtime pays it, each worked out once, when first needed."""

    config: Configuration
    schedule: Schedule
    runtime: Runtime
    profile: Profile  # as given, with a profiled model's own layer costs (priced): the one-GPU baseline is hw's

    @cached_property
    def run_profile(self) -> Profile:
        """The profile with the runtime's host and GPU costs in place of hw's runner's (Runtime.costs)."""
        return self.runtime.costs(self.profile)

    @cached_property
    def model(self) -> Model:
        """The model split into the schedule's stages as the configuration says (by time: priced by run_profile,
        at the schedule's micro-batch size)."""
        c, schedule = self.config, self.schedule
        if isinstance(c.partition, tuple):
            check_balance(c.partition, len(c.model.layers), schedule.num_stages)
            model = replace(c.model, balance=c.partition)
        else:
            by = self.run_profile if c.partition == "time" else None
            model = partitioned(c.model, c.partition, schedule.num_stages, schedule.num_microbatches, by,
                                c.data_parallel)
        # a schedule read from a file names its own micro-batches and stages: the batch and layers must split so
        microbatch_tokens(model, schedule.num_microbatches, c.data_parallel)
        stage_layers(model, schedule.num_stages)
        return model

    def predict(self, give_up: Callable[[float], bool] | None = None) -> tuple[Prediction, Simulation]:
        """The predicted step, with the simulation behind its numbers (see simulate for `give_up`)."""
        c = self.config
        return predict_schedule(self.schedule, self.model, self.profile, self.run_profile, c.copy_streams,
                                c.data_parallel, self.runtime.name, give_up, c.recompute)


def check(config: Configuration) -> None:
    """What building the configuration would find wrong, found first and cheaply (see check_sizes)."""
    if config.gpus % config.data_parallel:
        raise ParsimError(f"{config.gpus} GPUs do not split into {config.data_parallel} data-parallel replicas")
    check_sizes(config.model, config.schedule, config.num_ranks, config.microbatches, config.virtual_stages,
                config.data_parallel)
    check_mode(config.recompute)


def prepare(config: Configuration, profile: Profile) -> Prepared:
    """The configuration checked, its schedule built and its model split (a split that cannot be made is refused
    here): what `hw measure` runs and `predict` simulates."""
    check(config)
    runtime = get_runtime(config.runtime)
    prepared = Prepared(config, runtime.build(config.schedule, config.num_ranks, config.microbatches,
                                              config.virtual_stages), runtime, priced(profile, config.model.layers))
    prepared.model  # noqa: B018 - split now, so that a bad split is this call's error
    return prepared


def predict(config: Configuration, profile: Profile) -> tuple[Prediction, Simulation]:
    """The predicted step of `config` on the machine `profile` describes, with the simulation behind its numbers."""
    return prepare(config, profile).predict()
