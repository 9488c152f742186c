"""Fill the generated blocks of README.md and docs/*.md from the code and the committed data.

    python scripts/refresh_docs.py           rewrite every block in place (after a flag, profile or data change)
    python scripts/refresh_docs.py --check   change nothing; exit 1, naming each block that differs

A block is the text between a marker comment and `<!-- end -->`; the marker says what fills it:

  <!-- help: parsim predict -->  `python -m parsim predict --help` at 100 columns, in a text block
  <!-- run -->                   the block's `$ python -m parsim ...` line, run against the shipped profile, then
                                 its output (`| head -n N` or `| tail -n N` keeps part of it). Files the command
                                 writes (--trace, --plot, --out) go to a temporary folder, shown under the name
                                 the command gave, except those under docs/ (the pictures), which a refresh writes.
  <!-- run: FILE -->             the same, and a refresh keeps the picture its --plot draws as FILE (the one the
                                 document shows), so that the command a reader copies writes outside the repository
  <!-- log: FILE -->             an excerpt of FILE, the log of a GPU run: each line after `$ ...` must be one of
                                 FILE's lines (`...` skips some); checked, never rewritten, being a measurement
  <!-- measured: FILE -->        `hw measure`'s text report of FILE, a report it wrote with --json on a GPU
  <!-- accuracy -->              a table whose 2nd column links a results CSV of `hw validate`: columns 3-5 become
                                 its points (GPU-bound ones), median / worst error over all of them and over the
                                 GPU-bound ones, re-predicted from the shipped profile as `parsim compare` does
  <!-- accuracy: PROFILE -->     the same, re-predicted from PROFILE (the calibration of the machine it ran on)
  <!-- profile -->               two tables of the shipped profile's figures (parsim/profiles/default.json)
FILE is relative to the document's folder, as its links are.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ("README.md", "docs/*.md")  # docs/lab/ is the record of past leases, never regenerated
BLOCK = re.compile(r"<!-- (help|run|log|measured|accuracy|profile)(?:: (.*?))? -->\n(.*?)<!-- end -->", re.S)
OUTPUT_FLAGS = ("--trace", "--plot", "--out")
HELP_COLUMNS = "100"


class DocError(Exception):
    """A block that cannot be filled: its command fails, or its excerpt is not in its log."""


class Block(NamedTuple):
    """One generated block of a document: what fills it, and what it holds now (a tuple: the script loads by path)."""

    path: Path
    kind: str
    arg: str
    body: str
    line: int

    @property
    def name(self) -> str:
        return f"{shown(self.path)}:{self.line} {self.kind}{': ' + self.arg if self.arg else ''}"


def shown(path: Path) -> Path:
    """The path from the repository's root, where it lies inside it."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def documents(root: Path = ROOT) -> list[Path]:
    return sorted(p for pattern in DOCUMENTS for p in root.glob(pattern))


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    return [Block(path, m[1], (m[2] or "").strip(), m[3], text.count("\n", 0, m.start()) + 1)
            for m in BLOCK.finditer(text)]


def fenced(lines: list[str]) -> str:
    return "```text\n" + "".join(line.rstrip() + "\n" for line in lines) + "```\n"


def fence_lines(body: str) -> list[str]:
    """The lines inside a block's fenced code block."""
    lines = body.strip("\n").splitlines()
    if len(lines) < 2 or not lines[0].startswith("```") or lines[-1] != "```":
        raise DocError("the block must hold one fenced code block")
    return lines[1:-1]


def command_of(body: str) -> str:
    lines = [line for line in fence_lines(body) if line.startswith("$ ")]
    if len(lines) != 1:
        raise DocError("the block needs one `$ command` line")
    return lines[0][2:]


