"""Does a thread's work run slower right after it slept, the longer the sleep? (issue 19)

    python lab/gil/cold_start.py OUT.json [TRIALS]

lab/gil/gil_stalls.py (data/interfaces/h200-2026-11-25-stalls) found the GIL experiment's held work a launch ~2.5 us
at one thread and ~12 us at eight, where beside seven threads launching without the GIL (no GIL contention) it
was ~5 us: at eight threads nearly every held part follows a sleep on the GIL (~100 us). A vCPU that halts may
come back on a core whose caches were emptied (a deep C-state, other work of the host), so the first microseconds
after a wake-up would run slower. Here no contention: thread A waits for the main thread, then times one piece of
work (`cold`), then the same again (`warm`), and answers through a pipe. How A waits, and what the main thread does
for SLEEP us meanwhile (a C library built here with cc does the spins and the signalling without the GIL, and
keeps the main thread spinning a while after it, so that A takes the GIL at once):
  block        A blocks reading a pipe; the main thread spins SLEEP us in C, then writes the pipe
  hot          A spins in C on a flag (its core never idles); the main thread spins SLEEP us in C, then sets it
  signal       as hot, then A wakes a sleeping thread (a C thread blocked reading a pipe: A's write is a futex-like
               wake-up of another vCPU, as a GIL drop that signals a sleeper) before it times its work
  block-launch A blocks; the main thread launches `x + 1` on a stream of its own for SLEEP us, then writes
Works: `x + 1` on A's own CUDA stream (the experiment's launch), tensor attribute reads, a pure Python loop.
Modes, sleeps and works take turns, shuffled, TRIALS times each. (The first runs, 05:5x UTC, had the main thread
spin in Python and write from Python: mode `block` then, with a -1 point that proved nothing.)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's hw, run from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lab/ (record)
from hw.interfaces.launch_threads import ELEMENTS, keep_clocks_up  # noqa: E402
import record  # noqa: E402

C_SOURCE = r"""
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include <immintrin.h>
#include <pthread.h>
static uint64_t now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000ull + t.tv_nsec;
}
void spin(uint64_t ns) { uint64_t end = now() + ns; while (now() < end) _mm_pause(); }
void spin_then_write(int fd, uint64_t ns, uint64_t tail) { spin(ns); char c = 1; (void)!write(fd, &c, 1); spin(tail); }
void spin_then_set(volatile int *flag, uint64_t ns, uint64_t tail) {
    spin(ns);
    __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
    spin(tail);
}
void wait_flag(volatile int *flag) { while (!__atomic_load_n(flag, __ATOMIC_ACQUIRE)) _mm_pause(); *flag = 0; }
static void *sleeper(void *fd) { char c; while (read((int)(long)fd, &c, 1) == 1) {} return 0; }
void start_sleeper(int fd) { pthread_t t; pthread_create(&t, 0, sleeper, (void *)(long)fd); pthread_detach(t); }
void poke(int fd) { char c = 1; (void)!write(fd, &c, 1); }
"""
LIBRARY = Path("/tmp/libcoldstart.so")
TAIL_NS = 150_000  # the main thread keeps spinning (without the GIL) this long after it lets A go
SLEEPS_US = (0, 20, 50, 100, 200, 500, 1000)
MODES = ("block", "hot", "signal", "block-launch")
WORKS = ("launch", "attrs", "python")


def python_work() -> None:
    s = 0
    for i in range(40):
        s += i


def build() -> ctypes.CDLL:
    """The C side: spins, signalling and a sleeping thread, none holding the GIL (lab/gil/gil_churn.py uses `spin`)."""
    src = LIBRARY.with_suffix(".c")
    src.write_text(C_SOURCE)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(LIBRARY), str(src), "-lpthread"], check=True)
    lib = ctypes.CDLL(str(LIBRARY))  # a CDLL call runs without the GIL
    lib.spin_then_write.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]
    lib.spin_then_set.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64]
    lib.wait_flag.argtypes = [ctypes.c_void_p]
    lib.start_sleeper.argtypes = lib.poke.argtypes = [ctypes.c_int]
    lib.spin.argtypes = [ctypes.c_uint64]
    return lib


def main() -> None:
    out = Path(sys.argv[1])
    trials = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    lib = build()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    x, xm = (torch.ones(ELEMENTS[device.type], device=device) for _ in range(2))
    stream, stream_m = ((torch.cuda.Stream(device) if device.type == "cuda" else None) for _ in range(2))
    works = {"launch": lambda: x + 1, "attrs": lambda: (x.shape, x.stride(), x.dim(), x.shape, x.stride()),
             "python": python_work}
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    sig_r, sig_w = os.pipe()
    lib.start_sleeper(sig_r)
    flag = ctypes.c_int(0)
    flag_p = ctypes.addressof(flag)
    keys = [(m, s, w) for m in MODES for s in SLEEPS_US for w in WORKS]
    plan = keys * trials
    random.Random(0).shuffle(plan)
    times = {k: [] for k in keys}
    clock = time.perf_counter

    def a() -> None:
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for m, s, w in plan:
                if m in ("hot", "signal"):
                    lib.wait_flag(flag_p)
                    if m == "signal":
                        lib.poke(sig_w)
                else:
                    os.read(go_r, 1)
                t0 = clock()
                works[w]()
                t1 = clock()
                works[w]()
                t2 = clock()
                times[(m, s, w)].append((t1 - t0, t2 - t1))
                os.write(done_w, b"x")

    for w in WORKS:  # warm-up
        for _ in range(50):
            works[w]()
    thread = threading.Thread(target=a, daemon=True)
    thread.start()
    keep_clocks_up(device, 0.05)
    for k, (m, s, _) in enumerate(plan):
        if device.type == "cuda" and k % 50 == 0:
            keep_clocks_up(device, 0.05)  # the GPU kept at its clocks (a spin on a stream of its own)
        if m in ("hot", "signal"):
            lib.spin_then_set(flag_p, s * 1000, TAIL_NS)
        elif m == "block":
            lib.spin_then_write(go_w, s * 1000, TAIL_NS)
        else:
            with torch.cuda.stream(stream_m) if stream_m is not None else contextlib.nullcontext():
                until = clock() + s * 1e-6
                while clock() < until:
                    xm + 1
            lib.spin_then_write(go_w, 0, TAIL_NS)
        os.read(done_r, 1)
    thread.join()
    results = {}
    for (m, s, w), v in times.items():
        results[f"{m}:{w}:{s}"] = {"mode": m, "work": w, "sleep_us": s,
                                   "cold_s": statistics.median(c for c, _ in v),
                                   "warm_s": statistics.median(h for _, h in v),
                                   "cold_mean_s": statistics.mean(c for c, _ in v),
                                   "warm_mean_s": statistics.mean(h for _, h in v), "trials": len(v)}
    for m in MODES:
        for w in WORKS:
            r = [results[f"{m}:{w}:{s}"] for s in SLEEPS_US]
            print(f"{m:12} {w:7} " + "  ".join(f"{q['sleep_us']}us: {q['cold_s'] * 1e6:5.2f}/{q['warm_s'] * 1e6:5.2f}"
                                               for q in r), flush=True)
    record.write(out, device, trials=trials, tail_ns=TAIL_NS, results=results)


if __name__ == "__main__":
    main()
