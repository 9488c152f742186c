"""Affine fits of timings against work, and when a fit is poor."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from scipy.optimize import least_squares

from parsim.errors import ParsimError

POOR_FIT = 0.15  # a fit whose worst relative residual passes this is reported as poor


@dataclasses.dataclass(frozen=True)
class Fit:
    """seconds ~ fixed_s + work / rate, and how well that fits its samples."""

    fixed_s: float
    rate: float
    r2: float
    max_rel_residual: float
    points: tuple[tuple[float, float], ...] = dataclasses.field(default=(), repr=False)  # (work, seconds) fitted

    def record(self) -> dict[str, float]:
        """The fit's four numbers, as a profile's meta keeps them (its samples are kept apart)."""
        return {"fixed_s": self.fixed_s, "rate": self.rate, "r2": self.r2, "max_rel_residual": self.max_rel_residual}

    @property
    def poor(self) -> bool:
        """Whether the worst relative residual passes POOR_FIT."""
        return self.max_rel_residual > POOR_FIT


def fit_affine(work: Sequence[float], seconds: Sequence[float]) -> Fit:
    """seconds ~ fixed_s + work / rate, least squares on relative residuals (sizes span decades)."""
    w, t = np.asarray(work, float), np.asarray(seconds, float)
    if len(w) < 2 or np.any(t <= 0):
        raise ParsimError("a fit needs at least two positive timings")

    def residuals(p: np.ndarray) -> np.ndarray:
        return (p[0] + w * p[1]) / t - 1

    slope0 = max((t[-1] - t[0]) / max(w[-1] - w[0], 1e-30), 1e-30)
    sol = least_squares(residuals, x0=[t.min() / 2, slope0], bounds=([0, 1e-30], [np.inf, np.inf]))
    fixed, per_unit = sol.x
    pred = fixed + w * per_unit
    return Fit(float(fixed), float(1 / per_unit), r_squared(t, pred), float(np.max(np.abs(pred / t - 1))),
               tuple(zip(w.tolist(), t.tolist(), strict=True)))


def r_squared(measured: np.ndarray, predicted: np.ndarray) -> float:
    """The share of the measurements' variance a fit explains (1 - residual / total sum of squares)."""
    return float(1 - np.sum((measured - predicted) ** 2) / max(np.sum((measured - measured.mean()) ** 2), 1e-300))


WEIGHT_GRAD_FLOOR = 0.05  # of a sample's backward: below it, its weight-grad part is timing noise


def weight_grad_s(backward_s: float, input_grad_s: float) -> float:
    """A sample's weight-gradient time: its full backward less its input-gradient part, two timings apart. Where noise
    makes the difference vanish (a loaded CPU; two glitches in the committed GPU calibrations), it is floored at
    WEIGHT_GRAD_FLOOR of the backward, so that one sample cannot drive a relative fit, and its corrections, to zero."""
    return max(backward_s - input_grad_s, WEIGHT_GRAD_FLOOR * backward_s, 1e-9)
