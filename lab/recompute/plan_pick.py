"""Issue 44's plan picks, measured scaled down on 2 GPUs (plan-pick.sh), against parsim's predictions of the same
configurations from a profile: step time, and each GPU's peak memory as `hw validate` predicts it (weights, the step's
gradients, activations, working memory), plus what mixed-precision Adam would add (its fp32 master weights and two
moments, 12 bytes a parameter: hw's runner runs no optimizer).
usage: python lab/recompute/plan_pick.py RUN_DIR [PROFILE ...]"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from parsim.configuration import Configuration, prepare
from parsim.profile import load_profile
from parsim.workload import microbatch_tokens, rank_peak_bytes
from parsim.workload.configs import named_model


def measured(log: Path) -> dict:
    """The `hw measure --json` report a pick's log ends with."""
    text = log.read_text()
    return json.loads(text[text.index("\n{") + 1:] if not text.startswith("{") else text)


def configuration(run: Path, report: dict) -> Configuration:
    """The configuration hw measured, its stages as hw split them."""
    c = report["config"]
    blocks = c["layers"] - 2  # the embedding and the head
    model = named_model(str(run / f"llama-3-8b-{blocks}.json"), 4096, c["tokens"])
    virtual = c["stages"] // c["gpus"]
    return Configuration(model, c["schedule"], c["gpus"], c["microbatches"], virtual if virtual > 1 else None,
                         partition=tuple(c["balance"]), recompute=c["recompute"])


def main(run: Path, profiles: list[str]) -> None:
    for name in profiles:
        profile = load_profile(name)
        print(f"profile {name}")
        for log in sorted(run.glob("pick*.log")):
            report = measured(log)
            prepared = prepare(configuration(run, report), profile)
            step = prepared.predict()[0].step_time_s
            peaks = prepared.runtime.peak_bytes(prepared.run_model, prepared.schedule, 1, "none",
                                                prepared.config.recompute)
            by_rank = {s["rank"]: s["peak_memory_bytes"] for s in report["per_stage"]}
            got = max(by_rank.values())
            adam = prepared.runtime.peak_bytes(prepared.run_model, prepared.schedule, 1, "adam",
                                               prepared.config.recompute)
            print(f"  {log.stem}: {report['config']['model']}, {report['config']['recompute']}: step measured "
                  f"{report['step_time_s']:.3f} s, predicted {step:.3f} s ({step / report['step_time_s'] - 1:+.1%}); "
                  f"peak per GPU measured {got / 2**30:.2f} GiB, predicted {peaks / 2**30:.2f} GiB "
                  f"({peaks / got - 1:+.1%}); with Adam's master weights and moments "
                  f"{adam / 1e9:.1f} GB predicted")
            print("    per rank: " + "; ".join(per_rank(prepared, by_rank)))


def per_rank(prepared: Any, measured_bytes: dict[int, int]) -> list[str]:
    """Each rank's measured peak against the runtime's walk of that rank (hw's: its sends held to the step's end)."""
    model, schedule = prepared.run_model, prepared.schedule
    peaks = rank_peak_bytes(model, schedule, microbatch_tokens(model, schedule.num_microbatches), "none",
                            prepared.config.recompute, prepared.runtime.keeps_outputs, prepared.runtime.holds_sends)
    return [f"rank {r} measured {measured_bytes[r] / 2**30:.2f} GiB, predicted {p / 2**30:.2f} GiB "
            f"({p / measured_bytes[r] - 1:+.1%})" for r, p in enumerate(peaks)]


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:] or ["data/calibration/nvidia-h200-x2-2026-11-28/profile.json"])
