"""Processes hw starts die with the process that started them, whatever ends it (a signal, SIGKILL, its deadline).

On Linux each child asks the kernel for a parent-death signal (prctl PR_SET_PDEATHSIG: SIGKILL once its parent is
gone, which nothing can miss or catch), then checks that its parent is still the one that started it: a parent
that died before the prctl has left it to init already. Elsewhere a thread polls for the same. Torch-free, so that
`hw`'s entry point sets it up before it imports torch; a spawned rank does as its first line, once the imports
its arguments need are done. Under torchrun nothing here is used: torchrun's agent ends its workers itself (it
signals their process group, SIGTERM then SIGKILL, on failure, restart and its own end).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_ENV = "HW_PARENT_PID"  # set for an `hw` command that another starts (hw validate's `hw calibrate`)


def die_with_parent(parent_pid: int) -> None:
    """End this process as soon as `parent_pid`, the process that started it, ends (and at once if it has).

    The kernel sends the signal when the parent's thread that started this process exits: hw starts its
    processes from its main thread, whose end is the process's.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            _poll_parent(parent_pid)
    else:
        _poll_parent(parent_pid)
    if os.getppid() != parent_pid:  # the parent died before the prctl: nothing will signal us
        os._exit(1)


def _poll_parent(parent_pid: int, every_s: float = 0.5) -> None:
    """Where the kernel cannot signal it: a thread that ends the process once its parent changes."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(every_s)
        os._exit(1)

    threading.Thread(target=watch, name="hw-parent-watch", daemon=True).start()


def child_env() -> dict[str, str]:
    """The environment for an `hw` command this process starts, which then dies with it (adopt_parent)."""
    return {**os.environ, PARENT_ENV: str(os.getpid())}


def adopt_parent() -> None:
    """In an `hw` command that another started (child_env): die with that one. The variable is removed, so that
    the processes this one starts do not mistake its starter for theirs."""
    parent = os.environ.pop(PARENT_ENV, None)
    if parent and parent.isdigit():
        die_with_parent(int(parent))
