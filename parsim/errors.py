"""Errors a user can act on: the CLI prints their message as one line and exits with status 2."""


class ParsimError(Exception):
    """Bad input or an impossible request, worded for the user."""


class ScheduleError(ParsimError):
    """A schedule that is malformed, incomplete or deadlocks."""


class ProfileError(ParsimError):
    """A profile file that is missing, corrupt, or of another schema version."""


class ModelError(ParsimError):
    """A model description that cannot be partitioned or costed."""
