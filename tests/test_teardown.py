"""An `hw` command takes every process it started with it, whatever ends it (issue 20): its ranks, their
resource tracker, hw validate's calibration and that one's ranks. Each command runs in a session of its own, so
that anything it left behind is found by the session id; the 5 s are the issue's own bound."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
from terminal import Terminal, children, end_session, left_after

pytest.importorskip("torch")

SHIPPED = str(Path(__file__).parent.parent / "parsim" / "profiles" / "default.json")
# a tiny pipeline stepped far longer than any test waits
LONG = ["--cpu", "--gpus", "2", "--microbatches", "2", "--layers", "2", "--hidden", "64", "--tokens", "64",
        "--steps", "10000", "--warmup", "0", "--timeout", "60"]
VALIDATE = ["--cpu", "--gpus", "2", "--schedules", "1f1b", "--microbatches", "2", "--models", "2x64x64",
            "--warmup", "0", "--timeout", "60"]


def _ranks(pid: int) -> list[int]:
    """The rank processes `pid` started (multiprocessing's spawned children)."""
    return [p for p, cmd in children(pid) if "spawn_main" in cmd]


def _started(argv: list[str], ready: str = "measuring") -> tuple[Terminal, list[int]]:
    """The hw command running, past the point where its ranks step (their progress line shows), and its ranks."""
    run = Terminal([sys.executable, "-m", "hw", *argv])
    try:
        run.wait_for(ready, 240)
        ranks = _ranks(run.pid)
        assert len(ranks) == 2, (ranks, children(run.pid))
    except BaseException:
        end_session(run.pid)
        raise
    return run, ranks


@pytest.mark.parametrize("command", [["measure", *LONG],
                                     ["validate", *VALIDATE, "--steps", "10000", "--profile", SHIPPED]])
def test_sigterm_to_the_parent_stops_every_rank_names_them_and_exits_143(command, tmp_path):
    if command[0] == "validate":
        command = [*command, "--out", str(tmp_path / "v")]
    run, ranks = _started(command)
    sent = time.monotonic()
    os.kill(run.pid, signal.SIGTERM)
    try:
        code, lines = run.finish(30)
        assert code == 143, lines
        assert lines[-1].startswith("stopped by SIGTERM; stopped rank 0 (pid "), lines
        assert all(f"(pid {pid})" in lines[-1] for pid in ranks), (ranks, lines[-1])
        assert left_after(run.pid, sent, 5.0) == []
    finally:
        end_session(run.pid)


def test_sigkill_of_hw_measure_takes_its_ranks_and_their_tracker_with_it():
    run, ranks = _started(["measure", *LONG])
    sent = time.monotonic()
    os.kill(run.pid, signal.SIGKILL)
    try:
        assert run.proc.wait(timeout=10) == -signal.SIGKILL
        assert left_after(run.pid, sent, 5.0) == []
    finally:
        end_session(run.pid)


def test_sigkill_of_hw_validate_takes_its_calibration_and_that_ones_ranks_with_it(tmp_path):
    """Without --profile, validate runs `hw calibrate` first, which starts ranks of its own: killed mid-way."""
    run = Terminal([sys.executable, "-m", "hw", "validate", *VALIDATE, "--steps", "1", "--out", str(tmp_path / "v")])
    try:
        end = time.monotonic() + 240
        while not any(_ranks(p) for p, cmd in children(run.pid) if "calibrate" in cmd):
            assert run.proc.poll() is None and time.monotonic() < end, run.text[-500:]
            time.sleep(0.1)
        sent = time.monotonic()
        os.kill(run.pid, signal.SIGKILL)
        assert left_after(run.pid, sent, 5.0) == []
    finally:
        end_session(run.pid)


def test_a_child_whose_parent_is_already_gone_exits_at_once():
    """The race the check after prctl closes: a parent gone before the child asked (pid 1 adopted it)."""
    import subprocess

    script = ("import os, sys, time; from parsim.interrupts import die_with_parent; "
              "die_with_parent(int(sys.argv[1])); time.sleep(60)")
    started = time.monotonic()
    child = subprocess.run([sys.executable, "-c", script, "1"], timeout=30)  # pid 1 is not its parent
    assert child.returncode == 1 and time.monotonic() - started < 30


def test_a_termination_signal_inside_a_simulation_unwinds_as_itself():
    """SIGTERM landing while SimPy runs a process (issue 49): SimPy re-raises a process's exception as a copy made from
    its args, which for Stopped once meant `Signals('stopped by SIGTERM')`, a ValueError and a traceback."""
    import signal

    import simpy

    from parsim.interrupts import Stopped

    env = simpy.Environment()

    def stopped_inside():
        yield env.timeout(1)
        raise Stopped(signal.SIGTERM)

    env.process(stopped_inside())
    with pytest.raises(Stopped) as caught:
        env.run()
    assert caught.value.signum == signal.SIGTERM and caught.value.status == 143
    assert str(caught.value) == "stopped by SIGTERM"


def _alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def _sleep_long(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_plans_workers_are_killed_when_it_stops_mid_configuration():
    """`plan --jobs 2` stopped by Ctrl-C or SIGTERM printed that it stopped, yet its workers (and so the parent, at
    exit) ran on at 100% CPU (issue 49): the pool's shutdown dropped its list of processes before they were killed."""
    from concurrent.futures import ProcessPoolExecutor

    from parsim.plan import stop_workers

    pool = ProcessPoolExecutor(2)
    futures = [pool.submit(_sleep_long, 60.0) for _ in range(2)]
    while not all(f.running() for f in futures):
        time.sleep(0.05)
    workers = list(pool._processes.values())
    assert len(workers) == 2 and all(w.is_alive() for w in workers)
    stop_workers(pool)
    deadline = time.monotonic() + 5
    while any(w.is_alive() for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(w.is_alive() for w in workers)


def test_plans_workers_die_with_the_parent_even_on_sigkill():
    """SIGKILL of `plan`'s parent left its pool workers alive (issue 49): each asks the kernel to end it with its
    parent (parsim.interrupts.die_with_parent, in the pool's initializer)."""
    import subprocess

    script = ("import os, sys, time\n"
              "from concurrent.futures import ProcessPoolExecutor\n"
              "from parsim.interrupts import die_with_parent\n"
              "pool = ProcessPoolExecutor(1, initializer=die_with_parent, initargs=(os.getpid(),))\n"
              "print(pool.submit(os.getpid).result(), flush=True)\n"
              "pool.submit(time.sleep, 60)\n"
              "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    worker = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 5
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker)
