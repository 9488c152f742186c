"""A progress line on stderr for work that may run long (a large simulation, a sweep, a compare), where stderr is a
terminal: it appears once the work has run DELAY_S and a thread refreshes it, so it shows and its clock runs even
while one step (building a large schedule) takes seconds; it is cleared when the work ends, however it ends.

The long loops report without being handed anything: `phase` names what runs now, `watch` says how to count it
(the simulation's walk counts the actions it has settled); both do nothing while no line is shown.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any

DELAY_S = 0.5  # work shorter than this shows nothing
REFRESH_S = 0.25
CLOCK = "{desc}{elapsed}"  # the line while nothing is counted: what runs, and for how long

Count = Callable[[], tuple[int, int]]  # (done, total) of what runs now

_active: Progress | None = None
_lock = threading.Lock()  # held while the line is drawn; and across a fork, so no child inherits it held


class Progress:
    """The line for one command: `with Progress("predict"):` around its work."""

    def __init__(self, desc: str, unit: str = "action", show: bool | None = None):
        self.desc, self.unit = desc, unit
        self.phase, self.count = "", None  # type: str, Count | None
        self.show = sys.stderr.isatty() if show is None else show
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: Any = None  # a tqdm (untyped), made once the line is due

    def __enter__(self) -> Progress:
        global _active
        if self.show and _active is None:
            _active = self
            import tqdm  # noqa: F401 - here, not in the line's thread, where busy work would delay the import for seconds
            self._thread = threading.Thread(target=self._run, name="parsim-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        global _active
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        with _lock:
            if self._bar is not None:
                self._bar.close()
        _active = None

    def _run(self) -> None:
        if self._stop.wait(DELAY_S):
            return
        from tqdm import tqdm

        with _lock:
            self._bar = tqdm(desc=f"{self.desc}: ", unit=self.unit, unit_scale=True, file=sys.stderr, leave=False,
                             dynamic_ncols=True, mininterval=0, bar_format=CLOCK)
        while True:
            with _lock:
                self._draw()
            if self._stop.wait(REFRESH_S):
                return

    def _draw(self) -> None:
        bar, count = self._bar, self.count
        try:
            done, total = count() if count is not None else (0, None)
        except Exception:  # noqa: BLE001 - read while the work changes it: show the clock this time
            count, done, total = None, 0, None
        bar.total, bar.n = total, done
        bar.bar_format = None if count is not None else CLOCK
        bar.set_description(f"{self.desc}: {self.phase}" if self.phase else self.desc, refresh=False)
        bar.refresh()


def phase(text: str, count: Count | None = None) -> None:
    """Name what the command does now (and how to count it, if known); nothing while no line is shown."""
    if _active is not None:
        _active.phase, _active.count = text, count


def watch(count: Count) -> None:
    """Count what runs now by `count` (called from the line's thread: it must only read)."""
    if _active is not None:
        _active.count = count


def _forked_child() -> None:
    """A forked child shows no line of its parent's, and gets its own lock (the parent's was held at the fork)."""
    global _active, _lock
    _active, _lock = None, threading.Lock()


os.register_at_fork(before=lambda: _lock.acquire(), after_in_parent=lambda: _lock.release(),
                     after_in_child=_forked_child)
