"""The host probe: a host-bound step `hw validate` times in every turn, to read the host's speed in that turn.

hw's runner on tiny MLP blocks leaves the GPUs idle, so its step is the host's loop; measured over predicted, it is
the turn's host speed against the profile's, and a point predicted "at the measured host speed" has every host cost
scaled by it: the model told how fast the host ran, not fitted to the point."""

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
