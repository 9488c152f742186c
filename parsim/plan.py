"""Search configurations for a model and GPU count; rank them by predicted step time.

Candidates: every schedule, power-of-two micro-batch counts, virtual stages 2 and 4 for the
schedules that take them, every data-parallel degree that divides the GPUs, and each split asked
for (equal layer counts, balanced by time, or both).

Memory per GPU is its weights, gradients and optimizer state (mixed-precision Adam by default:
16 bytes per parameter, bf16 weights and gradients, fp32 master weights and two moments) plus the
most activations and working memory its program holds at once (parsim.workload.memory).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from parsim.errors import ParsimError, ScheduleError
from parsim.sim.predict import Prediction, predict
from parsim.profile import Profile
from parsim.runtimes import Runtime
from parsim.runtimes.eager import EAGER
from parsim.schedules import VIRTUAL, Schedule
from parsim.workload import Model, microbatch_tokens, partitioned, rank_peak_bytes, stage_layers

OPTIMIZER_BYTES_PER_PARAM = 16  # mixed-precision Adam (see parsim.workload.memory)
SPLITS = {"equal": ("equal",), "time": ("time",), "both": ("equal", "time")}


@dataclass(frozen=True)
class Candidate:
    schedule: str
    microbatches: int
    virtual_stages: int
    data_parallel: int
    prediction: Prediction
    memory_bytes: int  # the most any one GPU needs
    balance: tuple[int, ...] | None = None  # layers per stage, where not an equal split

    @property
    def label(self) -> str:
        v = f", v={self.virtual_stages}" if self.schedule in VIRTUAL else ""
        dp = f", dp={self.data_parallel}" if self.data_parallel > 1 else ""
        split = f" [{'/'.join(map(str, self.balance))}]" if self.balance and len(self.balance) > 1 else ""
        return f"{self.schedule} m={self.microbatches}{v}{dp}{split}"


def params_per_gpu(model: Model, num_ranks: int, num_stages: int, stage_to_rank: tuple[int, ...]) -> list[int]:
    """Parameters each rank of one pipeline holds."""
    per_layer = [layer.params for layer in model.layers]
    held = [0] * num_ranks
    for stage, layers in enumerate(stage_layers(model, num_stages)):
        held[stage_to_rank[stage]] += sum(per_layer[i] for i in layers)
    return held


def microbatch_counts(tokens: int, gpus: int, most: int = 256) -> list[int]:
    """Powers of two from 1 to `most` that split the batch evenly (none for an empty batch)."""
    return [m for m in (1 << k for k in range(most.bit_length())) if m <= most and tokens and tokens % m == 0]


def _shapes(model: Model, gpus: int, names: list[str], max_microbatches: int, data_parallel: bool,
            runtime: Runtime = EAGER) -> Iterator[tuple[str, Schedule, int, int]]:
    """(name, schedule, virtual stages, replicas) that can run: sizes the generator accepts, no more
    stages than layers, and several stages per GPU only where there are several GPUs."""
    for dp in (d for d in range(1, gpus + 1) if gpus % d == 0) if data_parallel else (1,):
        pp = gpus // dp
        for name in names:
            for m in microbatch_counts(model.tokens // dp if model.tokens % dp == 0 else 0, pp, max_microbatches):
                for v in ((2, 4) if name in VIRTUAL else (None,)):
                    try:
                        schedule = runtime.build(name, pp, m, v)
                    except ScheduleError:
                        continue  # e.g. interleaving with m not a multiple of pp, DualPipeV with m < 2pp
                    if schedule.num_stages <= len(model.layers) and (pp > 1 or schedule.num_stages == 1):
                        yield name, schedule, v or 1, dp


def candidates(model: Model, gpus: int, profile: Profile, schedules: list[str] | None = None,
               max_microbatches: int = 256, data_parallel: bool = True, partition: str = "equal",
               optimizer: str = "adam", runtime: Runtime = EAGER) -> list[Candidate]:
    """Every configuration that can run, predicted; those that cannot are skipped, not errors.

    Data-parallel degrees are tried only where the profile can cost an all-reduce; each configuration's
    layers are split as `partition` says ("equal", "time": balanced at its micro-batch size, or "both",
    each once where they differ). Memory per GPU holds the optimizer's state (see parsim.workload.memory).
    """
    dp_ok = data_parallel and "allreduce" in profile.collectives
    out = []
    run_profile = runtime.costs(profile)
    for name, schedule, v, dp in _shapes(model, gpus, schedules or list(runtime.schedules()), max_microbatches, dp_ok,
                                         runtime):
        m = schedule.num_microbatches
        splits = {}  # by layers per stage: a time split may be the equal one
        for how in SPLITS[partition]:
            split = partitioned(model, how, schedule.num_stages, m, run_profile, dp)
            splits.setdefault(tuple(map(len, stage_layers(split, schedule.num_stages))), split)
        for split in splits.values():
            prediction, _ = predict(schedule, split, profile, data_parallel=dp, runtime=runtime)
            memory = max(rank_peak_bytes(split, schedule, microbatch_tokens(split, m, dp), optimizer))
            out.append(Candidate(name, m, v, dp, prediction, memory, split.balance))
    return out


def plan(model: Model, gpus: int, profile: Profile, memory_limit_bytes: float | None = None,
         schedules: list[str] | None = None, partition: str = "equal", optimizer: str = "adam",
         runtime: Runtime = EAGER) -> tuple[list[Candidate], list[Candidate]]:
    """(fitting, too big): configurations under the memory limit, fastest first, and the rest."""
    found = sorted(candidates(model, gpus, profile, schedules, partition=partition, optimizer=optimizer,
                              runtime=runtime),
                   key=lambda c: c.prediction.step_time_s)
    if not found:
        raise ParsimError("no configuration can run this model on these GPUs")
    fits = [c for c in found if memory_limit_bytes is None or c.memory_bytes <= memory_limit_bytes]
    return fits, [c for c in found if c not in fits]
