"""A calibration's profile with its in-step slowdowns decided again by today's rule (hw.calibrate.layers.in_step_factor)
from the probe timings its meta records: where the rule now refuses a factor the calibration applied, that family's
layer costs are divided by it again (a stretched op's fixed time and rate, and so its samples' pricing, scale alike).
usage: python lab/any-machine/refused.py PROFILE OUT"""

from __future__ import annotations

import json
import sys

from hw.calibrate.layers import FAMILY, in_step_factor


def redecided(profile: dict) -> dict:
    """`profile` (its JSON) with each applied in-step factor replaced by the one today's rule gives."""
    slowdowns = profile["meta"]["in_step_slowdown"]
    for family, probe in slowdowns.items():
        if not probe.get("applied", True) or "host_s" not in probe:
            continue
        factor, evidence = in_step_factor(probe["fitted_s"], probe["in_step_s"], probe["host_s"], probe["lead_s"])
        ratio = factor / probe["factor"]
        for key, costs in profile["layers"].items():
            if FAMILY[key.split("@")[0]] == family:
                for op in costs.values():
                    op["fixed_s"] *= ratio
                    op["flops_per_s"] /= ratio
        slowdowns[family] = {**probe, "factor": factor, "evidence": evidence, "redecided_from": probe["factor"]}
    return profile


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        out = redecided(json.load(f))
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print({k: (round(v["factor"], 3), v["evidence"][:40]) for k, v in out["meta"]["in_step_slowdown"].items()})
