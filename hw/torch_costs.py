"""The torch runtime's host costs (parsim.profile.RuntimeCosts), measured on one GPU: `hw calibrate --runtimes torch`.

Stages of k tiny MLP blocks leave the GPU idle, so a step takes what the host's loop takes. torch's GPipe and 1F1B
with one stage, its interleaved 1F1B with two stages on the one rank, and hw's own runner (GPipe, one stage) step
in turns (hw.measure's turns: one step of each per round) over depths k and micro-batch counts m, in one process
of world size 1. torch's GPipe and 1F1B steps are fitted to

    step = step_s + actions * action_s + layers * per_layer_s      (actions = 2 m stages, layers = m stages k)

and its per-layer cost is given against hw's, fitted alike from the same rounds (layer_host = torch's / hw's),
since the profile's per-layer host costs are hw's runner's, per kind and op. Interleaved 1F1B is not fitted: the
fit predicts it, as a check. torch's steps are timed unpinned and hw's pinned, as hw measure times each.
The cost of posting a message takes two ranks: with 2+ GPUs it is timed around torch's own _batch_p2p calls
(a tiny 1F1B on ranks 0 and 1), else carried from the base profile and listed as unmeasured.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch
from scipy.optimize import least_squares

from hw.calibrate import Fit, host_stage
from hw.measure import Config, Job, measure_turns
from parsim.profile import RuntimeCosts
from parsim.runtimes.torch_pipelining import CLASSES, TORCH, TORCH_VERSION
from parsim.schedules import gpipe

FITTED = ("gpipe", "1f1b")  # one stage each
CHECKED = "interleaved-1f1b"  # two stages on the one rank


def probe_jobs(cpu: bool, dtype: str) -> list[Job]:
    """hw's GPipe and torch's GPipe, 1F1B and interleaved 1F1B at each depth and micro-batch count: one turn."""
    depths, microbatches, rounds = ((1, 2, 4), (2, 4), 3) if cpu else ((1, 2, 4, 8), (4, 8, 16), 10)
    config = Config(rounds, 2, dtype)
    jobs = []
    for k in depths:
        for m in microbatches:
            stage = host_stage("mlp", k, 8 * m)  # 8 rows a micro-batch, as hw's host probes
            jobs.append(Job(gpipe(1, m), stage, config))
            jobs += [Job(TORCH.build(name, 1, m), stage, config, runtime="torch") for name in FITTED]
            jobs.append(Job(TORCH.build(CHECKED, 1, m), host_stage("mlp", 2 * k, 8 * m), config, runtime="torch"))
    return jobs


def probe_rows(device: str, dtype: str, timeout_s: float = 120.0) -> list[dict]:
    """Each probe's median step (and its raw steps), all taken in turns in one process of world size 1."""
    jobs = probe_jobs(device == "cpu", dtype)
    (measured,) = measure_turns([tuple(jobs)], 1, device, timeout_s)
    rows = []
    for job, (result,) in zip(jobs, measured):
        s = job.schedule
        rows.append({"runtime": job.runtime, "schedule": s.name, "stages": s.num_stages, "microbatches":
                     s.num_microbatches, "layers": len(job.model.layers) // s.num_stages,
                     "step_s": statistics.median(result["times"]), "steps_s": result["times"]})
    return rows


