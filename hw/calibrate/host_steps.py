"""Whole host-bound steps, timed as `hw measure` times them: the level of the profile's host costs.

Stages of k tiny MLP blocks leave the GPU idle, so a step takes what the host's loop takes. hw's runner (in GPipe
and 1F1B order) and, when asked, torch.distributed.pipelining's GPipe, 1F1B and interleaved 1F1B step in turns over
depths k and micro-batch counts m, in a fresh process of world size 1. Each runtime's steps are fitted to

    step = step_s + actions * action_s + layers * per_layer_s + after * after_backward_s - stages k grad_add_s
                                       (actions = 2 m stages, layers = m stages k, after = forwards after a backward)

where grad_add_s (hw.calibrate.host.grad_add_host) is what a stage's first backward of a step does not pay, and
`after` counts the forwards that come right after a backward in the rank's program (1F1B order: m - 1 a stage),
which cost the dispatching thread more (parsim.profile.HostCosts.after_backward_s). hw's GPipe also steps with
every micro-batch recomputed (torch.utils.checkpoint): its steps less the same GPipe's without are fitted apart, to
recompute_call_s per checkpointed micro-batch plus recompute_s per layer of it. The spans around single actions
(hw.calibrate.host.host_samples) give each op's share of a layer's host cost, these steps its level: a prediction
is of whole steps, and the spans summed to more."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from hw.calibrate.fit import Fit, r_squared
from hw.calibrate.host import host_stage
from hw.measure.steps import Config, Job, measure_turns, on_rank
from parsim.runtimes.torch_pipelining import TORCH
from parsim.schedules import gpipe, one_f_one_b
from parsim.sim.lower import forwards_after_backward
from parsim.workload.recompute import recomputing_actions

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
            jobs += [Job(gpipe(1, m), stage, config), Job(one_f_one_b(1, m), stage, config),
                     Job(gpipe(1, m), stage, config, recompute="always")]
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
                     "steps_s": times, "recomputed": len(recomputing_actions(s, job.recompute)) * len(job.model.layers)
                     // s.num_stages})
    return rows


def plain(rows: list[dict]) -> list[dict]:
    """The rows that recompute nothing: those the loop's level is fitted to."""
    return [r for r in rows if not r.get("recomputed")]


def _terms(rows: list[dict], grad_add_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row (1, compute actions, layer passes, forwards after a backward), its step time, and what its stages'
    first backwards saved (rows taken before 2026-11-28 have no 1F1B order: no forward after a backward)."""
    x = np.array([(1.0, 2 * r["microbatches"] * r["stages"], r["microbatches"] * r["stages"] * r["layers"],
                   r.get("after_backward", 0)) for r in rows])
    saved = np.array([r["stages"] * r["layers"] * grad_add_s for r in rows])
    return x, np.array([r["step_s"] for r in rows]), saved


def fit_loop(rows: list[dict], grad_add_s: float = 0.0) -> tuple[np.ndarray, Fit]:
    """(step_s, action_s, per_layer_s, after_backward_s) >= 0 by least squares on relative residuals over the rows
    that recompute nothing, and the fit's quality (reported as fixed_s = action_s, rate = layers per second, like
    the other host fits); after_backward_s is 0 where no row has a forward after a backward."""
    rows = plain(rows)
    x, t, saved = _terms(rows, grad_add_s)
    used = np.flatnonzero(x.any(axis=0))
    sol = least_squares(lambda p: (x[:, used] @ p - saved) / t - 1,
                        x0=np.full(len(used), t.min() / x.sum(axis=1).max()), bounds=(0, np.inf))
    params = np.zeros(x.shape[1])
    params[used] = sol.x
    return params, quality(params, rows, grad_add_s)


def quality(params: np.ndarray, rows: list[dict], grad_add_s: float = 0.0) -> Fit:
    """How well (step_s, action_s, per_layer_s, after_backward_s) predicts `rows` (those that recompute nothing): R^2
    and the worst relative residual."""
    x, t, saved = _terms(plain(rows), grad_add_s)
    pred = x @ params - saved
    return Fit(float(params[1]), 1 / max(float(params[2]), 1e-30), r_squared(t, pred),
               float(np.max(np.abs(pred / t - 1))))


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
    recompute: Recompute | None = None  # None: the probe rows recompute nothing (taken before 2026-11-28)

    def recompute_costs(self) -> dict[str, float]:
        """HostCosts' recompute fields (none where the probe rows recompute nothing)."""
        r = self.recompute
        return {} if r is None else {"recompute_call_s": r.call_s, "recompute_s": r.per_layer_s}


@dataclass(frozen=True)
class Recompute:
    """What recomputing a micro-batch (torch.utils.checkpoint around its stage) costs hw's host, from paired steps."""

    call_s: float  # per checkpointed micro-batch
    per_layer_s: float  # per layer of it
    fit: Fit


def hw_level(rows: list[dict], spans_per_layer_s: float, grad_add_s: float = 0.0) -> Level:
    """The level of hw's host costs from the probe rows; spans_per_layer_s: the spans' forward + backward per layer."""
    mine = [r for r in rows if r["runtime"] == "hw"]
    params, fit = fit_loop(mine, grad_add_s)
    step_s, action_s, per_layer_s, after_backward_s = (float(v) for v in params)
    return Level(step_s, action_s, per_layer_s, per_layer_s / spans_per_layer_s, fit, after_backward_s,
                 fit_recompute(mine))


def fit_recompute(rows: list[dict]) -> Recompute | None:
    """(call_s, per_layer_s) >= 0 from each recomputing GPipe's step less the same GPipe's without (timed in the same
    turns): excess = micro-batches x call_s + their layers x per_layer_s, least squares on residuals relative to the
    excess; None where no row recomputes."""
    base = {(r["stages"], r["microbatches"], r["layers"]): r["step_s"] for r in plain(rows) if r["schedule"] == "gpipe"}
    pairs = [(r, r["step_s"] - base[key]) for r in rows if r.get("recomputed")
             and (key := (r["stages"], r["microbatches"], r["layers"])) in base]
    if not pairs:
        return None
    x = np.array([(r["recomputed"] / r["layers"], r["recomputed"]) for r, _ in pairs], dtype=float)
    excess = np.array([e for _, e in pairs])
    scale = np.maximum(np.abs(excess), 1e-9)
    sol = least_squares(lambda p: (x @ p - excess) / scale, x0=np.full(2, max(excess.mean(), 1e-9) / x.sum(1).max()),
                        bounds=(0, np.inf))
    pred = x @ sol.x
    worst = float(np.max(np.abs(pred - excess) / scale))
    fit = Fit(float(sol.x[0]), 1 / max(float(sol.x[1]), 1e-30), r_squared(excess, pred), worst)
    return Recompute(float(sol.x[0]), float(sol.x[1]), fit)


def leveled(per_layer: dict[str, float], level: Level) -> dict[str, float]:
    """Each per-layer host cost of the spans (forward, input-grad, backward, split backward) times the level's
    scale: their shares kept, their sum the whole steps'."""
    return {k: v * level.span_scale for k, v in per_layer.items()}