# --- help ---------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def columns(width: str) -> Iterator[None]:
    """argparse wraps help at $COLUMNS: fix it, so the text does not depend on the terminal."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = width
    try:
        yield
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def help_text(command: str) -> str:
    """What `python -m {command} --help` prints: command is `parsim`, `parsim predict`, `hw measure`, ..."""
    tool, *sub = command.split()
    if tool == "parsim":
        from parsim.cli import build_parser as parsim_parser

        parser = parsim_parser()
    elif tool == "hw":
        from hw.__main__ import parser_for as hw_parser

        parser = hw_parser(sub[0] if sub else None)[0]
    else:
        raise DocError(f"unknown tool {tool!r}: help blocks name `parsim ...` or `hw ...`")
    out = io.StringIO()
    with columns(HELP_COLUMNS), contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        parser.parse_args([*sub, "--help"])
    if not out.getvalue().startswith("usage:"):
        raise DocError(f"`python -m {command} --help` printed no help")
    return out.getvalue()


def fill_help(block: Block, refresh: bool) -> str:
    return fenced(help_text(block.arg).splitlines())


# --- run ----------------------------------------------------------------------------------------------------

def split_pipe(command: str) -> tuple[list[str], tuple[str, int] | None]:
    """`python -m parsim ARGS [| head -n N | tail -n N]` -> (ARGS, (head or tail, N) or None)."""
    words = shlex.split(command)
    pipe = None
    if "|" in words:
        at = words.index("|")
        words, rest = words[:at], words[at + 1:]
        if len(rest) != 3 or rest[0] not in ("head", "tail") or rest[1] != "-n" or not rest[2].isdigit():
            raise DocError(f"only `| head -n N` or `| tail -n N` may follow the command, got {' '.join(rest)!r}")
        pipe = (rest[0], int(rest[2]))
    if words[:3] != ["python", "-m", "parsim"]:
        raise DocError(f"a run block runs `python -m parsim ...`, got {command!r}")
    return words[3:], pipe


def redirected(argv: list[str], scratch: Path, keep_under: Path | None) -> tuple[list[str], dict[str, str]]:
    """argv with each output file or folder moved into scratch (unless under keep_under); scratch path -> shown."""
    out, shown = list(argv), {}
    for i, word in enumerate(argv[:-1]):
        if word in OUTPUT_FLAGS:
            given = argv[i + 1]
            if keep_under is not None and (ROOT / given).resolve().is_relative_to(keep_under):
                (ROOT / given if word == "--out" else (ROOT / given).parent).mkdir(parents=True, exist_ok=True)
                continue
            target = scratch / f"{i}-{Path(given).name or 'out'}"
            if word == "--out":
                target.mkdir()
            out[i + 1] = str(target)
            shown[str(target)] = given
    return out, shown


@contextlib.contextmanager
def in_folder(path: Path) -> Iterator[None]:
    """cwd at path for a while (contextlib.chdir, which Python 3.10 lacks)."""
    old = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def run_parsim(argv: list[str], keep_under: Path | None = None, figure: Path | None = None) -> str:
    """What `python -m parsim argv` prints, run in this process from the repository's root; its --plot kept as
    `figure` where one is named."""
    from parsim.cli import main

    if figure is not None and "--plot" not in argv[:-1]:
        raise DocError(f"`python -m parsim {shlex.join(argv)}` draws no --plot to keep as {shown(figure)}")
    stdout, stderr = io.StringIO(), io.StringIO()
    with tempfile.TemporaryDirectory() as tmp, in_folder(ROOT):
        moved, shown_as = redirected(argv, Path(tmp), keep_under)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                status = main(moved)
            except SystemExit as e:  # argparse refusing a flag
                status = e.code
        if status == 0 and figure is not None:
            keep_plot(Path(moved[moved.index("--plot") + 1]), figure)
    if status != 0:
        raise DocError(f"`python -m parsim {shlex.join(argv)}` exited {status}: {stderr.getvalue().strip()}")
    text = stdout.getvalue()
    for scratch, given in shown_as.items():
        text = text.replace(scratch, given)
    return text


def keep_plot(drawn: Path, figure: Path) -> None:
    """The picture a run block's command drew, copied (atomically) to where its document shows it."""
    from parsim.files import write_atomic

    figure.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(figure, drawn.read_bytes(), "figure")


