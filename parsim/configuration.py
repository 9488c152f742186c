"""One training-step configuration and its prediction: the one way every command checks, builds, splits and
simulates a step (model, schedule, GPUs, micro-batches, runtime, data and tensor parallelism, copy streams, split)."""

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
from parsim.workload.recompute import check_layers, check_mode
from parsim.workload.tensor_parallel import RUNTIMES as TP_RUNTIMES
from parsim.workload.tensor_parallel import TensorParallel, check_tensor_parallel, split_model, tp_view
from parsim.workload.timed import priced

Partition = str | tuple[int, ...]  # "equal" layer counts, "time" (balanced by the profile), or layers per stage


@dataclass(frozen=True)
class Configuration:
    """What to predict (or run): a model on `gpus` GPUs, `data_parallel` replicas of a pipeline of
    gpus / (data_parallel x tensor_parallel) ranks, each rank `tensor_parallel` GPUs of one node splitting every
    layer (ranks ordered TP innermost, then pipeline, then data-parallel), under `schedule`, run by `runtime`, its
    layers split into stages as `partition` says."""

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
    tensor_parallel: int = 1  # GPUs of one node that split each layer (parsim.workload.tensor_parallel)
    sequence_parallel: bool = False  # with tensor parallelism: norms and activations split by sequence too

    @property
    def num_ranks(self) -> int:
        """Pipeline ranks in one replica (each a tensor-parallel group)."""
        return self.gpus // (self.data_parallel * self.tensor_parallel)

    @property
    def tp(self) -> TensorParallel:
        return TensorParallel(self.tensor_parallel, self.sequence_parallel)


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
        """The profile with the runtime's host and GPU costs in place of hw's runner's (Runtime.costs), its GPUs
        the tensor-parallel groups (parsim.workload.tensor_parallel.tp_view)."""
        return tp_view(self.runtime.costs(self.profile), self.config.tensor_parallel)

    @cached_property
    def model(self) -> Model:
        """The model split into the schedule's stages as the configuration says (by time: its layers as tensor
        parallelism splits them, priced by run_profile, at the schedule's micro-batch size); its layers whole."""
        c, schedule = self.config, self.schedule
        if isinstance(c.partition, tuple):
            check_balance(c.partition, len(c.model.layers), schedule.num_stages)
            model = replace(c.model, balance=c.partition)
        else:
            by = self.run_profile if c.partition == "time" else None
            split = partitioned(split_model(c.model, c.tp), c.partition, schedule.num_stages,
                                schedule.num_microbatches, by, c.data_parallel)
            model = replace(c.model, balance=split.balance)
        # a schedule read from a file names its own micro-batches and stages: the batch and layers must split so
        microbatch_tokens(model, schedule.num_microbatches, c.data_parallel)
        stage_layers(model, schedule.num_stages)
        return model

    @cached_property
    def run_model(self) -> Model:
        """The model as one GPU of a tensor-parallel group holds and runs it (the model where t is 1)."""
        return split_model(self.model, self.config.tp)

    def predict(self, give_up: Callable[[float], bool] | None = None) -> tuple[Prediction, Simulation]:
        """The predicted step, with the simulation behind its numbers (see simulate for `give_up`)."""
        c = self.config
        return predict_schedule(self.schedule, self.model, self.profile, self.run_profile, c.copy_streams,
                                c.data_parallel, self.runtime.name, give_up, c.recompute, c.tp)


def check(config: Configuration) -> None:
    """What building the configuration would find wrong, found first and cheaply (see check_sizes)."""
    if config.gpus % config.data_parallel:
        raise ParsimError(f"{config.gpus} GPUs do not split into {config.data_parallel} data-parallel replicas")
    t = config.tensor_parallel
    if isinstance(t, bool) or not isinstance(t, int) or t < 1:
        raise ParsimError(f"a tensor-parallel degree is a whole number >= 1, got {t!r}")
    if config.gpus % (config.data_parallel * t):
        raise ParsimError(f"{config.gpus} GPUs do not split into {config.data_parallel} replica(s) of "
                          f"tensor-parallel groups of {t}")
    check_sizes(config.model, config.schedule, config.num_ranks, config.microbatches, config.virtual_stages,
                config.data_parallel)
    if t > 1 and config.runtime not in TP_RUNTIMES:
        raise ParsimError(f"tensor parallelism runs under the {' and '.join(TP_RUNTIMES)} runtimes, not "
                          f"{config.runtime} (its CUDA graphs capture no collectives)")
    check_tensor_parallel(config.model, config.tp, None,
                          microbatch_tokens(config.model, config.microbatches, config.data_parallel))
    check_layers(check_mode(config.recompute), config.model.layers)
    if get_runtime(config.runtime).graphed:
        from parsim.workload.graph_memory import check_no_recompute

        check_no_recompute(config.recompute)


def prepare(config: Configuration, profile: Profile) -> Prepared:
    """The configuration checked, its schedule built and its model split (a split that cannot be made is refused
    here): what `hw measure` runs and `predict` simulates."""
    check(config)
    check_tensor_parallel(config.model, config.tp, profile.gpus_per_node)
    runtime = get_runtime(config.runtime)
    prepared = Prepared(config, runtime.build(config.schedule, config.num_ranks, config.microbatches,
                                              config.virtual_stages), runtime, priced(profile, config.model.layers))
    prepared.model  # noqa: B018 - split now, so that a bad split is this call's error
    return prepared


def predict(config: Configuration, profile: Profile) -> tuple[Prediction, Simulation]:
    """The predicted step of `config` on the machine `profile` describes, with the simulation behind its numbers."""
    return prepare(config, profile).predict()
