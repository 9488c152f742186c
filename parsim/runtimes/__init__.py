"""Pipeline runtimes, by name: what runs a schedule on the host, and so where its messages sit, what waits on
what, and what the host pays per action and per message (parsim.runtimes.base).

`hw` is hw's own eager runner (the default); `torch` is torch.distributed.pipelining's; `graphs` is hw's
runner replaying each action as a CUDA graph, `graphs-step` a one-GPU step as one graph.
"""

from __future__ import annotations

import argparse

from parsim.errors import ParsimError
from parsim.runtimes.base import Runtime, run_by
from parsim.runtimes.eager import EAGER
from parsim.runtimes.graphs import GRAPHS, STEP_GRAPH
from parsim.runtimes.torch_pipelining import TORCH

__all__ = ["DEFAULT_RUNTIME", "RUNTIMES", "Runtime", "get_runtime", "run_by", "runtime_help", "runtime_name"]

RUNTIMES: dict[str, Runtime] = {r.name: r for r in (EAGER, TORCH, GRAPHS, STEP_GRAPH)}
DEFAULT_RUNTIME = EAGER.name


def get_runtime(name: str) -> Runtime:
    """The runtime registered as `name`, or one clear error naming the known ones."""
    if name not in RUNTIMES:
        raise ParsimError(f"unknown runtime {name!r}; choose one of: {', '.join(RUNTIMES)}")
    return RUNTIMES[name]


def runtime_name(text: str) -> str:
    """argparse type for --runtime."""
    if text in RUNTIMES:
        return text
    raise argparse.ArgumentTypeError(f"unknown runtime {text!r}; choose one of: {', '.join(RUNTIMES)}")


def runtime_help() -> str:
    """The --runtime flag's help: each runtime's one line."""
    return "what runs the schedule: " + "; ".join(f"{r.name}: {r.summary}" for r in RUNTIMES.values()) + \
        f" (default {DEFAULT_RUNTIME})"
