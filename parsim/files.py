"""Atomic file writes: a reader (or a crash) never sees half a file, and nothing is left behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from parsim.errors import ParsimError


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write via a temporary file in the same folder, then rename it over `path`."""
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.is_dir():
        raise ParsimError(f"cannot write {p}: folder {folder} does not exist")
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_png(fig, path: str | os.PathLike) -> None:
    """Lay out a matplotlib figure, write it as a PNG atomically, and close it."""
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    write_atomic(path, buf.getvalue())