def fill_run(block: Block, refresh: bool) -> str:
    command = command_of(block.body)
    argv, pipe = split_pipe(command)
    figure = block.path.parent / block.arg if block.arg and refresh else None
    lines = run_parsim(argv, ROOT / "docs" if refresh else None, figure).splitlines()
    if pipe:
        lines = lines[: pipe[1]] if pipe[0] == "head" else lines[-pipe[1]:] if pipe[1] else []
    return fenced([f"$ {command}", *lines])


# --- log, measured ------------------------------------------------------------------------------------------

def fill_log(block: Block, refresh: bool) -> str:
    path = block.path.parent / block.arg
    try:
        logged = {line.rstrip() for line in path.read_text().splitlines()}
    except OSError as e:
        raise DocError(f"cannot read the log {path}: {e.strerror}") from None
    missing = [line for line in fence_lines(block.body)
               if not line.startswith("$ ") and line.strip() != "..." and line.rstrip() not in logged]
    if missing:
        raise DocError(f"not lines of {block.arg}: {missing}")
    return block.body


def fill_measured(block: Block, refresh: bool) -> str:
    from hw.__main__ import parser_for as hw_parser
    from hw.measure.command import report_text

    report = json.loads((block.path.parent / block.arg).read_text())
    config = report["config"] = {"data_parallel": 1, **report["config"]}  # older reports lack data_parallel
    command = command_of(block.body)
    args = hw_parser("measure")[0].parse_args(shlex.split(command)[3:])
    keys = ("schedule", "gpus", "microbatches", "steps", "data_parallel")
    differ = [k for k in keys if getattr(args, k) != config[k]]
    if differ:
        raise DocError(f"the command's {', '.join(differ)} differ from what {block.arg} measured")
    return fenced([f"$ {command}", *report_text(report).splitlines()])


# --- accuracy -----------------------------------------------------------------------------------------------

@functools.cache  # the README and docs/measurements.md share their CSVs
def accuracy_cells(csv_path: Path, runtime: str | None = None, profile_path: Path | None = None) -> tuple[str, ...]:
    """Points (GPU-bound), and median / worst error over all and over GPU-bound points, from the shipped profile (or
    `profile_path`); only the points `runtime` ran where it is named."""
    from parsim.compare import mark_host_sensitive, read_points, repredict, summary
    from parsim.profile import load_profile

    profile = load_profile(profile_path)
    points = [p for p in read_points(csv_path) if runtime is None or p.runtime == runtime]
    points = mark_host_sensitive(repredict(points, profile), profile)
    every, gpu_bound = summary(points), [p for p in points if not p.host_sensitive]
    if not gpu_bound:  # every point host-sensitive
        return f"{every['points']} (0)", f"{every['median_abs_error']:.1%} / {every['max_abs_error']:.1%}", "-"
    bound = summary(gpu_bound)
    return (f"{every['points']} ({bound['points']})",
            *(f"{s['median_abs_error']:.1%} / {s['max_abs_error']:.1%}" for s in (every, bound)))


def fill_accuracy(block: Block, refresh: bool) -> str:
    lines = block.body.strip("\n").splitlines()
    if len(lines) < 3 or not all(line.startswith("|") and line.endswith("|") for line in lines):
        raise DocError("an accuracy block holds one table: a header, a rule, then rows")
    rows = lines[:2]
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        link = re.search(r"\]\(([^)#]+\.csv)(?:#runtime=([\w-]+))?\)", cells[1]) if len(cells) == 5 else None
        if not link:
            raise DocError(f"an accuracy row has 5 columns and links a results CSV in its 2nd: {line!r}")
        profile = (block.path.parent / block.arg).resolve() if block.arg else None
        cells[2:] = accuracy_cells((block.path.parent / link[1]).resolve(), link[2], profile)
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


# --- profile ------------------------------------------------------------------------------------------------

def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.1f} us"


