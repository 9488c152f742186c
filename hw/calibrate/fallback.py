"""Layer fits that fail are not used as they are: a profile must not price a layer by a fit its own samples
contradict (issue 50: a weight-grad fit with R^2 -0.32 and 9.9e21 FLOP/s once went into a profile).

A fit fails where its R^2 is under R2_MIN, its worst relative residual over WORST_MAX, or (on a GPU) its rate
over GPU_RATE_MAX. Its op is then priced, in order: by its own samples (measured_points: exact at each size timed,
the line through the two largest beyond them), which needs two sizes; by its kind's op where the key is a shape
("mlp@256" -> "mlp") whose own fit holds; by the base profile's op of the same key (carried); else it is kept, and
named. This machine's samples come first: a carried op is another machine's. The profile's meta lists each
fallback, and `parsim predict` says when a prediction leans on a kept one (parsim.workload.costs.poor_fits).
"""

from __future__ import annotations

import dataclasses
import statistics

from hw.calibrate.fit import Fit
from parsim.profile import LayerCosts, OpCost, Profile
from parsim.workload import OPS

R2_MIN = 0.97
WORST_MAX = 1.0  # a residual of 100%: the fit is off by the whole sample
GPU_RATE_MAX = 5e15  # FLOP/s (or elements/s): above any GPU's dense bf16 peak (H200 ~1e15)


@dataclasses.dataclass(frozen=True)
class Fallback:
    """One failed layer fit and what the profile prices its op by instead."""

    fit: str  # its name, as calibrate prints it
    key: str  # the layer key ("mlp@256", "llama")
    op: str  # forward, backward_input or backward_weight
    reason: str
    used: str  # "points" (its samples), "kind" (the key's kind's op), "base" (the base profile's) or "kept"


def failure(fit: Fit, gpu: bool) -> str | None:
    """Why `fit` may not price a layer, or None where it holds."""
    if not fit.r2 >= R2_MIN:
        return f"R^2 {fit.r2:.3f} < {R2_MIN}"
    if not fit.max_rel_residual <= WORST_MAX:
        return f"worst residual {fit.max_rel_residual:.0%} > {WORST_MAX:.0%}"
    if gpu and fit.rate > GPU_RATE_MAX:
        return f"rate {fit.rate:.3g}/s > {GPU_RATE_MAX:.0e}/s, past any GPU"
    return None


def layer_fit(name: str, layers: dict[str, LayerCosts]) -> tuple[str, str] | None:
    """The (layer key, op) a fit's name prices (layers.fitted_costs' and transformer's names), or None."""
    head, _, op = name.rpartition(" ")
    if head and op in OPS and head in layers:
        return head, op
    op, _, width = name.partition("@")  # an MLP's: "forward", "backward_weight@256"
    key = f"mlp@{width}" if width else "mlp"
    return (key, op) if op in OPS and key in layers else None


def fall_back(layers: dict[str, LayerCosts], fits: dict[str, Fit], base: Profile | None, gpu: bool,
              ) -> tuple[dict[str, LayerCosts], list[Fallback]]:
    """The layers with each failed fit's op replaced as the module says, and what was done; `base` None: nothing is
    carried (a CPU calibration takes nothing from a GPU's profile)."""
    failed = {}
    for name, fit in fits.items():
        where = layer_fit(name, layers)
        reason = failure(fit, gpu) if where else None
        if where and reason:
            failed[where] = (name, reason)
    out, done = dict(layers), []
    for (key, op), (name, reason) in failed.items():
        kind = key.partition("@")[0]
        own = measured_points(getattr(layers[key], op), fits[name])
        if own is not None:
            cost, used = own, "points"
        elif kind != key and kind in layers and (kind, op) not in failed:
            cost, used = getattr(layers[kind], op), "kind"
        elif base is not None and key in base.layers:
            cost, used = getattr(base.layers[key], op), "base"
        else:
            done.append(Fallback(name, key, op, reason, "kept"))
            continue
        out[key] = dataclasses.replace(out[key], **{op: cost})
        done.append(Fallback(name, key, op, reason, used))
    return out, done


def measured_points(cost: OpCost, fit: Fit) -> OpCost | None:
    """`cost` priced by the samples its failed `fit` was made from: through each size timed (its corrections) and,
    beyond the largest, along the line through the two largest, where the GPU is busiest and time grows with work;
    None under two sizes. Any in-step slowdown since the fit (cost's rate over the fit's) stays applied, and a cost
    that already follows its shape's own points (corrections) keeps its value at them."""
    slow = fit.rate / cost.flops_per_s
    if cost.corrections:
        points = [(w, cost.gpu_s(w)) for w, _ in cost.corrections]
    else:
        by_work: dict[float, list[float]] = {}
        for w, t in fit.points:
            by_work.setdefault(w, []).append(t * slow)
        points = sorted((w, statistics.median(ts)) for w, ts in by_work.items())
    if len(points) < 2:
        return None
    (w0, t0), (w1, t1) = points[-2:]
    per_work = (t1 - t0) / (w1 - w0)
    fixed = t1 - per_work * w1
    if not (per_work > 0 and fixed >= 0):  # flat or falling at the top, or steeper than from nothing: through zero
        fixed, per_work = 0.0, t1 / w1
    corrections = tuple((w, t / (fixed + w * per_work)) for w, t in points)
    return OpCost(cost.host_s, fixed, 1 / per_work, corrections)


def carry_failed(profile: Profile, fits: dict[str, Fit], base: Profile | None) -> tuple[Profile, list[Fallback]]:
    """`profile` with each link, collective and host recompute cost whose fit failed (failure, no rate bound: bytes
    and layers per second) carried from `base` where it has one, else kept; what was done (key "link NAME" or
    "host.recompute_s", op "")."""
    links, collectives, host, done = dict(profile.links), dict(profile.collectives), profile.host, []
    for name, fit in fits.items():
        reason = failure(fit, gpu=False)
        if reason is None:
            continue
        link = name.removeprefix("link ")
        if name.startswith("link ") and base is not None and link in base.links:
            links[link] = dataclasses.replace(base.links[link], measured=False)
            done.append(Fallback(name, name, "", reason, "base"))
        elif name.startswith("link ") and base is not None and link in base.collectives:
            collectives[link] = dataclasses.replace(base.collectives[link], measured=False)
            done.append(Fallback(name, name, "", reason, "base"))
        elif name == "host hw recompute" and base is not None and base.host.recompute_s > 0:
            host = dataclasses.replace(host, recompute_s=base.host.recompute_s,
                                       recompute_call_s=base.host.recompute_call_s)
            done.append(Fallback(name, "host.recompute_s", "", reason, "base"))
        elif name.startswith("link ") or name == "host hw recompute":
            done.append(Fallback(name, name, "", reason, "kept"))
    return dataclasses.replace(profile, links=links, collectives=collectives, host=host), done


def describe(fallback: Fallback) -> str:
    """One line for calibrate's report."""
    what = {"points": "priced by its samples (the line through the two largest beyond them)",
            "kind": f"priced by {fallback.key.partition('@')[0]}'s", "base": "carried from the base profile",
            "kept": "kept: nothing to take instead (predictions using it say so)"}[fallback.used]
    return f"fit {fallback.fit} not used as fitted ({fallback.reason}): {what}"
