"""How much the slowest of N ranks' host loops adds to a step (parsim.sim.slowest), on N ranks: `hw calibrate`.

N rank processes run tiny host-bound pipelines of hw's runner over all N ranks (GPipe and 1F1B, stages of tiny MLP
blocks, the GPU idle), timed in turns as `hw measure` times its steps; each rank's loop (its runner's call, before the
step's sync and barrier) per step. A step ends with its longest loop, and the ranks' loops vary independently: the
mean of each step's longest loop over the longest mean loop, less 1, is the excess; over E[max of N standard normals]
it is the loops' spread (host.rank_spread), which the model carries to other rank counts."""

from __future__ import annotations

import statistics

import numpy as np

from hw.calibrate.host import host_stage
from hw.measure.steps import Config, Job, RankTiming, measure_turns
from parsim.schedules import gpipe, one_f_one_b
from parsim.sim.slowest import spread_of

MICROBATCHES = 8
LAYERS = 4  # tiny MLP blocks a stage


def spread_jobs(ranks: int, cpu: bool, dtype: str) -> list[Job]:
    """GPipe and 1F1B over `ranks` ranks, host-bound: one turn."""
    config = Config(6 if cpu else 16, 2, dtype)
    model = host_stage("mlp", LAYERS * ranks, 8 * MICROBATCHES)
    return [Job(build(ranks, MICROBATCHES), model, config) for build in (gpipe, one_f_one_b)]


def excess(loops: list[list[float]]) -> float:
    """Per rank, its loop at each step (the same steps on every rank): mean over steps of the longest loop, over the
    longest of the ranks' mean loops, less 1."""
    by_step = np.array(loops)
    return float(by_step.max(axis=0).mean() / by_step.mean(axis=1).max() - 1.0)


def rank_spread(ranks: int, device: str, dtype: str, timeout_s: float = 120.0) -> tuple[float, dict]:
    """The loops' spread on `ranks` ranks (the jobs' median excess over E[max]) and the raw rows."""
    jobs = spread_jobs(ranks, device == "cpu", dtype)
    (measured,) = measure_turns([tuple(jobs)], ranks, device, timeout_s)
    rows: list[dict] = []
    for job, results in zip(jobs, measured, strict=True):
        loops = [_steps(t) for t in results if t is not None]
        rows.append({"schedule": job.schedule.name, "ranks": ranks, "microbatches": MICROBATCHES,
                     "layers": LAYERS, "excess": excess(loops), "loops_s": loops})
    gain = statistics.median(float(r["excess"]) for r in rows)
    return spread_of(max(gain, 0.0), ranks), {"excess": gain, "rows": rows}


def _steps(timing: RankTiming) -> list[float]:
    """A rank's loops, step by step over its samples."""
    return [s for block in timing.loops for s in block]