def _terms(rows: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Per row (1, compute actions, layer passes) and its step time."""
    x = np.array([(1.0, 2 * r["microbatches"] * r["stages"], r["microbatches"] * r["stages"] * r["layers"])
                  for r in rows])
    return x, np.array([r["step_s"] for r in rows])


def fit_loop(rows: list[dict]) -> tuple[np.ndarray, Fit]:
    """(step_s, action_s, per_layer_s) >= 0 by least squares on relative residuals, and the fit's quality
    (reported as fixed_s = action_s, rate = layers per second, like the other host fits)."""
    x, t = _terms(rows)
    sol = least_squares(lambda p: x @ p / t - 1, x0=np.full(3, t.min() / x.sum(axis=1).max()),
                        bounds=(0, np.inf))
    return sol.x, _quality(sol.x, rows)


def _quality(params: np.ndarray, rows: list[dict]) -> Fit:
    """How well (step_s, action_s, per_layer_s) predicts `rows`: R^2 and the worst relative residual."""
    x, t = _terms(rows)
    pred = x @ params
    r2 = 1 - np.sum((t - pred) ** 2) / max(np.sum((t - t.mean()) ** 2), 1e-300)
    return Fit(float(params[1]), 1 / max(float(params[2]), 1e-30), float(r2), float(np.max(np.abs(pred / t - 1))))


def runtime_costs(rows: list[dict], p2p_s: float, p2p_measured: bool) -> tuple[RuntimeCosts, dict[str, Fit], dict]:
    """torch's RuntimeCosts from the probe rows; its fits (torch's, its check on interleaved, hw's); provenance."""
    torch_params, torch_fit = fit_loop([r for r in rows if r["runtime"] == "torch" and r["schedule"] in FITTED])
    hw_params, hw_fit = fit_loop([r for r in rows if r["runtime"] == "hw"])
    check = _quality(torch_params, [r for r in rows if r["schedule"] == CHECKED])
    step_s, action_s, per_layer_s = (float(v) for v in torch_params)
    layer_host = per_layer_s / float(hw_params[2])
    costs = RuntimeCosts(action_s, p2p_s, layer_host, 1.0, step_s,
                         ("gpu_scale",) + (() if p2p_measured else ("p2p_s",)))
    fits = {"host torch": torch_fit, f"host torch {CHECKED} (check)": check, "host hw in turns": hw_fit}
    provenance = {"torch": torch.__version__, "modelled": TORCH_VERSION, "classes": {n: CLASSES[n] for n in FITTED},
                  "checked_on": CLASSES[CHECKED], "step_s": step_s, "action_s": action_s,
                  "per_layer_s": per_layer_s, "hw_per_layer_s": float(hw_params[2]), "layer_host": layer_host,
                  "p2p_s": "measured" if p2p_measured else "carried from the base profile",
                  "gpu_scale": "assumed 1: torch's stages run hw's modules, kernel for kernel",
                  "pinned": "hw's runner pinned, torch's not, as hw measure times them"}
    return costs, fits, provenance


# --- posting a message, on two ranks ---------------------------------------------------------------------------

def _p2p_worker(rank: int, world: int, device: torch.device) -> list[float]:
    """Host time per message of each of torch's _batch_p2p calls in a tiny 1F1B on ranks 0 and 1."""
    import torch.distributed.pipelining.schedules as schedules

    from hw.executor import Groups, replica_batch
    from hw.runners import job_groups, runner_factory

    m = 16
    schedule, model = TORCH.build("1f1b", 2, m), host_stage("mlp", 2, 8 * m)
    made = job_groups("torch", schedule, Groups())  # every rank joins the group calls
    spans: list[float] = []
    if rank < 2:
        runner, _, _ = runner_factory("torch")(schedule, model, rank, device, torch.float32, made)
        io = replica_batch(model, schedule, 0, 1, device, torch.float32)
        inner = schedules._batch_p2p

        def timed(ops, desc=None):
            t0 = time.perf_counter()
            works = inner(ops, desc)
            if ops:
                spans.append((time.perf_counter() - t0) / len(ops))
            return works

        for k in range(8):
            if k == 3:
                schedules._batch_p2p, spans[:] = timed, []
            runner.step(io)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        schedules._batch_p2p = inner
    return spans


def p2p_host_s(device: str) -> float:
    """The median host time to post one message through torch's batch_isend_irecv path (two ranks)."""
    from hw.workers import spawn

    per_rank = spawn(_p2p_worker, 2, (), device, timeout_s=60, deadline_s=300)
    return statistics.median(per_rank[0] + per_rank[1])


def measure(base_p2p_s: float, device: str, dtype: str, gpus: int) -> tuple[RuntimeCosts, dict, dict[str, Fit], dict]:
    """torch's RuntimeCosts on this machine, its raw rows, fits and provenance (p2p_s measured with 2+ GPUs)."""
    rows = probe_rows(device, dtype)
    p2p = p2p_host_s(device) if gpus >= 2 else None
    costs, fits, provenance = runtime_costs(rows, base_p2p_s if p2p is None else p2p, p2p is not None)
    return costs, {"probes": rows, "p2p_s": p2p}, fits, provenance
