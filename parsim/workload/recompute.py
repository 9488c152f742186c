"""Recomputation (activation checkpointing, torchgpipe's `checkpoint`): a micro-batch's stage forward keeps only its
input, and its backward runs the forward again to rebuild what it frees.

The modes are torchgpipe's: `always`, `except-last` (every micro-batch but the last, whose backward torchgpipe runs
first, right after its forward) and `never` (the default: every activation kept). The recompute belongs to the action
that first needs the activations: a whole backward B, or a split backward's input-grad I (its W then uses what I's
recomputed graph kept). It costs one more stage forward there on the GPU, and checkpointing's cost on the host
(parsim.sim.lower.action_extras).
"""

from __future__ import annotations

from parsim.errors import ParsimError
from parsim.schedules import Action, Op, Schedule

MODES = ("never", "except-last", "always")
RECOMPUTED = {"except-last": "every micro-batch's forward but the last", "always": "every micro-batch's forward"}
RECOMPUTING_OPS = frozenset({Op.BACKWARD, Op.BACKWARD_INPUT})


def check_mode(mode: str) -> str:
    """The mode, or one clear error naming the ones there are."""
    if mode not in MODES:
        raise ParsimError(f"unknown recompute mode {mode!r}; choose from {', '.join(MODES)}")
    return mode


def recomputes(mode: str, microbatch: int, microbatches: int) -> bool:
    """Whether micro-batch `microbatch` (of `microbatches`) keeps only its input and is recomputed."""
    return mode == "always" or (mode == "except-last" and microbatch < microbatches - 1)


def splits_backward(schedule: Schedule) -> bool:
    """Whether some backward of `schedule` runs as input-grad and weight-grad apart: hw's runner recomputes whole
    backwards only (a W needs the module outputs its forward captured, which a checkpointed forward does not keep)."""
    return any(a.op == Op.BACKWARD_INPUT for acts in schedule.actions for a in acts)


def recomputing_actions(schedule: Schedule, mode: str) -> list[Action]:
    """The backward actions (B, or I where the backward is split) that run their micro-batch's forward again."""
    if check_mode(mode) == "never":
        return []
    m = schedule.num_microbatches
    return [a for acts in schedule.actions for a in acts
            if a.op in RECOMPUTING_OPS and recomputes(mode, a.microbatch, m)]
