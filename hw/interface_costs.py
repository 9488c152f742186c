"""`python -m hw calibrate --interfaces`: what the data-parallel and hogwild scenarios need, added to a profile.

The CPU's costs first (its probes fork processes, which must happen before CUDA starts in this one), then
the GIL's, on GPU 0's streams where there is a GPU, else with CPU ops. The rest of the profile is --base's.
"""

from __future__ import annotations

import dataclasses
import datetime
import platform
import sys
from pathlib import Path

import torch

from hw.gil import gil_costs
from hw.hogwild import cpu_costs, machine
from parsim.scenarios.interfaces import HOGWILD_MODEL
from parsim.profile import Profile, samples_path, save_profile

QUICK = {"spec": "1x16x8", "duration_s": 0.2, "stream_bytes": 8 << 20, "launches": 200, "rounds": 2}  # --cpu
FULL = {"spec": HOGWILD_MODEL, "duration_s": 1.0, "stream_bytes": 64 << 20, "launches": 2000, "rounds": 5}


def calibrate_interfaces(base: Profile, out: Path, quick: bool) -> int:
    size = QUICK if quick else FULL
    device = torch.device("cpu") if quick or not torch.cuda.is_available() else torch.device("cuda", 0)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    command = "python -m hw " + " ".join(sys.argv[1:])
    before = machine()
    cpu, cpu_raw = cpu_costs(size["spec"], size["duration_s"], size["stream_bytes"],
                             source=f"{before['cpu']}, {command}, {now}")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ops on {before['cpu']}"
    gil, gil_raw = gil_costs(device, launches=size["launches"], rounds=size["rounds"],
                             source=f"{name}, torch {torch.__version__}, {command}, {now}")
    profile = dataclasses.replace(base, gil=gil, cpu=cpu)
    meta = {"command": command, "date": now, "torch": torch.__version__, "python": platform.python_version(),
            "device": name, "machine_before": before, "machine_after": machine()}
    samples = samples_path(out)
    save_profile(profile, out, {"meta": meta, "gil": gil_raw, "cpu": cpu_raw})
    print(f"GIL ({name}): a launch {gil.launch_s * 1e6:.2f} us alone, {gil.contended_launch_s * 1e6:.2f} us per "
          f"launch with {gil.threads} threads; a thread started and joined in {gil.thread_s * 1e6:.1f} us"
          + (f"; replicate {gil.replicate_module_s * 1e6:.2f} us per module" if gil.replicate_module_s else ""))
    print(f"CPU ({before['cpu']}): {cpu.cores} cores, core speed "
          + ", ".join(f"{n}: {s:.2f}" for n, s in sorted(cpu.core_speed.items()))
          + f"; memory {cpu.core_bandwidth_Bps / 1e9:.1f} GB/s one core, {cpu.bandwidth_Bps / 1e9:.1f} GB/s all; "
          f"a Hogwild step of {cpu.step_model} {cpu.step_s * 1e3:.2f} ms")
    print(f"wrote {out} and {samples}")
    return 0
