"""`python -m hw {measure,calibrate,scenario,validate,profile}`: run parsim's schedules with PyTorch, measure,
calibrate, and time a user's own model."""

from __future__ import annotations

import signal

if __name__ == "__main__":  # `python -m hw`, not an import of main (the tests'): leave their process's handler be
    # First, before the imports below (torch's among them): Ctrl-C ends a command that has not started yet at once
    # and quietly, as SIGTERM and SIGHUP do (the shell reports 130); parsim.cli.run_command's handling takes over.
    signal.signal(signal.SIGINT, signal.SIG_DFL)

import argparse  # noqa: E402
import importlib  # noqa: E402
import importlib.util  # noqa: E402
import sys  # noqa: E402
from types import ModuleType  # noqa: E402

from hw.run.teardown import adopt_parent  # noqa: E402
from parsim.cli import OneLineErrors, run_command  # noqa: E402
from parsim.errors import ParsimError  # noqa: E402

# subcommand -> (module exposing add_arguments(parser) and main(args) -> int, the question it answers)
COMMANDS = {
    "measure": ("hw.measure.command", "How long does this pipeline step take on these GPUs (or on the CPU)?"),
    "calibrate": ("hw.calibrate.command",
                  "What does this machine cost (layers, host, links)? Writes a parsim profile."),
    "scenario": ("hw.measure.scenarios", "What does a textbook experiment measure here, beside parsim's prediction?"),
    "validate": ("hw.measure.validate", "How close are parsim's predictions to a grid of steps measured here?"),
    "profile": ("hw.usermodel.command",
                "What does my own model cost here, layer by layer? Writes a model file parsim predicts."),
}


def parser_for(chosen: str | None) -> tuple[argparse.ArgumentParser, ModuleType | None]:
    """The full parser for the chosen subcommand only: the others' modules (and torch) stay unloaded."""
    parser = OneLineErrors(prog="python -m hw", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineErrors)
    module = None
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
    return parser, module


NO_TORCH = 'error: `python -m hw` runs PyTorch, which is not installed here; install it with: pip install ".[hw]"'


def _has_torch() -> bool:
    """Whether torch can be imported: checked before any parsing, so that even `--help` says what to install."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken or half-removed install
        return False


def main(argv: list[str] | None = None) -> int:
    adopt_parent()  # started by another hw command (hw validate's calibration): die with it
    if not _has_torch():
        print(NO_TORCH, file=sys.stderr)
        return 2
    argv = sys.argv[1:] if argv is None else argv
    parser, module = parser_for(argv[0] if argv and argv[0] in COMMANDS else None)
    args = parser.parse_args(argv)
    from hw.run.ranks import under_torchrun  # torch is loaded by now: the chosen command's module imports it

    try:
        launched = under_torchrun()
    except ParsimError as e:  # a launcher's environment, partial or malformed: before anything starts
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.command != "measure" and launched:
        print(f"error: `hw {args.command}` starts its own processes; run it without torchrun "
              "(only `hw measure` runs as torchrun's ranks)", file=sys.stderr)
        return 2
    assert module is not None  # parse_args exits unless a command was chosen, and its module is loaded
    return run_command(module.main, args)


if __name__ == "__main__":
    sys.exit(main())
