"""Running `python -m parsim` and `python -m hw` in this process, and checking the promise made for bad input:
one `error:` line on stderr, exit status 2, no traceback, nothing written."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def run(main: Callable[[list[str]], int], argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of main(argv); argparse's SystemExit is its exit status."""
    try:
        status = main(argv)
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    out, err = capsys.readouterr()
    return status, out, err


def tree(root: Path) -> dict[str, tuple[int, int] | None]:
    """Every file (with its size and modification time) and folder under root: what a command wrote shows."""
    found: dict[str, tuple[int, int] | None] = {}
    for folder, dirs, files in os.walk(root):
        found |= {os.path.relpath(os.path.join(folder, name), root): None for name in dirs}
        for name in files:
            info = os.lstat(os.path.join(folder, name))
            found[os.path.relpath(os.path.join(folder, name), root)] = (info.st_size, info.st_mtime_ns)
    return found


def one_error_line(status: int, out: str, err: str, message: str = "") -> str:
    """Assert the one-line refusal (exit 2, one `error:` line naming `message`, nothing on stdout); the line."""
    lines = err.splitlines()
    assert status == 2, (status, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and out == ""
    assert message in lines[0], lines[0]
    return lines[0]


def refused(main: Callable[[list[str]], int], argv: list[str], capsys, root: Path, message: str = "") -> str:
    """Assert main(argv) refuses with one line naming `message` and writes nothing under root; the line."""
    before = tree(root)
    line = one_error_line(*run(main, argv, capsys), message)
    assert tree(root) == before, "a refused command wrote or changed files"
    return line
