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

from hw.interfaces.hogwild import ROUNDS, RUN_S, cpu_costs, machine
from hw.interfaces.launch_threads import (
    CALIBRATION_ROUNDS,
    CROWD_HOLDS_S,
    HOLDS_S,
    WINDOW_S,
    gil_costs,
    switch_share,
)
from parsim.profile import GilCosts, Profile, samples_path, save_profile
from parsim.scenarios.interfaces import HOGWILD_MODEL, LAUNCH_THREADS
from parsim.sim.gil import wake_cost


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How long and how often the CPU's probes (hw.interfaces.hogwild.cpu_costs) and the GIL's
    (hw.interfaces.launch_threads.gil_costs) run."""

    spec: str  # the Hogwild step's model
    duration_s: float  # one Hogwild run
    stream_bytes: int  # the memory-bandwidth probe's buffer
    cpu_rounds: int
    window_s: float  # one GIL timing window
    rounds: int  # GIL windows per probe
    holds_s: tuple[float, ...]
    crowd_holds_s: tuple[float, ...]


QUICK = Sizes("1x16x8", 0.2, 8 << 20, 1, 0.02, 2, (0.0, 32e-6), (32e-6,))  # --cpu: for tests
FULL = Sizes(HOGWILD_MODEL, RUN_S, 64 << 20, ROUNDS, WINDOW_S, CALIBRATION_ROUNDS, HOLDS_S, CROWD_HOLDS_S)


def _us(seconds: float | None, spec: str) -> str:
    """Seconds as microseconds formatted by `spec`; "?" where a cost was not timed."""
    return "?" if seconds is None else format(seconds * 1e6, spec)


def calibrate_interfaces(base: Profile, out: Path, quick: bool) -> int:
    """Time the CPU's and the GIL's costs here and write them into a copy of `base` at `out`, with the raw samples."""
    size = QUICK if quick else FULL
    device = torch.device("cpu") if quick or not torch.cuda.is_available() else torch.device("cuda", 0)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    command = "python -m hw " + " ".join(sys.argv[1:])
    before = machine()
    cpu, cpu_raw = cpu_costs(size.spec, size.duration_s, size.stream_bytes, size.cpu_rounds,
                             source=f"{before['cpu']}, {command}, {now}")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ops on {before['cpu']}"
    gil, gil_raw = gil_costs(device, size.window_s, size.rounds, size.holds_s,
                             source=f"{name}, torch {torch.__version__}, {command}, {now}",
                             crowd_holds_s=size.crowd_holds_s, experiment=LAUNCH_THREADS)
    profile = dataclasses.replace(base, gil=gil, cpu=cpu)
    meta = {"command": command, "date": now, "torch": torch.__version__, "python": platform.python_version(),
            "device": name, "machine_before": before, "machine_after": machine()}
    samples = samples_path(out)
    save_profile(profile, out, {"meta": meta, "gil": gil_raw, "cpu": cpu_raw})
    released = "not timed" if gil.released_s is None else f"{gil.released_s * 1e6:.2f} us of it without the GIL"
    print(f"GIL ({name}): a launch {gil.launch_s * 1e6:.2f} us alone, {released}; waking a thread whose core slept "
          + ", ".join(f"{s * 1e6:.0f} us: {c * 1e6:.1f} us" for s, c in gil.wake)
          + f"; {gil.cores} cores; a thread started and joined in {gil.thread_s * 1e6:.1f} us"
          + (f"; replicate {gil.replicate_module_s * 1e6:.2f} us per module" if gil.replicate_module_s else "")
          + f"; beyond their launches a module call {_us(gil.module_call_s, '.1f')} us, loss.backward() "
            f"{_us(gil.backward_call_s, '.1f')} us; a small matmul's launch {_us(gil.matmul_launch_s, '.1f')} us; "
            f"zero_grad {_us(gil.zero_grad_s, '.1f')} us (+{_us(gil.zero_grad_module_s, '.2f')} a module, "
            f"+{_us(gil.zero_grad_param_s, '.2f')} a tensor); a small Linear's forward "
            f"{_us(gil.linear_forward_s, '.1f')} us, its backward nodes {_us(gil.linear_backward_s, '.1f')} us; "
            f"the loss {_us(gil.loss_s, '.1f')} us")
    print("GIL launch curve (the model's contended launches follow it): "
          + ", ".join(f"{n} threads {s * 1e6:.2f} us" for n, s in gil.launch_curve) + " per launch")
    print(crowd_line(gil, gil_raw))
    print(f"CPU ({before['cpu']}): {cpu.cores} cores, core speed (the Hogwild step) "
          + ", ".join(f"{n}: {s:.2f}" for n, s in sorted(cpu.core_speed.items()))
          + f"; memory {cpu.core_bandwidth_Bps / 1e9:.1f} GB/s one core, {cpu.bandwidth_Bps / 1e9:.1f} GB/s all; "
          f"a Hogwild step of {cpu.step_model} {cpu.step_s * 1e3:.2f} ms")
    print(f"wrote {out} and {samples}")
    return 0


def crowd_line(gil: GilCosts, raw: dict) -> str:
    """The check the model does not use: many threads holding the GIL longer, read as the model reads them, beside
    the two-thread curve at the same idle time (equal if a wake-up's cost is set by the idle time alone), and how
    often the GIL changed hands in the two- and many-thread probes (the model: almost never)."""
    curve = wake_cost(gil.wake)
    n = raw["crowd_threads"]
    checks = ", ".join(f"{c['hold_s'] * 1e6:.0f} us: {c['cost_s'] * 1e6:.1f} us after {c['slept_s'] * 1e6:.0f} us idle "
                       f"(two threads' curve there: {curve(c['slept_s']) * 1e6:.1f} us)" for c in raw["crowd"])
    handed = {k: switch_share([r for h in raw["holds"] if h["threads"] == k for r in h["rounds"]])
              for k in (2, n)}
    return (f"check: {n} threads holding the GIL longer, each launch's extra cost: {checks or 'not probed'}; the GIL "
            f"changed hands at {handed[2]:.0%} of two threads' launches and {handed[n]:.0%} of {n} threads'")
