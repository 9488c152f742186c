"""Recomputation (activation checkpointing, torchgpipe's `checkpoint`): a micro-batch's stage forward keeps only its
input, and its backward runs the forward again to rebuild what it frees.

The whole-stage modes are torchgpipe's: `always`, `except-last` (every micro-batch but the last, whose backward
torchgpipe runs first, right after its forward) and `never` (the default: every activation kept). The recompute
belongs to the action that first needs the activations: a whole backward B, or a split backward's input-grad I (its W
then uses what I's recomputed graph kept). It costs one more stage forward there on the GPU, and checkpointing's cost
on the host (parsim.sim.lower.action_extras). Under copy streams, a backward whose gradient arrives by a message
runs its forward again first, as its own op that waits for its stream but not for that gradient (torchgpipe's
Checkpoint/Recompute split: `early_recomputing_actions`), so it overlaps the gradient's copy.

`selective` is Megatron-LM's (Korthikanti et al. 2022): every micro-batch keeps everything but what each decoder
block's attention core alone keeps (a layer's `core_freed_bytes_per_token`), and every B or I runs the cores'
forward again (`core_parts`); a layer without an attention core (MLP, conv) keeps everything and recomputes nothing.
"""

from __future__ import annotations

from typing import Any

from parsim.errors import ParsimError
from parsim.schedules import Action, Op, Schedule
from parsim.workload.timed import is_timed

SELECTIVE = "selective"
MODES = ("never", "except-last", "always", SELECTIVE)
RECOMPUTED = {"except-last": "every micro-batch's forward but the last", "always": "every micro-batch's forward",
              SELECTIVE: "each decoder block's attention core"}
RECOMPUTING_OPS = frozenset({Op.BACKWARD, Op.BACKWARD_INPUT})


def check_mode(mode: str) -> str:
    """The mode, or one clear error naming the ones there are."""
    if mode not in MODES:
        raise ParsimError(f"unknown recompute mode {mode!r}; choose from {', '.join(MODES)}")
    return mode


def check_layers(mode: str, layers: tuple[Any, ...]) -> None:
    """One clear error where `mode` cannot be predicted for `layers`: selective on a profiled model, whose layers are
    timed whole (their attention cores are not priced apart)."""
    if mode == SELECTIVE and is_timed(layers):
        raise ParsimError("--recompute selective recomputes parsim's own transformer blocks' attention cores; a "
                          "profiled model's layers are timed whole, their cores not apart")


def loss_kept_bytes_per_token(layer: Any) -> int:
    """What a checkpointed stage still keeps of `layer` per sample: a head's loss (its fp32 log-softmax), which hw
    computes on the checkpointed stage's output, outside the checkpoint; nothing of any other layer."""
    return int(getattr(layer, "loss_stash_bytes_per_token", 0))


def recomputes(mode: str, microbatch: int, microbatches: int) -> bool:
    """Whether micro-batch `microbatch` (of `microbatches`) keeps only its input and is recomputed whole."""
    return mode == "always" or (mode == "except-last" and microbatch < microbatches - 1)


def recomputes_cores(mode: str) -> bool:
    """Whether every micro-batch frees its attention cores' own stash and its backward runs the cores again."""
    return mode == SELECTIVE


def splits_backward(schedule: Schedule) -> bool:
    """Whether some backward of `schedule` runs as input-grad and weight-grad apart: hw's runner recomputes whole
    backwards only (a W needs the module outputs its forward captured, which a checkpointed forward does not keep)."""
    return any(a.op == Op.BACKWARD_INPUT for acts in schedule.actions for a in acts)


def core_recomputing_actions(schedule: Schedule, mode: str) -> list[Action]:
    """The backward actions (B, or I where the backward is split: the core has no weights) that run their stage's
    attention cores again: every one under selective, else none."""
    if not recomputes_cores(check_mode(mode)):
        return []
    return [a for acts in schedule.actions for a in acts if a.op in RECOMPUTING_OPS]


def early_recomputing_actions(schedule: Schedule, mode: str, copy_streams: bool) -> list[Action]:
    """The recomputing backwards that, under copy streams, run their forward again before their gradient arrives:
    those whose gradient comes by a message (the next stage on another rank); none without copy streams, where the
    forward runs again inside the backward, after the gradient (torch.utils.checkpoint's order)."""
    if not copy_streams:
        return []
    owner, last = schedule.stage_to_rank, schedule.num_stages - 1
    return [a for a in recomputing_actions(schedule, mode) if a.stage < last and owner[a.stage + 1] != owner[a.stage]]


def recomputing_actions(schedule: Schedule, mode: str) -> list[Action]:
    """The backward actions (B, or I where the backward is split) that run their micro-batch's forward again."""
    if check_mode(mode) == "never":
        return []
    m = schedule.num_microbatches
    return [a for acts in schedule.actions for a in acts
            if a.op in RECOMPUTING_OPS and recomputes(mode, a.microbatch, m)]
