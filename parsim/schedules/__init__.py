"""Pipeline schedules as data: per-rank ordered lists of actions, by name.

`build` is the one door: a registered generator (parsim.schedules.generators), or a schedule
imported from torch.distributed.pipelining (parsim.schedules.from_torch: `torch:CLASS` or a CSV; loaded when
first asked for).
The generators and the importer depend on parsim.schedules.actions only.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from parsim.errors import ScheduleError
from parsim.schedules.actions import (
    ALL_OPS,
    COMM_OPS,
    COMPUTE_OPS,
    NEIGHBOUR,
    PAIRED_RECV,
    TORCH_PREFIX,
    Action,
    CommPlan,
    Op,
    Schedule,
    act,
    check_layout,
    paired_recv,
    place_messages,
    receives_at_use,
    valid_as_built,
    with_messages,
)
from parsim.schedules.generators import (
    dualpipev,
    dualpipev_orders,
    gpipe,
    interleaved_1f1b,
    interleaved_orders,
    interleaved_zb,
    looped_bfs,
    one_f_one_b,
    v_stage_to_rank,
    zb_h1,
    zbv,
)

__all__ = ["ALL_OPS", "COMM_OPS", "COMPUTE_OPS", "NEIGHBOUR", "PAIRED_RECV", "SCHEDULES", "SPLITS_BACKWARD",
           "TORCH_PREFIX", "VIRTUAL", "V_SHAPED", "Action", "CommPlan", "Op", "Schedule", "act", "build",
           "check_layout", "dualpipev", "dualpipev_orders", "gpipe", "interleaved_1f1b", "interleaved_orders",
           "interleaved_zb", "looped_bfs", "one_f_one_b", "paired_recv", "place_messages", "placement",
           "receives_at_use", "schedule_name", "v_stage_to_rank", "valid_as_built", "with_messages", "zb_h1", "zbv"]

SCHEDULES: dict[str, Callable[..., Schedule]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved-1f1b": interleaved_1f1b,
    "interleaved-zb": interleaved_zb,
    "zb-h1": zb_h1,
    "zbv": zbv,
    "dualpipev": dualpipev,
    "looped-bfs": looped_bfs,
}
VIRTUAL = {"interleaved-1f1b", "interleaved-zb", "looped-bfs"}  # schedules that take virtual_stages
V_SHAPED = {"zbv", "dualpipev"}  # two stages per GPU, placed by v_stage_to_rank
SPLITS_BACKWARD = {"interleaved-zb", "zb-h1", "zbv", "dualpipev"}  # run backwards as I and W (all or some)


def placement(name: str, num_ranks: int, virtual_stages: int | None = None) -> tuple[int, ...]:
    """Where each stage of the registered schedule `name` lives (its stage_to_rank), without building it:
    stage s on rank s mod p for the schedules that take virtual stages, a V for V_SHAPED, else one each."""
    key = name.lower()
    if key in VIRTUAL:
        return tuple(s % num_ranks for s in range(num_ranks * (virtual_stages or 2)))
    if key in V_SHAPED:
        return v_stage_to_rank(num_ranks)
    return tuple(range(num_ranks))



def _imported(name: str) -> bool:
    """Whether `name` asks for a schedule from torch: `torch:CLASS` or a torch schedule CSV file."""
    return name.startswith(TORCH_PREFIX) or name.lower().endswith(".csv")


def schedule_name(text: str) -> str:
    """argparse type for --schedule: a registered name, `torch:CLASS` or a torch schedule CSV file."""
    if text.lower() in SCHEDULES or _imported(text):
        return text
    raise argparse.ArgumentTypeError(f"unknown schedule {text!r}; choose one of {', '.join(sorted(SCHEDULES))}, "
                                     "torch:CLASS (a torch.distributed.pipelining schedule) or a schedule .csv")


def build(name: str, num_ranks: int, num_microbatches: int, virtual_stages: int | None = None) -> Schedule:
    """The schedule registered as `name`, or imported: `torch:CLASS` or a torch schedule CSV file.

    Generators are checked by the tests; simulate validates whatever it is given.
    """
    if _imported(name):
        from parsim.schedules import from_torch  # here: only an imported schedule needs its parser

        if name.startswith(TORCH_PREFIX):
            return from_torch.from_torch(name.removeprefix(TORCH_PREFIX), num_ranks, num_microbatches,
                                              virtual_stages)
        return from_torch.load_csv(name)
    key = name.lower()
    if key not in SCHEDULES:
        known = ", ".join(sorted(SCHEDULES))
        raise ScheduleError(f"unknown schedule {name!r}; choose one of: {known}")
    if key in VIRTUAL:
        return SCHEDULES[key](num_ranks, num_microbatches, virtual_stages or 2)
    per_rank = 2 if key in V_SHAPED else 1
    if virtual_stages not in (None, per_rank):
        raise ScheduleError(f"{key} runs {'two stages' if per_rank == 2 else 'one stage'} per GPU; "
                            f"--virtual-stages applies to {', '.join(sorted(VIRTUAL))}")
    return SCHEDULES[key](num_ranks, num_microbatches)
