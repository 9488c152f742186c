"""Re-derive a profile's MLP GPU costs from its own calibration's stage samples, as `hw calibrate` now does
(hw.calibrate.stage_probe): each probed shape's eager costs follow hw's runner's 8-block stages (the in-step slowdown,
no longer applied to them, is reported against them as a check), and the graphed runtimes' ratios are taken against the
new eager costs. For calibrations taken before calibrate did so, whose samples hold the stages (taken with `--runtimes
graphs`: samples.graphs.gpu). The profile is written atomically; its meta says what was refit and from what.

usage: python scripts/refit_stages.py PROFILE OUT [SAMPLES]      (SAMPLES default: PROFILE's stem + .samples.json)
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hw.calibrate.graphs_runtime import gpu_ratios  # noqa: E402
from hw.calibrate.layers import IN_STEP_MODELS, in_step_factor, stretched  # noqa: E402
from hw.calibrate.stage_probe import stage_corrections  # noqa: E402
from parsim.profile import load_profile, save_profile  # noqa: E402
from parsim.workload import stage_costs  # noqa: E402


def refit(profile_path: Path, out: Path, samples_path: Path) -> str:
    """Write the profile to `out` with its MLP costs refit from its stage samples; a line saying what changed."""
    samples = json.loads(samples_path.read_text())["samples"]
    rows = samples.get("stages") or samples["graphs"]["gpu"]
    profile = load_profile(profile_path)
    slow = samples["in_step_slowdown"]["mlp"]

    def mlp_times(layers: dict, factor: float) -> dict:
        return {**layers, **stretched({k: v for k, v in layers.items() if k.split("@")[0] == "mlp"},
                                      {"mlp": {"factor": factor}})}

    applied = slow["factor"] if slow.get("applied", True) else 1.0
    layers = stage_corrections(mlp_times(profile.layers, 1 / applied), rows)
    fitted = stage_costs(IN_STEP_MODELS["mlp"](), 1, 1, dataclasses.replace(profile, layers=layers))[0]
    factor, _ = in_step_factor(fitted.forward.gpu_s + fitted.backward.gpu_s, slow["in_step_s"],
                               slow.get("host_s", 0.0), slow.get("lead_s", 0.0))  # a check, as calibrate's
    new = dataclasses.replace(profile, layers=layers)
    ratios = gpu_ratios(samples["graphs"]["gpu"], new) if "graphs" in samples else {}
    runtimes = {k: (dataclasses.replace(v, gpu_ratios=ratios[k]) if k in ratios else v)
                for k, v in new.runtimes.items()}
    meta = dict(new.meta)
    meta["refit"] = (f"MLP costs from the calibration's stage samples by scripts/refit_stages.py (in-step slowdown "
                     f"x{applied:.3f} applied before; now a check, x{factor:.3f})")
    save_profile(dataclasses.replace(new, runtimes=runtimes, meta=meta), out)
    return (f"wrote {out}: {len({r['hidden'] for r in rows})} widths refit from their stages; in-step slowdown "
            f"x{applied:.3f} applied before, x{factor:.3f} against the stages (a check, as calibrate now reports it)")


def main() -> None:
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__.strip().splitlines()[-1])
    profile = Path(sys.argv[1])
    samples = Path(sys.argv[3]) if len(sys.argv) == 4 else profile.with_name(profile.stem + ".samples.json")
    print(refit(profile, Path(sys.argv[2]), samples))


if __name__ == "__main__":
    main()
