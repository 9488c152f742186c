"""`python -m parsim`: see parsim.cli."""

import signal

# First, before the imports below: Ctrl-C ends a command that has not started yet at once and quietly, as SIGTERM and
# SIGHUP do (the shell reports 130); the command's own handling takes over in parsim.cli.run_command.
signal.signal(signal.SIGINT, signal.SIG_DFL)

import sys  # noqa: E402

from parsim.cli import main  # noqa: E402

sys.exit(main())
