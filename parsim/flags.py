"""argparse types for parsim's and hw's flags: whole numbers and numbers in sane ranges, non-empty lists and paths.

A bad value is argparse's one-line error naming the flag and the rule (parsim.cli.OneLineErrors), before any work.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from parsim.inputs import MAX_SIZE, shown, whole_problem

MAX_SECONDS = 10**6  # --timeout: about 11 days; past it, waits overflow the clock's types


def whole(lo: int = 1, hi: int = MAX_SIZE) -> Callable[[str], int]:
    """A type for a whole number in [lo, hi] ("16"; not "16.7", "1e3", "" or "true")."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {shown(text)}") from None
        problem = whole_problem(value, lo, hi)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = "whole number"  # argparse names the type so in its own errors
    return parse


def whole_list(lo: int = 1, hi: int = MAX_SIZE) -> Callable[[str], list[int]]:
    """A type for comma-separated whole numbers in [lo, hi], at least one, no empty item ("4,8"; not "," or "4,,8")."""
    item = whole(lo, hi)

    def parse(text: str) -> list[int]:
        items = text.split(",")
        if not text.strip() or any(not t.strip() for t in items):
            raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas, got {shown(text)}")
        return [item(t) for t in items]

    parse.__name__ = "list of whole numbers"
    return parse


def number(lo: float, hi: float) -> Callable[[str], float]:
    """A type for a finite number above lo and at most hi (no nan, inf or 1e400)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {shown(text)}") from None
        if not (math.isfinite(value) and lo < value <= hi):
            raise argparse.ArgumentTypeError(f"must be a finite number above {lo:g} and at most {hi:g}, "
                                             f"got {shown(text)}")
        return value

    parse.__name__ = "number"
    return parse


def path(text: str) -> str:
    """A type for a file or folder name: not empty (which would quietly mean the current folder or no file)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a file name, got an empty string")
    if "\0" in text:
        raise argparse.ArgumentTypeError("a file name cannot hold a NUL byte")
    return text


positive_int = whole(1)
seconds = number(0, MAX_SECONDS)
