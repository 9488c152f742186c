"""What a command will cost, worked out from its sizes before anything is built: past a bound, one line saying how
large it is and which flag makes it smaller, in the time the arithmetic takes.

parsim's simulation settles about ACTIONS_PER_S actions a second and holds about BYTES_PER_ACTION per action while
it runs (1F1B on 64 stages x 16384 micro-batches: 6.2M actions, 6.5 s, 1.1 GB on the 2-core test machine;
benchmarks/simulator_speed.py), so MAX_ACTIONS keeps one simulation to about ten seconds and two GB; the progress
line (parsim.progress) shows the rest. A model is costed layer by layer, so MAX_LAYERS bounds it (a real one has
a few hundred). `hw measure --cpu` is refused when even a CPU at its peak could not finish it in time.
"""

from __future__ import annotations

import os
from typing import Any

from parsim.errors import ModelError, ParsimError
from parsim.schedules import SPLITS_BACKWARD, V_SHAPED, VIRTUAL

MAX_ACTIONS = 8_000_000  # in one simulated step
ACTIONS_PER_S, BYTES_PER_ACTION = 600_000, 300  # the walk's pace and memory (see above)
# A step drawn or written as a timeline (--trace, --plot) runs on the event-driven machine, which keeps every op:
# 1F1B 64 x 2048 (786k actions) took 8 s, 1.3 GB and wrote a 180 MB trace.
MAX_TIMELINE_ACTIONS, TIMELINE_BYTES_PER_ACTION = 1_000_000, 1_700
MAX_LAYERS = 100_000
# plan weighs every configuration (its floor, about its stage count; a time-balanced split, about layers x stages)
# before it simulates any: past MAX_PLAN_S of that, it is refused.
MAX_PLAN_S, PLAN_STAGES_PER_S, PLAN_SPLIT_CELLS_PER_S = 60, 100_000, 2_500_000
# No CPU core computes faster than this per second (two FMA units at AVX-512 width, 5 GHz; AMX for bf16): a run
# that needs more time even at this speed cannot finish.
PEAK_FLOPS_PER_CORE = {"fp64": 2e11, "fp32": 4e11, "bf16": 4e12}


def stages_per_rank(schedule: str, virtual_stages: int | None = None) -> int:
    """Stages on each rank: the virtual-stage count for the schedules that take one (default 2), two for the V
    shapes, else one (also for a schedule read from torch: an estimate)."""
    key = schedule.lower()
    if key in VIRTUAL:
        return virtual_stages or 2
    return 2 if key in V_SHAPED else 1


def actions(schedule: str, gpus: int, microbatches: int, virtual_stages: int | None = None) -> int:
    """Actions in one step on all GPUs, at most: per stage and micro-batch its computes (a forward and a backward,
    split in two where the schedule splits it) and a message to and from the next stage, each posted at both
    ends (data-parallel replicas are simulated too: `gpus` counts them)."""
    computes = 3 if schedule.lower() in SPLITS_BACKWARD else 2
    return (computes + 4) * gpus * stages_per_rank(schedule, virtual_stages) * microbatches


def check_actions(schedule: str, gpus: int, microbatches: int, virtual_stages: int | None = None,
                  fix: str | None = None, timeline: bool = False) -> int:
    """The step's actions; past MAX_ACTIONS (MAX_TIMELINE_ACTIONS where its timeline is drawn or written), a
    ParsimError saying how large it is and (`fix`, else the flag) what makes it smaller."""
    n = actions(schedule, gpus, microbatches, virtual_stages)
    limit = MAX_TIMELINE_ACTIONS if timeline else MAX_ACTIONS
    if n <= limit:
        return n
    if fix is None:
        most = limit // actions(schedule, gpus, 1, virtual_stages)
        fix = (f"use fewer --microbatches (at most {most:,} on {gpus:,} GPUs)" if most else "use fewer --gpus")
        fix += ", or leave out --trace and --plot" if timeline else ""
    cost = (f"{n * TIMELINE_BYTES_PER_ACTION / 1e9:,.1f} GB to draw its timeline" if timeline else
            f"~{n / ACTIONS_PER_S:,.0f} s and {n * BYTES_PER_ACTION / 1e9:,.1f} GB")
    raise ParsimError(f"{schedule} on {gpus:,} GPUs x {microbatches:,} micro-batches is about {n:,} actions a step, "
                      f"past the {limit:,} parsim {'draws as a timeline' if timeline else 'builds and simulates'} "
                      f"at once (it would take {cost}); {fix}")


def check_layers(count: int, what: str = "the model", fix: str = "use fewer layers") -> None:
    """Refuse a model of more than MAX_LAYERS layers before they are made."""
    if count > MAX_LAYERS:
        raise ModelError(f"{what} is {count:,} layers, past the {MAX_LAYERS:,} parsim models (it costs each one); "
                         f"{fix}")


def check_plan(stage_counts: list[int], split_cells: int, gpus: int, layers: int) -> None:
    """Refuse a plan that would take more than MAX_PLAN_S to weigh its configurations (`stage_counts`: their
    stages; `split_cells`: layers x stages over the time-balanced splits it searches), before it simulates any."""
    seconds = sum(stage_counts) / PLAN_STAGES_PER_S + split_cells / PLAN_SPLIT_CELLS_PER_S
    if seconds > MAX_PLAN_S:
        raise ParsimError(f"plan on {gpus:,} GPUs and {layers:,} layers weighs {len(stage_counts):,} configurations "
                          f"of up to {max(stage_counts):,} stages, ~{seconds:,.0f} s before it simulates any (past "
                          f"the {MAX_PLAN_S} s it takes on); pass fewer --gpus, --schedules or --partition equal, or "
                          "a model of fewer layers")


def step_flops(model: Any) -> float:
    """FLOPs of one training step of `model` (a parsim.workload.Model, which imports this module): forward,
    input-grad and weight-grad of every layer, whole batch."""
    return float(model.tokens * sum(sum(part.work) for layer in model.layers for part in layer.parts))


def cpu_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_cpu_run(model: Any, dtype: str, steps: int, jobs: int, timeout_s: float, deadline_s: float, waits: bool,
                  smaller: str = "a smaller model (--layers, --hidden, --tokens)") -> None:
    """Refuse an `hw` run on the CPU that cannot finish even at every core's peak speed: the one-device baseline's
    `steps` steps of the whole model on one rank (`waits`: the other ranks wait for them at a barrier, within
    --timeout), and `jobs` jobs of as many steps within the parent's deadline."""
    flops, cores = step_flops(model), cpu_cores()
    peak = PEAK_FLOPS_PER_CORE.get(dtype, PEAK_FLOPS_PER_CORE["fp32"])
    alone_s = steps * flops / (peak * cores)
    if waits and alone_s > timeout_s:
        what, need_s = f"the one-device baseline alone ({steps} steps on one rank) needs", alone_s
        limit = f"the --timeout {timeout_s:g} s the other ranks wait for it"
    elif jobs * alone_s > deadline_s:
        what, need_s = f"its {jobs} jobs of {steps} steps need", jobs * alone_s
        limit = f"the run's {deadline_s:,.0f} s deadline"
    else:
        return
    raise ParsimError(f"on the CPU this run cannot finish: at {flops / 1e12:,.3g} TFLOP a step, {what} at least "
                      f"{need_s:,.0f} s on {cores} core(s) even at {peak / 1e9:,.0f} GFLOP/s each, past {limit}; "
                      f"use {smaller}, fewer --steps or --warmup, or a larger --timeout")
