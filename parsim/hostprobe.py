"""The host probe: a host-bound step that `hw validate` takes in every turn, beside the points it measures.

The lent VMs' host speed drifts up to 1.9x within minutes (data/host-noise/); two turns of one grid a minute apart
ran the very same one-stage program 1.48x apart (data/validation/h200x2-2026-11-23-runtimes/grid/: GPipe and 1F1B
at one micro-batch). No model of a step predicts that. The probe measures it: hw's runner on tiny MLP blocks (8
per rank, 64 wide, 8 micro-batches of 8 rows) leaves the GPUs idle, so its step is the host's loop; its measured
step over its predicted one is the host's speed in that turn against the profile's. A point's prediction "at the
measured host speed" is the profile's with every host cost scaled by that ratio: the model, told how fast the
host ran, not fitted to the point.
"""

from __future__ import annotations

from parsim.profile import Profile
from parsim.schedules import Schedule, gpipe
from parsim.workload import Model, mlp_model

LAYERS_PER_RANK, HIDDEN, MICROBATCHES, ROWS = 8, 64, 8, 8


def probe(gpus: int) -> tuple[Schedule, Model]:
    """The probe on `gpus` ranks: its schedule and model."""
    return gpipe(gpus, MICROBATCHES), mlp_model(LAYERS_PER_RANK * gpus, HIDDEN, ROWS * MICROBATCHES)


def host_speed(probe_s: float, gpus: int, profile: Profile) -> float:
    """How much slower than `profile` says the host ran: the probe's measured step over its prediction."""
    from parsim.configuration import Configuration, predict

    _, model = probe(gpus)
    return probe_s / predict(Configuration(model, "gpipe", gpus, MICROBATCHES), profile)[0].step_time_s


def at_host_speed(profile: Profile, probe_s: float, gpus: int) -> Profile:
    """`profile` with every host cost scaled to the speed the probe measured."""
    return profile.with_host_slower(host_speed(probe_s, gpus, profile))
