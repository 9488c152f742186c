"""Layer fits that fail are not used as they are: a profile must not price a layer by a fit its own samples
contradict (issue 50: a weight-grad fit with R^2 -0.32 and 9.9e21 FLOP/s once went into a profile).

A fit fails where its R^2 is under R2_MIN, its worst relative residual over WORST_MAX, or (on a GPU) its rate
over GPU_RATE_MAX. Its op then takes, in order: its kind's op where the key is a shape ("mlp@256" -> "mlp") whose
own fit holds; the base profile's op of the same key (carried); else it is kept, and named. The profile's meta lists
each fallback, and `parsim predict` says when a prediction leans on a kept one (parsim.workload.costs.poor_fits).
"""

from __future__ import annotations

import dataclasses

from hw.calibrate.fit import Fit
from parsim.profile import LayerCosts, Profile
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
    used: str  # "kind" (the key's kind's op), "base" (the base profile's), or "kept" (none to take)


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
        if kind != key and kind in layers and (kind, op) not in failed:
            source, used = layers[kind], "kind"
        elif base is not None and key in base.layers:
            source, used = base.layers[key], "base"
        else:
            done.append(Fallback(name, key, op, reason, "kept"))
            continue
        out[key] = dataclasses.replace(out[key], **{op: getattr(source, op)})
        done.append(Fallback(name, key, op, reason, used))
    return out, done


def describe(fallback: Fallback) -> str:
    """One line for calibrate's report."""
    what = {"kind": f"priced by {fallback.key.partition('@')[0]}'s", "base": "carried from the base profile",
            "kept": "kept: nothing to take instead (predictions using it say so)"}[fallback.used]
    return f"fit {fallback.fit} not used as fitted ({fallback.reason}): {what}"
