"""Both CLIs under signals at random times (issue 49): each run starts a command in a session of its own, sends it
SIGINT, SIGTERM or SIGHUP after a random delay, and checks the promise. It must end within 2 s of the signal, with
an exit status of 0, 2, 129, 130 or 143, or by the signal itself where it lands before the command has started (its
default action: the shell reports 128 + its number too). There must be no traceback. Nothing of its session may
be alive 5 s after it ends. No file may be partial: each output is absent or whole, and no temporary file is left.
Delays start at 0.1 s: the interpreter's own start-up (site, runpy) comes first, before any of the project's code
runs.

    python scripts/signal_fuzz.py [--seconds 120] [--seed N] [--json FILE]

Prints one line per run and a summary; exits 1 if any run broke the promise. tests/test_signal_fuzz.py draws from
the same commands with hypothesis.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "data" / "recompute" / "nvidia-h200-2026-11-28" / "validate-16x2048x8192" / "results.csv"
EXITS = (0, 2, 129, 130, 143)
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# name -> argv after `python -m`; {out} is the run's own empty folder. Each takes a few seconds on 2 cores, so that a
# signal lands at start-up, mid-work or while it writes.
COMMANDS = {
    "predict": ["parsim", "predict", "--schedule", "interleaved-1f1b", "--gpus", "8", "--microbatches", "256",
                "--trace", "{out}/step.json", "--plot", "{out}/step.png"],
    "sweep": ["parsim", "sweep", "--gpus", "16", "--layers", "32", "--schedules", "gpipe,1f1b,zb-h1,interleaved-1f1b",
              "--microbatches", "64,128,256,512", "--json"],
    "plan": ["parsim", "plan", "--gpus", "32", "--layers", "64", "--jobs", "2", "--top", "3", "--trace",
             "{out}/best.json"],
    "compare": ["parsim", "compare", "--measured", str(RESULTS), "--out", "{out}/plots"],
    "scenario": ["parsim", "scenario", "recompute", "--json"],
    "hw-measure": ["hw", "measure", "--cpu", "--gpus", "2", "--steps", "40", "--json"],
    "hw-validate": ["hw", "validate", "--cpu", "--gpus", "2", "--schedules", "gpipe", "--microbatches", "2",
                    "--models", "2x64x64", "--steps", "3", "--warmup", "0", "--out", "{out}/v"],
    "hw-scenario": ["hw", "scenario", "async", "--cpu", "--out", "{out}/async.json"],
}

# the longest delay drawn per command: about how long it runs on 2 cores, so that most signals land while it does
LATEST_S = {"hw-measure": 8.0, "hw-validate": 16.0, "hw-scenario": 2.0}
LATEST_DEFAULT_S = 2.0
EARLIEST_S = 0.1
STOP_S = 2.0  # the bound from the signal to the exit


@dataclass(frozen=True)
class Outcome:
    """One run: what was sent when, how it ended, and what broke the promise (empty: nothing)."""

    command: str
    signal: str
    delay_s: float
    exit: int | None
    seconds: float
    problems: tuple[str, ...]


def broken_files(folder: Path) -> list[str]:
    """Files under `folder` that are partial: a temporary file left, or a JSON, CSV or PNG that does not read whole."""
    bad = []
    for path in folder.rglob("*"):
        if not path.is_file():
            continue
        name = path.name
        try:
            if name.startswith(".") or name.endswith(".tmp"):
                bad.append(f"temporary file left: {path.relative_to(folder)}")
            elif name.endswith(".json"):
                json.loads(path.read_text())
            elif name.endswith(".csv"):
                rows = list(csv.reader(path.read_text().splitlines()))
                if not rows or any(len(r) != len(rows[0]) for r in rows):
                    bad.append(f"ragged CSV: {path.relative_to(folder)}")
            elif name.endswith(".png"):
                data = path.read_bytes()
                if not (data.startswith(b"\x89PNG\r\n\x1a\n") and data.endswith(b"IEND\xaeB`\x82")):
                    bad.append(f"partial PNG: {path.relative_to(folder)}")
        except (ValueError, UnicodeDecodeError):
            bad.append(f"does not read whole: {path.relative_to(folder)}")
    return bad


def session_alive(sid: int) -> list[int]:
    """Live (not zombie) processes of session `sid`."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, _, session = stat.read_text().rsplit(")", 1)[1].split()[:4]
        except OSError:
            continue
        if int(session) == sid and state != "Z":
            alive.append(int(stat.parent.name))
    return alive


def run_once(command: str, signum: int, delay_s: float, timeout_s: float = 60.0) -> Outcome:
    """`command` (a COMMANDS key) started in a fresh folder and session, `signum` sent after `delay_s` (if it still
    runs), and the promise checked."""
    with tempfile.TemporaryDirectory(prefix="signal-fuzz-") as out:
        argv = [sys.executable, "-m", *(a.replace("{out}", out) for a in COMMANDS[command])]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
        start = time.monotonic()
        proc = subprocess.Popen(argv, cwd=out, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        sent = False
        try:
            stdout, stderr = proc.communicate(timeout=delay_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signum)
            sent = True
            try:
                stdout, stderr = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                stdout, stderr = proc.communicate()
                return Outcome(command, signal.Signals(signum).name, delay_s, None, time.monotonic() - start,
                               (f"still running {timeout_s:.0f} s after the signal",))
        seconds = time.monotonic() - start
        problems = []
        if sent and seconds - delay_s > STOP_S:
            problems.append(f"ended {seconds - delay_s:.1f} s after the signal (more than {STOP_S:.0f} s)")
        if proc.returncode not in EXITS and proc.returncode != -signum:
            problems.append(f"exit {proc.returncode}")
        text = (stdout + stderr).decode(errors="replace")
        if "Traceback" in text:
            problems.append("traceback: " + text[text.index("Traceback"):][-300:].replace("\n", " | "))
        ended = time.monotonic()
        while (alive := session_alive(proc.pid)) and time.monotonic() < ended + 5:
            time.sleep(0.1)
        if alive:
            problems.append(f"alive 5 s after it ended: pids {alive}")
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        problems += broken_files(Path(out))
        return Outcome(command, signal.Signals(signum).name, delay_s, proc.returncode, seconds, tuple(problems))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=120.0, help="how long to keep starting runs (default 120)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="FILE", help="also write every outcome as JSON")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    outcomes, end = [], time.monotonic() + args.seconds
    while time.monotonic() < end:
        command, signum = rng.choice(sorted(COMMANDS)), rng.choice(SIGNALS)
        latest = LATEST_S.get(command, LATEST_DEFAULT_S)
        outcome = run_once(command, signum, round(rng.uniform(EARLIEST_S, latest), 2))
        outcomes.append(outcome)
        print(f"{outcome.command:<12} {outcome.signal:<7} after {outcome.delay_s:4.2f} s: exit {outcome.exit} in "
              f"{outcome.seconds:5.2f} s" + (f"  BROKEN: {'; '.join(outcome.problems)}" if outcome.problems else ""),
              flush=True)
    broken = [o for o in outcomes if o.problems]
    print(f"{len(outcomes)} runs in {args.seconds:.0f} s (seed {args.seed}): {len(broken)} broke the promise; exits "
          + ", ".join(f"{code}: {sum(o.exit == code for o in outcomes)}" for code in sorted(
              {o.exit for o in outcomes}, key=lambda c: -1 if c is None else c)))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(o) for o in outcomes], indent=1) + "\n")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
