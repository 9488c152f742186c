"""The torch runtime's host costs (parsim.profile.RuntimeCosts), measured on one GPU: `hw calibrate --runtimes torch`.

torch's GPipe and 1F1B with one stage, its interleaved 1F1B with two stages on the one rank, and hw's own runner
step in turns over tiny stages (hw.calibrate.host_steps, which fits each runtime's steps to step_s + actions x
action_s + layers x per_layer_s). torch's per-layer cost is given against hw's from the same rounds (layer_host =
torch's / hw's), since the profile's per-layer host costs are hw's runner's, per kind and op. Interleaved 1F1B is
not fitted: the fit predicts it, as a check. torch's steps are timed unpinned and hw's pinned, as hw measure times
each. The cost of posting a message takes two ranks: with 2+ GPUs it is timed around torch's own _batch_p2p calls
(a tiny GPipe and 1F1B on ranks 0 and 1, in turns), else carried from the base profile and listed as unmeasured.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hw.calibrate.fit import Fit
from hw.calibrate.host import host_stage
from hw.calibrate.host_steps import TORCH_CHECKED as CHECKED
from hw.calibrate.host_steps import TORCH_FITTED as FITTED
from hw.calibrate.host_steps import fit_loop, quality
from parsim.profile import SCALES, RuntimeCosts
from parsim.runtimes.torch_pipelining import CLASSES, TORCH, TORCH_VERSION


@dataclass(frozen=True)
class Posting:
    """What torch's loop pays the host to post messages: per batch_isend_irecv call and waiting on it (batch_s),
    and per message in it (op_s); measured on two ranks, or carried."""

    op_s: float
    batch_s: float = 0.0
    measured: bool = False


def runtime_costs(rows: list[dict], p2p: Posting, grad_add_s: float = 0.0,
                  ) -> tuple[RuntimeCosts, dict[str, Fit], dict]:
    """torch's RuntimeCosts from the probe rows (each stage's first backward of a step saving grad_add_s per layer,
    as hw.calibrate.host_steps fits them) and its message posts; its fits (torch's, its check on interleaved, hw's);
    provenance."""
    torch_params, torch_fit = fit_loop([r for r in rows if r["runtime"] == "torch" and r["schedule"] in FITTED],
                                       grad_add_s)
    hw_params, hw_fit = fit_loop([r for r in rows if r["runtime"] == "hw"], grad_add_s)
    check = quality(torch_params, [r for r in rows if r["schedule"] == CHECKED], grad_add_s)
    step_s, action_s, per_layer_s, after_backward_s = (float(v) for v in torch_params)
    ratio = per_layer_s / float(hw_params[2]) if hw_params[2] > 0 else math.inf
    # hw's per-layer slope fitted at (nearly) 0, as on a busy CPU: no ratio to take (it came out 1.6e13 once), so
    # hw's runner's, listed as unmeasured, rather than a profile parsim refuses (parsim.profile.SCALES)
    unmeasured_host = () if ratio <= SCALES[1] else ("layer_host",)
    layer_host = 1.0 if unmeasured_host else ratio
    costs = RuntimeCosts(action_s, p2p.op_s, layer_host, 1.0, step_s,
                         ("gpu_scale",) + unmeasured_host + (() if p2p.measured else ("p2p_s",)),  # batch_s with it
                         after_backward_s=after_backward_s, batch_s=p2p.batch_s)
    fits = {"host torch": torch_fit, f"host torch {CHECKED} (check)": check, "host hw in turns": hw_fit}
    provenance = {"torch": torch.__version__, "modelled": TORCH_VERSION, "classes": {n: CLASSES[n] for n in FITTED},
                  "checked_on": CLASSES[CHECKED], "step_s": step_s, "action_s": action_s,
                  "per_layer_s": per_layer_s, "after_backward_s": after_backward_s,
                  "hw_per_layer_s": float(hw_params[2]), "layer_host": layer_host,
                  "p2p_s": "measured" if p2p.measured else "carried from the base profile",
                  "gpu_scale": "assumed 1: torch's stages run hw's modules, kernel for kernel",
                  "pinned": "hw's runner pinned, torch's not, as hw measure times them"}
    return costs, fits, provenance


# --- posting a message, on two ranks ---------------------------------------------------------------------------

WARM, POSTED_STEPS = 3, 10  # steps of each tiny pipeline before its posts are timed, and timed


def _p2p_worker(rank: int, world: int, device: torch.device) -> list[tuple[int, float]]:
    """(messages, host seconds) of each of torch's _batch_p2p calls in a tiny GPipe and 1F1B on ranks 0 and 1,
    stepped in turns, each with the wait on its works that follows it (_wait_batch_p2p): GPipe posts every message
    alone, 1F1B most in twos (its one-message batches are its warm-up's and cool-down's only)."""
    import torch.distributed.pipelining.schedules as schedules

    from hw.run.runtimes import job_groups, runner_factory
    from hw.run.stage_runner import Groups, replica_batch

    m, groups = 16, Groups()
    model = host_stage("mlp", 2, 8 * m)
    schedules_made = [(s, job_groups("torch", s, groups)) for s in (TORCH.build(n, 2, m) for n in ("gpipe", "1f1b"))]
    spans: list[tuple[int, float]] = []  # every rank joins the group calls above
    waits: list[float] = []
    if rank < 2:
        steppers = []
        for schedule, made in schedules_made:
            runner, _, _ = runner_factory("torch")(schedule, model, rank, device, torch.float32, made)
            steppers.append((runner, replica_batch(model, schedule, 0, 1, device, torch.float32)))
        post, wait = schedules._batch_p2p, schedules._wait_batch_p2p

        def timed_post(p2p_ops: list[dist.P2POp], desc: str | None = None) -> list[dist.Work]:
            t0 = time.perf_counter()
            works = post(p2p_ops, desc)
            if p2p_ops:
                spans.append((len(p2p_ops), time.perf_counter() - t0))
            return works

        def timed_wait(work: list[dist.Work]) -> None:
            t0 = time.perf_counter()
            wait(work)
            if work:
                waits.append(time.perf_counter() - t0)

        for k in range(WARM + POSTED_STEPS):
            if k == WARM:
                schedules._batch_p2p, schedules._wait_batch_p2p, spans[:], waits[:] = timed_post, timed_wait, [], []
            for runner, io in steppers:
                runner.step(io)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
        schedules._batch_p2p, schedules._wait_batch_p2p = post, wait
    wait_s = statistics.median(waits) if waits else 0.0
    return [(n, span + wait_s) for n, span in spans]


def posting(calls: list[tuple[int, float]]) -> Posting:
    """op_s and batch_s from (messages, seconds) of posted batches: the medians' step from one message to two, and
    the rest of a one-message batch; all of it per message where the batches all hold one size."""
    by_size = {n: statistics.median(s for k, s in calls if k == n) for n in {k for k, _ in calls}}
    if 1 in by_size and 2 in by_size:
        op_s = min(max(by_size[2] - by_size[1], 0.0), by_size[1])
        return Posting(op_s, by_size[1] - op_s, True)
    return Posting(statistics.median(s / k for k, s in calls), 0.0, True)


def p2p_posting(device: str) -> tuple[Posting, list[tuple[int, float]]]:
    """What posting messages through torch's batch_isend_irecv path costs the host (two ranks), and the calls."""
    from hw.run.ranks import spawn

    per_rank = spawn(_p2p_worker, 2, (), device, timeout_s=60, deadline_s=300)
    calls = per_rank[0] + per_rank[1]
    return posting(calls), calls


def measure(base_p2p_s: float, device: str, gpus: int, rows: list[dict], grad_add_s: float = 0.0,
            ) -> tuple[RuntimeCosts, dict, dict[str, Fit], dict]:
    """torch's RuntimeCosts on this machine from the host-step probe's rows (hw.calibrate.host_steps, taken with torch's
    jobs), its raw rows, fits and provenance (message posts measured with 2+ GPUs)."""
    p2p, calls = p2p_posting(device) if gpus >= 2 else (Posting(base_p2p_s), None)
    costs, fits, provenance = runtime_costs(rows, p2p, grad_add_s)
    provenance |= {"batch_s": p2p.batch_s, "op_s": p2p.op_s}
    return costs, {"probes": rows, "p2p_s": p2p.op_s, "batch_s": p2p.batch_s, "p2p_calls": calls}, fits, provenance
