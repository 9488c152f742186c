"""Commands run as a user at a terminal runs them: stderr on a pseudo-terminal (so progress lines show), in a session
of their own (so every process they start can be found, and signalled, by it)."""

from __future__ import annotations

import fcntl
import os
import pty
import signal
import struct
import subprocess
import termios
import threading
import time
from pathlib import Path


class Terminal:
    """A command whose stderr is a 100-column terminal; `text` is what it has written there so far."""

    def __init__(self, argv: list[str], cwd: str | os.PathLike | None = None):
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave,
                                     start_new_session=True, cwd=cwd)
        os.close(slave)
        self.pid = self.proc.pid
        self._raw = b""
        self._reader = threading.Thread(target=self._read, args=(master,), daemon=True)
        self._reader.start()

    def _read(self, fd: int) -> None:
        while True:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the last writer closed it
                chunk = b""
            if not chunk:
                os.close(fd)
                return
            self._raw += chunk

    @property
    def text(self) -> str:
        return self._raw.decode(errors="replace")

    def wait_for(self, needle: str, timeout_s: float) -> float:
        """Seconds from the start until `needle` showed on the terminal (AssertionError if it did not in time)."""
        end = time.monotonic() + timeout_s
        while needle not in self.text:
            assert self.proc.poll() is None or needle in self.text, f"exited {self.proc.returncode}: {self.text[-500:]}"
            assert time.monotonic() < end, f"no {needle!r} in {timeout_s} s: {self.text[-500:]}"
            time.sleep(0.02)
        return time.monotonic() - self.started

    def finish(self, timeout_s: float) -> tuple[int, list[str]]:
        """Exit status and the terminal's last lines (progress lines overwritten in place count as gone)."""
        code = self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=5)
        lines = [line.rsplit("\r", 1)[-1].strip() for line in self.text.replace("\r\n", "\n").split("\n")]
        return code, [line for line in lines if line]


def _processes() -> list[tuple[int, str, int, int, str]]:
    """(pid, state, parent pid, session id, command line) of every process /proc shows."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, ppid, _, sid = stat.read_text().rsplit(")", 1)[1].split()[:4]
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # it ended meanwhile
            continue
        found.append((int(stat.parent.name), state, int(ppid), int(sid), cmdline))
    return found


def session(sid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every live process of session `sid` (zombies left out: they are already dead)."""
    return [(pid, cmd) for pid, state, _, s, cmd in _processes() if s == sid and state != "Z"]


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of `pid`'s live children."""
    return [(p, cmd) for p, state, ppid, _, cmd in _processes() if ppid == pid and state != "Z"]


def left_after(sid: int, since: float, seconds: float) -> list[tuple[int, str]]:
    """The processes of session `sid` still alive `seconds` after `since` (time.monotonic), or none as soon as
    there are none."""
    while True:
        alive = session(sid)
        if not alive or time.monotonic() >= since + seconds:
            return alive
        time.sleep(0.1)


def end_session(sid: int) -> None:
    """Kill what a failed test left in session `sid`."""
    for pid, _ in session(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
