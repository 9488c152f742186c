"""Processes hw starts die with the process that started them, whatever ends it (a signal, SIGKILL, its deadline).

On Linux each child asks the kernel for a parent-death signal (parsim.interrupts.die_with_parent: prctl
PR_SET_PDEATHSIG, SIGKILL once its parent is gone, which nothing can miss or catch), then checks that its parent is
still the one that started it: a parent that died before the prctl has left it to init already. Elsewhere a thread
polls for the same. Torch-free, so that
`hw`'s entry point sets it up before it imports torch; a spawned rank does as its first line, once the imports
its arguments need are done. Under torchrun nothing here is used: torchrun's agent ends its workers itself (it
signals their process group, SIGTERM then SIGKILL, on failure, restart and its own end).
"""

from __future__ import annotations

import os

from parsim.interrupts import die_with_parent

PARENT_ENV = "HW_PARENT_PID"  # set for an `hw` command that another starts (hw validate's `hw calibrate`)


def child_env() -> dict[str, str]:
    """The environment for an `hw` command this process starts, which then dies with it (adopt_parent)."""
    return {**os.environ, PARENT_ENV: str(os.getpid())}


def adopt_parent() -> None:
    """In an `hw` command that another started (child_env): die with that one. The variable is removed, so that
    the processes this one starts do not mistake its starter for theirs."""
    parent = os.environ.pop(PARENT_ENV, None)
    if parent and parent.isdigit():
        die_with_parent(int(parent))
