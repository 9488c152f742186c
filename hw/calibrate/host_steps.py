"""Whole host-bound steps, timed as `hw measure` times them: the level of the profile's host costs.

Stages of k tiny MLP blocks leave the GPU idle, so a step takes what the host's loop takes. hw's runner (in GPipe
and 1F1B order) and, when asked, torch.distributed.pipelining's GPipe, 1F1B and interleaved 1F1B step in turns over
depths k and micro-batch counts m, in a fresh process of world size 1. Each runtime's steps are fitted to

    step = step_s + actions * action_s + layers * per_layer_s + after * after_backward_s - stages k grad_add_s
                                       (actions = 2 m stages, layers = m stages k, after = forwards after a backward)

where grad_add_s (hw.calibrate.host.grad_add_host) is what a stage's first backward of a step does not pay, and
`after` counts the forwards that come right after a backward in the rank's program (1F1B order: m - 1 a stage),
which cost the dispatching thread more (parsim.profile.HostCosts.after_backward_s). The spans around single actions
(hw.calibrate.host.host_samples) give each op's share of a layer's host cost, these steps its level: a prediction
is of whole steps, and the spans summed to more."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from hw.calibrate.fit import Fit
from hw.calibrate.host import host_stage
from hw.measure.steps import Config, Job, measure_turns, on_rank
from parsim.runtimes.torch_pipelining import TORCH
from parsim.schedules import gpipe, one_f_one_b
from parsim.sim.lower import forwards_after_backward

TORCH_FITTED = ("gpipe", "1f1b")  # one stage each
TORCH_CHECKED = "interleaved-1f1b"  # two stages on the one rank: predicted by the fit, as a check


def probe_jobs(cpu: bool, dtype: str, with_torch: bool = False) -> list[Job]:
    """hw's GPipe and 1F1B (and torch's GPipe, 1F1B and interleaved 1F1B) at each depth and micro-batch count: one
    turn."""
    depths, microbatches, rounds = ((1, 2, 4), (2, 4), 3) if cpu else ((1, 2, 4, 8), (4, 8, 16), 10)
    config = Config(rounds, 2, dtype)
    jobs = []
    for k in depths:
        for m in microbatches:
            stage = host_stage("mlp", k, 8 * m)  # 8 rows a micro-batch, as hw's host spans
            jobs += [Job(gpipe(1, m), stage, config), Job(one_f_one_b(1, m), stage, config)]
            if with_torch:
                jobs += [Job(TORCH.build(name, 1, m), stage, config, runtime="torch") for name in TORCH_FITTED]
                jobs.append(Job(TORCH.build(TORCH_CHECKED, 1, m), host_stage("mlp", 2 * k, 8 * m), config,
                                runtime="torch"))
    return jobs


def probe_rows(device: str, dtype: str, with_torch: bool = False, timeout_s: float = 120.0) -> list[dict]:
    """Each probe's median step (and its raw steps), all taken in turns in one process of world size 1."""
    jobs = probe_jobs(device == "cpu", dtype, with_torch)
    (measured,) = measure_turns([tuple(jobs)], 1, device, timeout_s)
    rows = []
    for job, results in zip(jobs, measured, strict=True):
        s, times = job.schedule, on_rank(results, 0).times
        rows.append({"runtime": job.runtime, "schedule": s.name, "stages": s.num_stages, "microbatches":
                     s.num_microbatches, "layers": len(job.model.layers) // s.num_stages,
                     "after_backward": len(forwards_after_backward(s)), "step_s": statistics.median(times),
                     "steps_s": times})
    return rows


def _terms(rows: list[dict], grad_add_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row (1, compute actions, layer passes, forwards after a backward), its step time, and what its stages'
    first backwards saved (rows taken before 2026-11-28 have no 1F1B order: no forward after a backward)."""
    x = np.array([(1.0, 2 * r["microbatches"] * r["stages"], r["microbatches"] * r["stages"] * r["layers"],
                   r.get("after_backward", 0)) for r in rows])
    saved = np.array([r["stages"] * r["layers"] * grad_add_s for r in rows])
    return x, np.array([r["step_s"] for r in rows]), saved


def fit_loop(rows: list[dict], grad_add_s: float = 0.0) -> tuple[np.ndarray, Fit]:
    """(step_s, action_s, per_layer_s, after_backward_s) >= 0 by least squares on relative residuals, and the fit's
    quality (reported as fixed_s = action_s, rate = layers per second, like the other host fits); after_backward_s
    is 0 where no row has a forward after a backward."""
    x, t, saved = _terms(rows, grad_add_s)
    used = np.flatnonzero(x.any(axis=0))
    sol = least_squares(lambda p: (x[:, used] @ p - saved) / t - 1,
                        x0=np.full(len(used), t.min() / x.sum(axis=1).max()), bounds=(0, np.inf))
    params = np.zeros(x.shape[1])
    params[used] = sol.x
    return params, quality(params, rows, grad_add_s)


def quality(params: np.ndarray, rows: list[dict], grad_add_s: float = 0.0) -> Fit:
    """How well (step_s, action_s, per_layer_s, after_backward_s) predicts `rows`: R^2 and the worst relative
    residual."""
    x, t, saved = _terms(rows, grad_add_s)
    pred = x @ params - saved
    r2 = 1 - np.sum((t - pred) ** 2) / max(np.sum((t - t.mean()) ** 2), 1e-300)
    return Fit(float(params[1]), 1 / max(float(params[2]), 1e-30), float(r2), float(np.max(np.abs(pred / t - 1))))


@dataclass(frozen=True)
class Level:
    """hw's runner's host costs from its whole steps: per step, per action, and the scale of the spans' per-layer
    costs (whole-step per layer / spans' forward + backward per layer)."""

    step_s: float
    action_s: float
    per_layer_s: float
    span_scale: float
    fit: Fit
    after_backward_s: float = 0.0


def hw_level(rows: list[dict], spans_per_layer_s: float, grad_add_s: float = 0.0) -> Level:
    """The level of hw's host costs from the probe rows; spans_per_layer_s: the spans' forward + backward per layer."""
    params, fit = fit_loop([r for r in rows if r["runtime"] == "hw"], grad_add_s)
    step_s, action_s, per_layer_s, after_backward_s = (float(v) for v in params)
    return Level(step_s, action_s, per_layer_s, per_layer_s / spans_per_layer_s, fit, after_backward_s)


def leveled(per_layer: dict[str, float], level: Level) -> dict[str, float]:
    """Each per-layer host cost of the spans (forward, input-grad, backward, split backward) times the level's
    scale: their shares kept, their sum the whole steps'."""
    return {k: v * level.span_scale for k, v in per_layer.items()}
