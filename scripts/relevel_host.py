"""Re-derive a profile's hw host costs from its own calibration samples, as `hw calibrate` now does
(hw.calibrate.host_steps): the level (per step, per action, per layer) from the whole host-bound steps of hw's runner
that the calibration timed, the spans giving each op's share of a layer. For profiles calibrated before calibrate did
so, whose samples hold those steps (taken with `--runtimes torch`: samples.runtimes.torch.probes). The profile is
rewritten atomically; its meta gains the level. MLP layers are leveled; other kinds keep their spans' costs (as
calibrate does).
GRAD_ADD_S (default: the profile's host.grad_add_s) is what each stage's first backward of a step saves per layer
(hw.calibrate.host.grad_add_host): the fits take it off, and the profile carries it (listed as carried_from_base
where it is not the calibration's own); 0 levels them as calibrate did before 2026-11-25. The torch runtime's costs
are refitted too where the samples hold its steps.

usage: python scripts/relevel_host.py PROFILE OUT [SAMPLES [GRAD_ADD_S]]   (SAMPLES: PROFILE's stem + .samples.json)
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hw.calibrate.host_steps import hw_level, leveled  # noqa: E402
from hw.calibrate.torch_runtime import Posting, runtime_costs  # noqa: E402
from parsim.profile import LayerCosts, load_profile, save_profile  # noqa: E402


def relevel(profile_path: Path, out: Path, samples_path: Path, grad_add_s: float | None = None) -> str:
    """Write the profile to `out` with its host level from its samples; a line saying what changed."""
    doc = json.loads(samples_path.read_text())
    rows = doc["samples"].get("host_steps") or doc["samples"]["runtimes"]["torch"]["probes"]
    profile = load_profile(profile_path)
    given = grad_add_s is not None and grad_add_s != profile.host.grad_add_s  # not this calibration's own
    grad_add_s = grad_add_s if given else profile.host.grad_add_s
    mlp = profile.layers["mlp"]
    spans = {"forward_s": mlp.forward.host_s, "backward_input_s": mlp.backward_input.host_s,
             "backward_s": mlp.backward_input.host_s + mlp.backward_weight.host_s,
             "split_backward_s": profile.host.split_backward_s}
    if "host_level" in doc["samples"]:  # leveled already: undo it, so that the spans are the calibration's own
        spans = {k: v / doc["samples"]["host_level"]["span_scale"] for k, v in spans.items()}
    level = hw_level(rows, spans["forward_s"] + spans["backward_s"], grad_add_s)
    host = leveled(spans, level)
    def leveled_layer(c: LayerCosts) -> LayerCosts:  # its own GPU costs, the level's host costs
        return LayerCosts(*(dataclasses.replace(op, host_s=s) for op, s in (
            (c.forward, host["forward_s"]), (c.backward_input, host["backward_input_s"]),
            (c.backward_weight, host["backward_s"] - host["backward_input_s"]))))

    layers = {k: leveled_layer(v) if k.split("@")[0] == "mlp" else v for k, v in profile.layers.items()}
    new_host = dataclasses.replace(profile.host, action_s=level.action_s, step_s=level.step_s,
                                   split_backward_s=host["split_backward_s"], grad_add_s=grad_add_s,
                                   after_backward_s=level.after_backward_s, **level.recompute_costs())
    meta = {**profile.meta, "host_level": {"by": f"scripts/relevel_host.py from {samples_path}",
                                           **dataclasses.asdict(level), "grad_add_s": grad_add_s}}
    if given and grad_add_s:
        meta["carried_from_base"] = list(meta.get("carried_from_base") or []) + ["host.grad_add_s"]
    runtimes = dict(profile.runtimes)
    if "torch" in runtimes and any(r["runtime"] == "torch" for r in rows):
        spec = runtimes["torch"]
        torch_costs, _, _ = runtime_costs(rows, Posting(spec.p2p_s, spec.batch_s, "p2p_s" not in spec.unmeasured),
                                          grad_add_s)
        runtimes["torch"] = torch_costs
    save_profile(dataclasses.replace(profile, layers=layers, host=new_host, meta=meta, runtimes=runtimes), out)
    return (f"{out}: per layer {(spans['forward_s'] + spans['backward_s']) * 1e6:.0f} -> {level.per_layer_s * 1e6:.0f}"
            f" us, per action {profile.host.action_s * 1e6:.0f} -> {level.action_s * 1e6:.0f} us, per step"
            f" {profile.host.step_s * 1e6:.0f} -> {level.step_s * 1e6:.0f} us (whole-step fit R^2 {level.fit.r2:.4f})")


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4, 5):
        sys.exit(__doc__)
    src = Path(sys.argv[1])
    print(relevel(src, Path(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) >= 4 else
                  src.with_name(src.stem + ".samples.json"), float(sys.argv[4]) if len(sys.argv) == 5 else None))
