"""Does a thread's GIL-held work slow down while other threads launch kernels without the GIL? (issue 19)

    python lab/gil/held_interference.py OUT.json [ROUNDS [WINDOW_S]]

lab/gil/gil_stalls.py (data/interfaces/h200-2026-11-25-stalls) found the GIL experiment's held time a launch growing
from ~2.5-3 us at one thread to ~9.5-13.5 us at eight, none of it waiting for a lock, the host not stealing the
vCPUs: the holder's own work runs slower. Here no thread waits for the GIL: one probe thread times GIL-held work
while K = 0..7 background threads run GIL-free, either launching (a TorchScript loop of `y = y + 1` on a stream of
its own, as lab/gil/alloc_contention.py, fuser off) or hashing (hashlib's sha256 of 8 MiB, which drops the GIL: CPU
work that touches no CUDA state). The probe's work, in turns within its window:
  python   a pure Python loop (bytecode, small ints)
  attrs    tensor attribute reads (`x.shape`, `x.stride()`, `x.dim()`: torch's bindings, GIL held, no launch)
  launch   `x + 1` on its own stream (the experiment's launch: held parts and a GIL-free dispatch)
Each (background, K) point runs in shuffled turns within each round; times are per iteration of the probe's work.
"""

from __future__ import annotations

import contextlib
import hashlib
import statistics
import sys
import threading
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's hw, run from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lab/ (record)
from hw.interfaces.launch_threads import ELEMENTS, keep_clocks_up, unfused  # noqa: E402
from hw.interfaces.hogwild import shuffled_rounds  # noqa: E402
import record  # noqa: E402

COUNTS = (0, 1, 2, 3, 5, 7)
BACKGROUNDS = ("launch", "hash")
BLOB = bytes(8 << 20)  # ~10 ms a hash: a background thread needs the GIL back rarely (the probe keeps it)
BG_LAUNCHES = 2000  # per TorchScript call: ~10-30 ms; the GPU runs each kernel faster than it is launched

with warnings.catch_warnings():
    warnings.simplefilter("ignore")

    @torch.jit.script
    def alloc_loop(x: torch.Tensor, n: int) -> torch.Tensor:
        y = x
        for _ in range(n):
            y = y + 1
        return y


def python_work() -> None:
    s = 0
    for i in range(40):
        s += i


def attrs_work(x: torch.Tensor) -> None:
    for _ in range(4):
        x.shape
        x.stride()
        x.dim()


def timed(fn, seconds: float) -> float:
    """Seconds per call of fn, called in blocks of 8 for `seconds`."""
    clock = time.perf_counter
    n, t0 = 0, clock()
    end = t0 + seconds
    while clock() < end:
        for _ in range(8):
            fn()
        n += 8
    return (clock() - t0) / n


@contextlib.contextmanager
def background(device: torch.device, kind: str, k: int):
    """k threads working without the GIL until the block ends: launching (TorchScript loops, each on a stream of
    its own) or hashing; yields their per-thread unit counts (launches or hashes), final once the block is left."""
    stop = threading.Event()
    go = threading.Barrier(k + 1)
    done = [0] * k
    streams = [torch.cuda.Stream(device) if device.type == "cuda" else None for _ in range(k)]
    xs = [torch.ones(ELEMENTS[device.type], device=device) for _ in range(k)]

    def bg(i: int) -> None:
        with torch.cuda.stream(streams[i]) if streams[i] is not None else contextlib.nullcontext(), unfused():
            go.wait()
            while not stop.is_set():
                if kind == "launch":
                    alloc_loop(xs[i], BG_LAUNCHES)
                    if streams[i] is not None:
                        streams[i].synchronize()
                    done[i] += BG_LAUNCHES
                else:
                    hashlib.sha256(BLOB).digest()
                    done[i] += 1

    workers = [threading.Thread(target=bg, args=(i,), daemon=True) for i in range(k)]
    for w in workers:
        w.start()
    go.wait()
    time.sleep(0.002)  # under way
    try:
        yield done
    finally:
        stop.set()
        for w in workers:
            w.join()
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def point(device: torch.device, kind: str, k: int, window_s: float) -> dict:
    """The probe's works in turns (each twice) while k background threads work: seconds per iteration of each."""
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    x, out = torch.ones(ELEMENTS[device.type], device=device), {}
    part = window_s / 6
    keep_clocks_up(device, window_s * 1.2)
    with background(device, kind, k) as done, \
            torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        for _ in range(2):
            for name, fn in (("python", python_work), ("attrs", lambda: attrs_work(x)), ("launch", lambda: x + 1)):
                out.setdefault(name, []).append(timed(fn, part))
    return {name: statistics.mean(v) for name, v in out.items()} | {"background_units": sum(done)}


def main() -> None:
    out = Path(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    window = float(sys.argv[3]) if len(sys.argv) > 3 else 0.12
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    points = [("launch", 0)] + [(b, k) for b in BACKGROUNDS for k in COUNTS if k]
    for p in points:
        point(device, *p, 0.02)  # warm-up: TorchScript's profiling runs, streams, the allocator
    runs = shuffled_rounds(points, rounds, lambda p: point(device, *p, window))
    base = {w: statistics.median(r[w] for r in runs[("launch", 0)]) for w in ("python", "attrs", "launch")}
    results = {}
    for (b, k), rs in runs.items():
        med = {w: statistics.median(r[w] for r in rs) for w in ("python", "attrs", "launch")}
        results[f"{b}:{k}"] = {"background": b, "threads": k, "median_s": med,
                               "slowdown": {w: med[w] / base[w] for w in med}, "rounds": rs}
        print(f"{'none' if k == 0 else b:7} K={k}: " + ", ".join(
            f"{w} {med[w] * 1e6:6.2f} us ({med[w] / base[w]:.2f}x)" for w in ("python", "attrs", "launch")), flush=True)
    record.write(out, device, rounds=rounds, window_s=window, results=results)


if __name__ == "__main__":
    main()
