"""SIGTERM and SIGHUP unwind a command as Ctrl-C does: its `finally` blocks stop the processes it started and
remove its temporary files, and it exits with 128 + the signal's number, as a shell reports a killed command."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

STOPPING = (signal.SIGTERM, signal.SIGHUP)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class Stopped(BaseException):
    """A termination signal, raised where the main thread runs (like KeyboardInterrupt, not an Exception, so
    that `except Exception` clauses let it through)."""

    def __init__(self, signum: int):
        super().__init__(signum)  # its one argument: a copy made from its args (SimPy re-raises so) is the same
        self.signum = signum

    def __str__(self) -> str:
        return f"stopped by {signal.Signals(self.signum).name}"

    @property
    def status(self) -> int:
        return 128 + self.signum


def _raise(signum: int, frame: object) -> None:
    raise Stopped(signum)


@contextmanager
def stopping() -> Iterator[None]:
    """While the block runs, Ctrl-C raises KeyboardInterrupt and SIGTERM and SIGHUP raise Stopped in the main thread
    (elsewhere: nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.signal(s, _raise) for s in STOPPING}
    before[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def default_signals() -> None:
    """In a forked child: the default actions again, so that SIGTERM from its parent ends it at once rather than
    unwinding the copy of the parent's stack it inherited."""
    for s in STOPPING:
        signal.signal(s, signal.SIG_DFL)


def note(e: BaseException, text: str) -> None:
    """Add to what the one-line report of an interruption says (e.g. which processes it stopped)."""
    notes = getattr(e, "__notes__", None)
    if notes is None:
        notes = e.__notes__ = []  # type: ignore[attr-defined]
    notes.append(text)


def describe(e: BaseException, what: str) -> str:
    """`what` ("interrupted", "stopped by SIGTERM") with the notes the unwinding added, as one line."""
    return "; ".join([what, *getattr(e, "__notes__", ())])


def die_with_parent(parent_pid: int) -> None:
    """End this process as soon as `parent_pid`, the process that started it, ends (and at once if it has).

    The kernel sends the signal when the parent's thread that started this process exits: parsim and hw
    start their processes from the main thread, whose end is the process's.
    """
    if sys.platform.startswith("linux"):
        import ctypes  # here: only the processes parsim and hw start load it

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

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