def _gpu_cost(op) -> str:
    return f"{op.fixed_s * 1e6:.1f} us + FLOPs / {op.flops_per_s / 1e12:.0f} TFLOP/s"


def fill_profile(block: Block, refresh: bool) -> str:
    """The shipped profile's figures, as the simulator uses them (layer costs with the in-step slowdown in)."""
    from parsim.profile import load_profile

    p = load_profile(None)
    m, carried = p.meta, set(p.meta.get("carried_from_base") or ())
    def origin(name, measured=True):
        return ("carried from the base profile" if name in carried
                                              else "default, not measured" if not measured else "measured")
    rows = [("GPU, calibration", f"{m.get('gpu')}, {str(m.get('date'))[:10]}, torch {m.get('torch')}: "
             f"`{m.get('command')}`", ""),
            ("GPUs per node", str(p.gpus_per_node), origin("gpus_per_node")),
            ("host: per compute action", _us(p.host.action_s), "measured"),
            ("host: per send or receive posted", _us(p.host.p2p_s), origin("host.p2p_s")),
            ("host: kernel launch, sync", f"{_us(p.host.launch_s)}, {_us(p.host.sync_s)}", "measured")]
    for family, slow in sorted((m.get("in_step_slowdown") or {}).items()):
        if isinstance(slow, dict) and "factor" in slow:
            rows.append((f"in-step slowdown, {family} layers", f"x{slow['factor']:.3f}", "measured"))
    for name, link in p.links.items():
        rows.append((f"link {name}", f"{_us(link.latency_s)} + {link.bandwidth_Bps / 1e9:.1f} GB/s",
                     origin(name, link.measured)))
    for name, c in p.collectives.items():
        rows.append((f"{name}", f"{_us(c.latency_s)} + bus bandwidth {c.busbw_Bps / 1e9:.0f} GB/s",
                     origin(name, c.measured)))
    layers = [(f"`{k}`", _gpu_cost(c.forward), _gpu_cost(c.backward_input), _gpu_cost(c.backward_weight),
               f"{_us(c.forward.host_s)} / {_us(c.backward_input.host_s + c.backward_weight.host_s)}")
              for k, c in p.layers.items()]
    def table(header, body):
        return ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header),
                                      *("| " + " | ".join(r) + " |" for r in body)]
    return "\n".join(table(("part", "value", "from"), rows) + [""] + table(
        ("layer", "forward (GPU)", "input-grad (GPU)", "weight-grad (GPU)", "host: forward / backward"), layers)) + "\n"


FILL = {"help": fill_help, "run": fill_run, "log": fill_log, "measured": fill_measured, "accuracy": fill_accuracy,
        "profile": fill_profile}


def filled(block: Block, refresh: bool = False) -> str:
    """The block's body as it should read now."""
    try:
        return FILL[block.kind](block, refresh)
    except DocError as e:
        raise DocError(f"{block.name}: {e}") from None


def same(block: Block, body: str) -> bool:
    """Help is compared word for word (argparse's wrapping varies with Python's version); the rest exactly."""
    if block.kind == "help":
        return block.body.split() == body.split()
    return block.body == body


def refresh_document(path: Path) -> bool:
    """Rewrite the document's blocks in place; whether it changed."""
    text = path.read_text()
    bodies = iter([filled(b, refresh=True) for b in blocks(path)])
    new = BLOCK.sub(lambda m: m[0][: m.start(3) - m.start(0)] + next(bodies) + "<!-- end -->", text)
    if new != text:
        from parsim.files import write_atomic

        write_atomic(path, new)
    return new != text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block differs")
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = [b.name for path in documents() for b in blocks(path) if not same(b, filled(b))]
            for name in stale:
                print(f"out of date: {name}", file=sys.stderr)
            if stale:
                print("run `python scripts/refresh_docs.py` to rewrite them", file=sys.stderr)
            return 1 if stale else 0
        for path in documents():
            if refresh_document(path):
                print(f"rewrote {shown(path)}")
    except DocError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # this checkout's parsim and hw, whatever else is installed
    sys.exit(main())
