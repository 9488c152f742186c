"""What a scenario is: a textbook experiment simulated from a profile, its figures named as
hw.measure.scenarios measures them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from parsim.errors import ProfileError
from parsim.profile import KernelCost, Profile


@dataclass(frozen=True)
class ScenarioResult:
    name: str
    figures: dict[str, float]  # seconds, or a plain ratio where the key says so
    headline: str  # the key of the figure to compare with measurement
    description: str
    assumptions: tuple[str, ...] = ()  # what the model takes as given, printed with the figures


def first_line(doc: str | None) -> str:
    """A docstring's first line: what a scenario function describes itself as."""
    return (doc or "").partition("\n")[0]


def need_host(profile: Profile, field: str) -> float:
    value: float | None = getattr(profile.host, field)
    if value is None:
        raise ProfileError(f"this profile has no host.{field}; the scenarios need it: "
                           "re-run `python -m hw calibrate` to measure it")
    return value


def need_kernel(profile: Profile, kind: str) -> KernelCost:
    if kind not in profile.kernels:
        raise ProfileError(f"this profile has no kernels.{kind} cost; the scenarios need it: "
                           "re-run `python -m hw calibrate` to measure it")
    return profile.kernels[kind]


def with_op_costs(profile: Profile, costs: dict[str, Any]) -> Profile:
    """`profile` with the host and kernel costs that `python -m hw.calibrate.kernels` measured (its JSON)."""
    try:
        host = dataclasses.replace(profile.host, launch_s=float(costs["host"]["launch_s"]),
                                   sync_s=float(costs["host"]["sync_s"]))
        kernels = {k: KernelCost(float(v["fixed_s"]), float(v["rate"])) for k, v in costs["kernels"].items()}
    except (KeyError, TypeError, ValueError) as e:
        raise ProfileError(f"op-cost measurements are malformed ({type(e).__name__}: {e})") from None
    return dataclasses.replace(profile, host=host, kernels={**profile.kernels, **kernels})


def compare_figures(predicted: ScenarioResult, measured: dict[str, float]) -> list[tuple[str, float, float, float]]:
    """(figure, predicted, measured, relative error) for every figure both sides have."""
    return [(k, predicted.figures[k], v, predicted.figures[k] / v - 1)
            for k, v in measured.items() if k in predicted.figures]
