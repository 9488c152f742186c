"""What a user hands in, read defensively: regular files only, bounded in size, UTF-8, JSON bounded in depth, and
every number checked for type, finiteness and range; each failure is one ParsimError naming the file, field and rule.

Models, profiles, schedule CSVs, results CSVs and traces are all read through here, so one rule holds for all of
them: a FIFO, a device (/dev/zero) or a folder is refused before it is opened for reading, and never blocks.
"""

from __future__ import annotations

import io
import json
import math
import os
import pkgutil
import re
import stat
from itertools import accumulate
from typing import Any

from parsim.errors import ParsimError

MAX_FILE_BYTES = 256 * 2**20  # any one input file (a profiler trace: once unzipped); past it, a mistake or a bomb
MAX_JSON_DEPTH = 64  # parsim's files nest 6 deep, torch traces and Hugging Face configs fewer
MAX_SIZE = 10**9  # a width, side, token, image, sequence, GPU or micro-batch count: past any machine, yet every
# FLOP count and byte count built from such sizes stays a finite float
MAX_LAYERS = 10**8  # layers in one model: each is an object in memory


def path_text(path: str | os.PathLike[str], what: str, error: type[ParsimError] = ParsimError) -> str:
    """`path` as a string, refusing an empty one (which would mean the current folder) and one no file system takes
    (a NUL byte, a character with no bytes)."""
    text = os.fspath(path)
    if not text:
        raise error(f"{what}: the path is empty")
    try:
        if b"\0" in os.fsencode(text):
            raise error(f"{what}: the path holds a NUL byte")
    except UnicodeEncodeError:
        raise error(f"{what}: {text!r} cannot be a file name") from None
    return text


def file_kind(mode: int) -> str:
    """What a file of this st_mode is, in words."""
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "a special file")


def read_bytes(path: str | os.PathLike[str], what: str, error: type[ParsimError] = ParsimError,
               limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them.

    A FIFO, device, socket or folder is refused from os.stat, and the file is opened O_NONBLOCK and checked
    again, so that nothing swapped in between can block or stream forever.
    """
    text = path_text(path, what, error)
    try:
        if not stat.S_ISREG(mode := os.stat(text).st_mode):
            raise error(f"{what} {text} is {file_kind(mode)}, not a regular file")
        fd = os.open(text, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise error(f"{what} {text} is {file_kind(info.st_mode)}, not a regular file")
            if info.st_size > limit:
                raise error(f"{what} {text} is {info.st_size:,} bytes, past the {limit:,} parsim reads")
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read(limit + 1)
        finally:
            os.close(fd)
    except OSError as e:
        raise error(f"cannot read {what} {text}: {e.strerror or e}") from None
    if len(data) > limit:  # it grew while read
        raise error(f"{what} {text} is past the {limit:,} bytes parsim reads")
    return data


def decode(data: bytes, what: str, error: type[ParsimError] = ParsimError) -> str:
    """UTF-8 text (a byte-order mark dropped); binary bytes are one clear error, not a UnicodeDecodeError."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise error(f"{what} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None
    if "\0" in text:
        raise error(f"{what} is not text (it holds a NUL byte at offset {text.index(chr(0))})")
    return text


def gunzip(data: bytes, what: str, error: type[ParsimError] = ParsimError, limit: int = MAX_FILE_BYTES) -> bytes:
    """gzip-compressed bytes unpacked, at most `limit` of them (a small file may unpack to gigabytes)."""
    import gzip  # here: most commands read no gzip file, and start sooner without it
    import zlib

    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
            out = f.read(limit + 1)
    except (OSError, EOFError, zlib.error) as e:
        raise error(f"{what} is not a readable gzip file ({e})") from None
    if len(out) > limit:
        raise error(f"{what} unpacks to more than the {limit:,} bytes parsim reads")
    return out


def read_text(path: str | os.PathLike[str], what: str, error: type[ParsimError] = ParsimError) -> str:
    """A regular file's UTF-8 text (see read_bytes and decode)."""
    return decode(read_bytes(path, what, error), f"{what} {os.fspath(path)}", error)


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def json_depth(text: str) -> int:
    """How deep the arrays and objects of a JSON text nest, found without parsing it (strings skipped)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def parse_json(text: str, what: str, error: type[ParsimError] = ParsimError, hint: str = "") -> Any:
    """JSON, its nesting bounded before it is parsed. NaN, Infinity and numbers past a float's range (1e400: inf)
    parse, so that the field checks below can name the field that holds them."""
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise error(f"{what} nests {depth:,} levels deep, past the {MAX_JSON_DEPTH} parsim reads")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{what} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}){hint}") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise error(f"{what} is not valid JSON ({e}){hint}") from None


def shipped_text(package: str, name: str) -> str:
    """A file shipped in `package` (`name` may hold /), read by the package's loader: as importlib.resources reads it,
    without importing that (and zipfile and tempfile), which would cost every command's start-up milliseconds."""
    data = pkgutil.get_data(package, name)
    assert data is not None, f"{package} is a package, with a loader that reads files"
    return data.decode()


def load_json(path: str | os.PathLike[str], what: str, error: type[ParsimError] = ParsimError, hint: str = "") -> Any:
    """A JSON file read by read_text and parse_json."""
    return parse_json(read_text(path, what, error), f"{what} {os.fspath(path)}", error, hint)


def shown(value: Any) -> str:
    """A value as an error message shows it: its repr, cut short."""
    big = isinstance(value, int) and abs(value) >= 10**30
    text = f"a {len(str(abs(value)))}-digit number" if big else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def whole(value: Any, where: str, lo: int = 1, hi: int = MAX_SIZE, error: type[ParsimError] = ParsimError) -> int:
    """A whole number in [lo, hi]: an int, not a bool and not a float such as 16.7 or 1.0."""
    problem = whole_problem(value, lo, hi)
    if problem:
        raise error(f"{where} {problem}")
    return int(value)


def whole_problem(value: Any, lo: int, hi: int) -> str | None:
    """Which rule `value` breaks as a whole number in [lo, hi] ("must be at least 1, got 0"), or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be a whole number, got {shown(value)}"
    if value < lo:
        return f"must be at least {lo:,}, got {shown(value)}"
    if value > hi:
        return f"must be at most {hi:,}, got {shown(value)}"
    return None


def number(value: Any, where: str, lo: float, hi: float, error: type[ParsimError] = ParsimError,
           above: bool = False, zero: bool = False) -> float:
    """A finite number (not a bool) in [lo, hi], or in (lo, hi] if `above`; or exactly 0 if `zero`."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) <= 1.7e308
    ok = ok and math.isfinite(value) and ((lo < value if above else lo <= value) and value <= hi
                                          or zero and value == 0)
    if not ok:
        rule = f"a finite number {f'above {lo:g}' if above else f'from {lo:g}'} to {hi:g}"
        raise error(f"{where} must be {'0 or ' if zero else ''}{rule}, got {shown(value)}")
    return float(value)


def text_field(value: Any, where: str, error: type[ParsimError] = ParsimError) -> str:
    """A string."""
    if not isinstance(value, str):
        raise error(f"{where} must be a string, got {shown(value)}")
    return value


def flag(value: Any, where: str, error: type[ParsimError] = ParsimError) -> bool:
    """A JSON true or false (not 1, 0 or "false")."""
    if not isinstance(value, bool):
        raise error(f"{where} must be true or false, got {shown(value)}")
    return value
