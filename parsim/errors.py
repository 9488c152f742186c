"""Errors a user can act on: the CLI prints their message as one line and exits with status 2."""

import unicodedata


class ParsimError(Exception):
    """Bad input or an impossible request, worded for the user."""


class ScheduleError(ParsimError):
    """A schedule that is malformed, incomplete or deadlocks."""


class ProfileError(ParsimError):
    """A profile file that is missing, corrupt, or of another schema version."""


class ModelError(ParsimError):
    """A model description that cannot be partitioned or costed."""


def one_line(message: str) -> str:
    """The message with every line break and control character escaped (a file name or flag value may hold them),
    so that it prints as one line."""
    return "".join(repr(c)[1:-1] if unicodedata.category(c) in ("Cc", "Zl", "Zp") and c != "\t" else c
                   for c in message)
