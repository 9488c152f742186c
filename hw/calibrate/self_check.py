"""Before `hw calibrate` writes a profile, the profile predicts the whole steps calibrate itself timed: hw's one-rank
GPipe and 1F1B of tiny MLP stages, each with its measured step (hw.calibrate.host_steps), run through the simulator
as `parsim predict` runs any step. Past BOUND, calibrate refuses to write (or, with --force, writes it marked)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from hw.calibrate.host import host_stage
from parsim.configuration import Configuration, predict
from parsim.errors import ParsimError
from parsim.profile import Profile

BOUND = 0.25  # the worst relative error of a predicted probe step a profile may have and be written without --force


@dataclass(frozen=True)
class SelfCheck:
    """The probes' steps, measured and predicted from the profile about to be written."""

    rows: tuple[dict, ...]  # schedule, microbatches, layers, recompute, measured_s, predicted_s, error
    median: float
    worst: float

    @property
    def passed(self) -> bool:
        return self.worst <= BOUND

    def summary(self) -> str:
        """One line: how far the profile predicts its own probes, and the worst of them."""
        w = max(self.rows, key=lambda r: abs(r["error"]))
        return (f"self-check: the profile predicts its {len(self.rows)} probe steps within {self.median:.1%} median, "
                f"{self.worst:.1%} worst ({w['schedule']}, {w['layers']} layers, m={w['microbatches']}"
                f"{', recomputed' if w['recompute'] != 'never' else ''}: {w['measured_s'] * 1e3:.2f} ms measured, "
                f"{w['predicted_s'] * 1e3:.2f} predicted)")

    def meta(self) -> dict:
        return {"bound": BOUND, "median": self.median, "worst": self.worst, "passed": self.passed,
                "rows": [dict(r) for r in self.rows]}


def self_check(profile: Profile, step_rows: list[dict]) -> SelfCheck | None:
    """hw's probe steps (host_steps.probe_rows) predicted from `profile`; None where there are none."""
    rows = []
    for r in step_rows:
        if r["runtime"] != "hw" or r["stages"] != 1:
            continue
        m, recompute = r["microbatches"], "always" if r.get("recomputed") else "never"
        config = Configuration(host_stage("mlp", r["layers"], 8 * m), r["schedule"], 1, m, recompute=recompute)
        predicted = predict(config, profile)[0].step_time_s
        rows.append({"schedule": r["schedule"], "microbatches": m, "layers": r["layers"], "recompute": recompute,
                     "measured_s": r["step_s"], "predicted_s": predicted, "error": predicted / r["step_s"] - 1})
    if not rows:
        return None
    errors = [abs(r["error"]) for r in rows]
    return SelfCheck(tuple(rows), statistics.median(errors), max(errors))


def verdict(check: SelfCheck, out: str, force: bool, enforced: bool = True) -> dict:
    """The check's record for the profile's meta; one clear error instead where it failed, is `enforced` (a GPU's
    calibration: a CPU's probes are too noisy to hold a GPU's bound) and not `force`d ("forced" marks it)."""
    record = check.meta()
    if check.passed or not enforced:
        return record
    if not force:
        raise ParsimError(f"{check.summary()}: past the {BOUND:.0%} bound, so {out} was not written; pass --force "
                          "to write it anyway, marked provisional")
    return record | {"forced": True}
