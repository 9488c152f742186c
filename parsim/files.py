"""Output files: checked before any work starts, written atomically with the user's umask, several all or none.

A reader (or a crash) never sees half a file, a failed command leaves nothing behind, and JSON is strict (no NaN
or Infinity, which strict parsers reject).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, overload

if TYPE_CHECKING:
    from matplotlib.figure import Figure

from parsim.errors import ParsimError
from parsim.inputs import file_kind, path_text


def _umask() -> int:
    mask = os.umask(0o022)  # the only way to read it is to set it: put it straight back
    os.umask(mask)
    return mask


def check_output(path: str | os.PathLike[str], what: str = "output") -> Path:
    """Refuse, before any work, an output path that cannot be written: empty, a name too long, a folder (or a FIFO
    or device), a name ending in a slash, or in a folder that is missing or not writable."""
    text = path_text(path, what)
    p = Path(text)
    folder = p.parent
    if text.endswith(os.sep) or p.name in ("", ".", ".."):
        raise ParsimError(f"cannot write {what} {text}: it names a folder, not a file")
    try:
        name_max = os.pathconf(folder, "PC_NAME_MAX") if folder.is_dir() else 255
    except (OSError, ValueError):
        name_max = 255
    if len(os.fsencode(p.name)) > name_max:
        raise ParsimError(f"cannot write {what}: its name is {len(os.fsencode(p.name))} bytes long, past the "
                          f"{name_max} this file system allows")
    try:
        if not folder.is_dir():
            raise ParsimError(f"cannot write {what} {p}: folder {folder} does not exist")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ParsimError(f"cannot write {what} {p}: folder {folder} is not writable")
        mode = os.stat(p).st_mode if os.path.exists(p) else None  # a dangling link is replaced, as rename does
    except OSError as e:
        raise ParsimError(f"cannot write {what} {p}: {e.strerror or e}") from None
    if mode is not None and not stat.S_ISREG(mode):  # a rename would put a file where a folder, FIFO or device was
        raise ParsimError(f"cannot write {what} {p}: it is {file_kind(mode)}, not a regular file")
    return p


def _temporary(p: Path) -> tuple[int, str]:
    """An open temporary file beside `p`, with the mode a new file gets under the user's umask (not mkstemp's 0600)."""
    import tempfile  # here: a command that writes no file starts sooner without it

    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name[:64]}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
    except OSError:
        os.close(fd)
        os.unlink(tmp)
        raise
    return fd, tmp


def _fill(fd: int, data: str | bytes) -> None:
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())


_kept: list[Path] = []  # every file put in place in this process (write_atomic, record_kept), in order


def record_kept(path: str | os.PathLike[str]) -> None:
    """Note a file put in place by other means than write_atomic (a rank's trace moved into place)."""
    _kept.append(Path(path))


def kept_files() -> list[Path]:
    """The files this process has put in place and that are still there: what a late failure leaves behind."""
    return [p for p in dict.fromkeys(_kept) if p.exists()]


def write_atomic(path: str | os.PathLike[str], data: str | bytes, what: str = "output") -> None:
    """Write via a temporary file in the same folder, then rename it over `path`; any failure is one ParsimError
    and leaves nothing behind."""
    p = check_output(path, what)
    try:
        fd, tmp = _temporary(p)
    except OSError as e:
        raise ParsimError(f"cannot write {what} {p}: {e.strerror or e}") from None
    try:
        _fill(fd, data)
        os.replace(tmp, p)
        record_kept(p)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise ParsimError(f"cannot write {what} {p}: {e.strerror or e}") from None
        raise


@contextlib.contextmanager
def folder_made(path: str | os.PathLike[str], what: str = "--out") -> Iterator[Path]:
    """`path` as a folder, made with any missing parents; those made are removed again, where empty, if the block
    fails, so that a refused command leaves nothing behind."""
    folder = Path(path_text(path, what))
    try:
        missing = [p for p in (folder, *folder.parents) if not p.exists() and not p.is_symlink()]  # deepest first
        if folder not in missing and not folder.is_dir():
            raise ParsimError(f"cannot use {what} {folder}: it is not a folder")
    except OSError as e:
        raise ParsimError(f"cannot use {what} {folder}: {e.strerror or e}") from None
    try:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ParsimError(f"cannot make {what} folder {folder}: {e.strerror or e}") from None
        yield folder
    except BaseException:
        for made in missing:
            with contextlib.suppress(OSError):
                made.rmdir()
        raise


class Outputs:
    """A command's output files, all or none: each is checked and opened (as a temporary beside it) when added,
    before the work; `write` fills it, and leaving the `with` block renames every one into place, or, on an
    error, removes them all."""

    def __init__(self) -> None:
        self._open: dict[Path, tuple[int, str, str]] = {}  # path -> (fd, temporary, what)
        self._filled: dict[Path, str] = {}  # path -> its filled temporary

    @overload
    def add(self, path: str | os.PathLike[str], what: str) -> Path: ...

    @overload
    def add(self, path: None, what: str) -> None: ...

    def add(self, path: str | os.PathLike[str] | None, what: str) -> Path | None:
        """Check `path` now (None: no such output) and hold its temporary; the Path to `write` later."""
        if path is None:
            return None
        p = check_output(path, what)
        if any(p.resolve() == q.resolve() for q in self._open):
            raise ParsimError(f"{what} {p} is already another output of this command")
        try:
            fd, tmp = _temporary(p)
        except OSError as e:
            raise ParsimError(f"cannot write {what} {p}: {e.strerror or e}") from None
        self._open[p] = (fd, tmp, what)
        return p

    def write(self, path: Path, data: str | bytes) -> None:
        """Fill the output added as `path` (moved into place when the block ends)."""
        fd, tmp, what = self._open.pop(path)
        try:
            _fill(fd, data)
        except OSError as e:
            Path(tmp).unlink(missing_ok=True)
            raise ParsimError(f"cannot write {what} {path}: {e.strerror or e}") from None
        self._filled[path] = tmp

    def __enter__(self) -> Outputs:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        if error is None and self._open:  # an output added but never written: a bug, not a user's error
            self._discard()
            raise AssertionError(f"outputs never written: {', '.join(map(str, self._open))}")
        if error is not None:
            self._discard()
            return
        try:
            for path, tmp in list(self._filled.items()):
                os.replace(tmp, path)
                del self._filled[path]
        except OSError as e:
            self._discard()
            raise ParsimError(f"cannot write {path}: {e.strerror or e}") from None

    def _discard(self) -> None:
        for fd, tmp, _ in self._open.values():
            os.close(fd)
            Path(tmp).unlink(missing_ok=True)
        for tmp in self._filled.values():
            Path(tmp).unlink(missing_ok=True)
        self._open.clear()
        self._filled.clear()


def _nonfinite_at(obj: Any, where: str = "") -> str | None:
    """The key path of the first NaN or infinity in a JSON-able object, or None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return where or "(the value)"
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for key, value in items:
        found = _nonfinite_at(value, f"{where}.{key}" if where else str(key))
        if found:
            return found
    return None


def json_text(obj: Any, indent: int | None = None, what: str = "output") -> str:
    """`obj` as strict JSON: a NaN or infinity is a ParsimError naming where it is, never `NaN` or `Infinity`."""
    try:
        return json.dumps(obj, indent=indent, allow_nan=False)
    except ValueError:
        raise ParsimError(f"{what} would hold a non-finite number at {_nonfinite_at(obj)}; "
                          "nothing written") from None


def nonfinite_to_null(obj: Any) -> Any:
    """`obj` with every NaN or infinity replaced by None: for raw records (samples, meta) that may hold them."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: nonfinite_to_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [nonfinite_to_null(v) for v in obj]
    return obj


def png_bytes(fig: Figure) -> bytes:
    """Lay out a matplotlib figure, render it as a PNG, and close it."""
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        fig.tight_layout()
        fig.savefig(buf, format="png", dpi=120)
    finally:
        plt.close(fig)
    return buf.getvalue()
