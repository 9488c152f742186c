"""Do launching threads slow each other down without the GIL? N threads each run a TorchScript loop of small kernels
(TorchScript runs without the GIL) on a CUDA stream of its own, allocating each result or not, N = 1..8. TorchScript's
fuser is off (`hw.interfaces.launch_threads.unfused`): it would unroll the loop by 8 and fuse the adds into one kernel
(lab/gil/ts_fusion.py), as it did in this script's run of 2026-11-25 01:5x (h200-2026-11-25-release-probes).

    python lab/gil/alloc_contention.py OUT.json [ROUNDS]

If allocating launches slow down with N and writing into a kept tensor (`out=`) does not, the CUDA caching
allocator's lock, not the GIL, is what the GIL experiment's 3-8 threads queue on (docs/lab/data-parallel-interfaces.md, the GIL
known gap). Each repetition starts all threads at a barrier; a thread's LAUNCHES stay below what a stream queues,
so the host's time is timed, not the GPU's; the streams are synchronised between repetitions. Variants and thread
counts take turns in shuffled order within each round (the lent hosts drift).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import threading
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's hw, run from anywhere
from hw.interfaces.launch_threads import ELEMENTS, keep_clocks_up, unfused  # noqa: E402
from hw.interfaces.hogwild import machine, shuffled_rounds  # noqa: E402

LAUNCHES = 400  # per thread and repetition
REPEATS = 25
COUNTS = range(1, 9)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # TorchScript is deprecated; it still runs the ops without the GIL

    @torch.jit.script
    def alloc_loop(x: torch.Tensor, n: int) -> torch.Tensor:
        y = x
        for _ in range(n):
            y = y + 1  # each result feeds the next: not optimised away; the previous one is freed
        return y

    @torch.jit.script
    def out_loop(x: torch.Tensor, z: torch.Tensor, n: int) -> torch.Tensor:
        for _ in range(n):
            torch.add(x, 1, out=z)
        return z


def threads_loop(device: torch.device, threads: int, memory: str) -> dict:
    """Host time per launch of `threads` threads running their loops together, over REPEATS repetitions."""
    xs = [torch.ones(ELEMENTS[device.type], device=device) for _ in range(threads)]
    zs = [torch.empty_like(x) for x in xs]
    streams = [torch.cuda.Stream(device) if device.type == "cuda" else None for _ in range(threads)]
    go = threading.Barrier(threads + 1)
    done = threading.Barrier(threads + 1)
    ends = [[0.0] * REPEATS for _ in range(threads)]
    clock = time.perf_counter

    def work(i: int) -> None:
        stream = streams[i]
        for r in range(REPEATS):
            go.wait()
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext(), unfused():
                alloc_loop(xs[i], LAUNCHES) if memory == "alloc" else out_loop(xs[i], zs[i], LAUNCHES)
            ends[i][r] = clock()
            if stream is not None:
                stream.synchronize()
            done.wait()

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    spans = []
    for r in range(REPEATS):
        keep_clocks_up(device, 0.01)
        start = clock()
        go.wait()
        done.wait()
        spans.append(max(e[r] for e in ends) - start)
    for w in workers:
        w.join()
    return {"per_launch_s": statistics.median(spans) / (threads * LAUNCHES), "spans_s": spans}


def main() -> None:
    out = Path(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    points = [(memory, n) for memory in ("alloc", "out") for n in COUNTS]
    for memory, n in points:  # warm-up: TorchScript's first calls profile and optimise the loops
        for _ in range(3):
            threads_loop(device, n, memory)
    raw = shuffled_rounds(points, rounds, lambda p: threads_loop(device, p[1], p[0]))
    result = {}
    for (memory, n), rs in raw.items():
        med = statistics.median(r["per_launch_s"] for r in rs)
        print(f"{memory:5} {n} threads: {med * 1e6:6.2f} us a launch of all threads, "
              f"{med * n * 1e6:6.2f} us a launch of each")
        result[f"{memory}:{n}"] = {"memory": memory, "threads": n, "per_launch_s": med,
                                   "rounds": [r["per_launch_s"] for r in rs]}
    out.write_text(json.dumps({"command": "python lab/gil/alloc_contention.py " + " ".join(sys.argv[1:]),
                               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "torch": torch.__version__, "device": torch.cuda.get_device_name(device)
                               if device.type == "cuda" else "cpu", "machine": machine(),
                               "launches": LAUNCHES, "repeats": REPEATS, "rounds": rounds,
                               "points": result}) + "\n")


if __name__ == "__main__":
    main()
