"""The cycle collector, paused around the simulator's large runs (apart from the machine model, so that a step the
longest-path walk settles loads no more than it needs)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Large runs allocate millions of objects that form no cycles once the run is over: the cycle
    collector only slows them down, while they are made and, when it is back on, by walking them all
    at its first pass (0.3 s for 1F1B 64 x 1024). So they are frozen out of its sight; refcounting
    still frees them."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.freeze()
            gc.enable()
