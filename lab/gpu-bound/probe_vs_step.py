"""Does calibrate's stage probe run a stage as fast as a GPU-bound step does? (issue 12's worst GPU-bound point)

    python lab/gpu-bound/probe_vs_step.py OUT.json [ROUNDS]

On one GPU, in rounds: calibrate's stage probe of 8 MLP blocks at h=4096 and 4096 tokens (hw.calibrate.stage_probe, as
`hw calibrate` times it), then hw's runner stepping 16x4096x16384 under GPipe at 4 micro-batches (4096 tokens each:
the same shape), each action's GPU time logged, and the GPU's clock and temperature read beside each. The 16-block
step's forward and backward per micro-batch, halved, set beside the probe's 8-block ones say whether the probe's
load (a short run of single steps) clocks the GPU as the step's does; a step's first backward against its later
ones (which add into the gradients the first wrote) is what the gradient add costs in the step.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's hw and parsim, run from anywhere
import torch  # noqa: E402

from hw.run.stage_runner import local_runner  # noqa: E402
from hw.calibrate.stage_probe import StageSpans, stage_samples  # noqa: E402
from parsim.schedules import Op, gpipe  # noqa: E402
from parsim.workload import mlp_model  # noqa: E402

HIDDEN, TOKENS, MICROBATCHES, STEPS = 4096, 16384, 4, 4


def gpu_state() -> dict:
    """The GPU's SM clock (MHz), temperature (C) and power (W) now."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,temperature.gpu,power.draw",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout.split(",")
    return dict(zip(("sm_mhz", "temp_c", "power_w"), (float(v) for v in out))) if len(out) == 3 else {}


def step_actions(device: torch.device, dtype: torch.dtype) -> dict:
    """Median GPU time of a forward and a backward of the 16-block step, per micro-batch, over STEPS steps, timed as
    the stage probe times its steps (hw.calibrate.stage_probe.StageSpans)."""
    runner, io = local_runner(mlp_model(16, HIDDEN, TOKENS), gpipe(1, MICROBATCHES), device, dtype)
    spans = StageSpans(device)
    for k in range(2 + STEPS):
        spans.step(runner, io, timed=k >= 2)
    torch.cuda.synchronize(device)
    per_op = spans.actions.seconds()
    forwards, backwards = per_op[0, Op.FORWARD], per_op[0, Op.BACKWARD]
    first = backwards[::MICROBATCHES]  # each step's first backward writes the gradients; the others add into them
    adding = [b for k, b in enumerate(backwards) if k % MICROBATCHES]
    forward_s, backward_s = spans.actions_s()
    return {"forward_s": forward_s, "backward_s": backward_s,
            "first_backward_s": statistics.median(first), "adding_backward_s": statistics.median(adding),
            "forwards_s": forwards, "backwards_s": backwards, "after": gpu_state()}


def main() -> None:
    out, rounds = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 3
    device, dtype = torch.device("cuda"), torch.bfloat16
    runs = []
    for r in range(rounds):
        before = gpu_state()
        probe = [row for row in stage_samples(device, dtype, [HIDDEN], graphed=False) if row["tokens"] == 4096][0]
        probe["after"] = gpu_state()
        step = step_actions(device, dtype)
        runs.append({"round": r, "before": before, "probe": probe, "step": step})
        ratio_f = step["forward_s"] / 2 / probe["eager_forward_s"]
        ratio_b = step["backward_s"] / 2 / probe["eager_backward_s"]
        print(f"round {r}: probe F {probe['eager_forward_s'] * 1e3:.2f} B {probe['eager_backward_s'] * 1e3:.2f} ms "
              f"({probe['after']}); step per 8 blocks F {step['forward_s'] * 5e2:.2f} B {step['backward_s'] * 5e2:.2f} "
              f"ms ({step['after']}); step/probe F {ratio_f:.3f} B {ratio_b:.3f}; step's first backward "
              f"{step['first_backward_s'] * 1e3:.2f} ms, adding ones {step['adding_backward_s'] * 1e3:.2f} ms", flush=True)
        time.sleep(2)
    meta = {"command": " ".join(sys.argv), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "gpu": torch.cuda.get_device_name(device)}
    out.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
