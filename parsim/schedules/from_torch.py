"""Schedules as torch.distributed.pipelining writes them, read into parsim's per-rank action lists.

Two sources: a schedule class name (`torch:ZBVZeroBubble`: asks torch's own generator, so torch
is imported here and only here), or the CSV torch's runtime dumps and loads (one line per rank,
actions such as `0F1`, `2SEND_B0`, `(0F3;3B1)OVERLAP_F_B`; no torch needed). Actions torch uses
for FSDP (UNSHARD, RESHARD, REDUCE_GRAD) cost nothing in parsim's model and are dropped; an
overlapped forward-backward pair runs as its two actions in order. Where the lists carry no
sends and receives, they are added as parsim's own generators place them: a receive just before
the compute that needs it (or earlier, so that a channel's messages arrive in the order they are
sent), a send just after the compute that produced it.
"""

from __future__ import annotations

import re
from pathlib import Path

from parsim.errors import ScheduleError
from parsim.inputs import read_text
from parsim.schedules.actions import COMM_OPS, COMPUTE_OPS, TORCH_PREFIX, Action, Schedule, act, place_messages

IGNORED = frozenset({"UNSHARD", "RESHARD", "REDUCE_GRAD"})
_ACTION = re.compile(r"^(\d{1,9})([A-Z_]+?)(\d{0,9})$")  # a stage or micro-batch past 10^9 is no schedule
_OVERLAP = re.compile(r"^\((.*)\)OVERLAP_F_B$")


def parse_action(text: str) -> list[Action]:
    """One of torch's action strings as parsim actions (none for FSDP-only ones, two for an overlap)."""
    text = text.strip()
    if text in ("", "None"):
        return []
    overlap = _OVERLAP.match(text)
    if overlap:
        return [a for part in overlap.group(1).split(";") for a in parse_action(part)]
    match = _ACTION.match(text)
    if not match:
        raise ScheduleError(f"cannot read torch action {text!r}")
    stage, kind, mb = match.groups()
    if kind in IGNORED:
        return []
    if kind not in COMPUTE_OPS | COMM_OPS or not mb:
        raise ScheduleError(f"torch action {text!r}: parsim knows F, B, I, W, SEND_F, RECV_F, SEND_B and RECV_B")
    return [act(kind, int(stage), int(mb))]


def from_rows(name: str, rows: list[list[str]], microbatches: int | None = None) -> Schedule:
    """A Schedule from per-rank lists of torch action strings; stage owners are read off the compute.

    Without `microbatches` the count is read off the actions too.
    """
    actions = [[a for text in row for a in parse_action(text)] for row in rows]
    if microbatches is not None:
        beyond = next((a for acts in actions for a in acts if a.microbatch >= microbatches), None)
        if beyond:
            raise ScheduleError(f"{name}: {beyond} names a micro-batch beyond the {microbatches} asked for "
                                "(torch's visualiser labels the last rank's 1F1B forwards one micro-batch late; "
                                "parsim's 1f1b runs torch's 1F1B order)")
    owner: dict[int, int] = {}
    for rank, acts in enumerate(actions):
        for a in acts:
            if a.op in COMPUTE_OPS and owner.setdefault(a.stage, rank) != rank:
                raise ScheduleError(f"{name}: stage {a.stage} computes on ranks {owner[a.stage]} and {rank}")
    if not owner:
        raise ScheduleError(f"{name}: no compute actions")
    stages = max(owner) + 1
    if stages > len(owner):  # found among the first len(owner) + 1, however large the stage numbers
        missing = next(s for s in range(len(owner) + 1) if s not in owner)
        raise ScheduleError(f"{name}: stage {missing} never computes")
    computes = sum(a.op in COMPUTE_OPS for acts in actions for a in acts)
    last = max(a.microbatch for acts in actions for a in acts)
    if microbatches is None and last >= computes:  # each micro-batch needs a compute action at least
        raise ScheduleError(f"{name}: {computes} compute actions cannot run micro-batches 0 to {last}; "
                            "micro-batches are numbered from 0 without gaps")
    stage_to_rank = tuple(owner[s] for s in range(stages))
    compute_only = not any(a.op in COMM_OPS for acts in actions for a in acts)
    placed = place_messages(actions, stage_to_rank) if compute_only else tuple(tuple(acts) for acts in actions)
    if microbatches is None:
        microbatches = 1 + max(a.microbatch for acts in placed for a in acts)
    return Schedule(name, stages, microbatches, stage_to_rank, placed)


def load_csv(path: str | Path) -> Schedule:
    """The CSV torch's _PipelineScheduleRuntime dumps: one line per rank, comma-separated actions."""
    text = read_text(path, "schedule", ScheduleError)
    rows = [line.split(",") for line in text.splitlines() if line.strip()]
    if not rows:
        raise ScheduleError(f"schedule {path} is empty")
    return from_rows(Path(path).name, rows)


def from_torch(class_name: str, num_ranks: int, num_microbatches: int,
               virtual_stages: int | None = None) -> Schedule:
    """torch.distributed.pipelining's own action lists for `class_name` (e.g. ZBVZeroBubble, DualPipeV)."""
    try:
        from torch.distributed.pipelining import _schedule_visualizer as visualizer
        from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class
    except ImportError:
        raise ScheduleError("torch schedules need torch: pip install torch") from None
    try:
        cls = get_schedule_class(class_name)
    except ValueError:
        raise ScheduleError(f"torch has no pipeline schedule {class_name!r}") from None
    single = issubclass(cls, PipelineScheduleSingle)
    if single and virtual_stages not in (None, 1):
        raise ScheduleError(f"torch's {class_name} runs one stage per GPU; --virtual-stages does not apply")
    try:  # the runtime that adds messages handles multi-stage schedules only
        ops = visualizer.get_schedule_ops(cls, num_ranks, num_microbatches, virtual_stages, with_comms=not single)
    except (ValueError, AssertionError, RuntimeError) as e:
        raise ScheduleError(f"torch's {class_name} with {num_ranks} ranks and {num_microbatches} "
                            f"micro-batches: {e}") from None
    rows = [[str(a) for a in row if a is not None] for row in ops]
    return from_rows(TORCH_PREFIX + class_name, rows, num_microbatches)
