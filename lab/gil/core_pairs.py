"""Does where the GIL experiment's threads run set its pace at 3-8 threads? (issue 19, docs/lab/data-parallel-interfaces.md item 15)

    python lab/gil/core_pairs.py OUT.json [ROUNDS]

The holder of the GIL runs slower after a switch at N threads, by an amount that differed 2.4x between two lent
machines of one kind (item 14). If the vCPUs sit on a hidden topology (cores or caches shared or far apart on the
host), a switch between far CPUs would cost more, and more threads would reach farther CPUs. So: (1) every pair
of CPUs' round trip of one cache line (core_pairs.c), three times over the run, to see a topology and whether it
holds still; (2) the experiment's loop (hw.interfaces.launch_threads.launch_loop) with its threads pinned to the nearest and the
farthest pairs, and to compact and spread sets of 4 and 8 CPUs, beside the same counts unpinned, in shuffled
turns (hw.interfaces.hogwild.shuffled_rounds), 0.04 s windows.
"""

from __future__ import annotations

import itertools
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's hw, run from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lab/ (record)
from hw.interfaces.launch_threads import WINDOW_S, launch_loop  # noqa: E402
from hw.interfaces.hogwild import shuffled_rounds  # noqa: E402
import record  # noqa: E402

TRIPS = 20000


def pair_latencies(binary: Path, cpus: list[int]) -> dict[tuple[int, int], float]:
    """ns per round trip of a cache line for every pair of `cpus`."""
    out = subprocess.run([str(binary), str(TRIPS), *map(str, cpus)], check=True, capture_output=True, text=True)
    return {(int(a), int(b)): float(ns) for a, b, ns in (line.split() for line in out.stdout.splitlines())}


def distance(lat: dict, a: int, b: int) -> float:
    return lat[(min(a, b), max(a, b))]


def grown(lat: dict, cpus: list[int], n: int, farthest: bool) -> tuple[int, ...]:
    """n CPUs grown greedily from the nearest (or farthest) pair, each next one the nearest (farthest) on average."""
    pick = max if farthest else min
    chosen = list(pick(lat, key=lat.get))
    while len(chosen) < n:
        rest = [c for c in cpus if c not in chosen]
        chosen.append(pick(rest, key=lambda c: statistics.mean(distance(lat, c, d) for d in chosen)))
    return tuple(chosen)


def main() -> None:
    out = Path(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    binary = out.with_name("core_pairs")
    subprocess.run(["cc", "-O2", "-o", str(binary), str(Path(__file__).with_suffix(".c")), "-lpthread"], check=True)
    cpus = sorted(os.sched_getaffinity(0))
    passes = [pair_latencies(binary, cpus)]
    lat = passes[0]
    points = {"1 pinned": grown(lat, cpus, 2, False)[:1], "2 near": grown(lat, cpus, 2, False),
              "2 far": grown(lat, cpus, 2, True)}
    for n in (n for n in (4, 8) if n <= len(cpus)):
        points[f"{n} compact"], points[f"{n} spread"] = grown(lat, cpus, n, False), grown(lat, cpus, n, True)
    for n in (1, 2, 4, 8):
        points[f"{n} free"] = ()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    threads = {name: len(p) or int(name.split()[0]) for name, p in points.items()}
    for name in points:  # warm-up
        launch_loop(device, threads[name], 0.05, cpus=points[name])
    half = rounds // 2
    raw = shuffled_rounds(list(points), half, lambda name: launch_loop(device, threads[name], WINDOW_S, cpus=points[name]))
    passes.append(pair_latencies(binary, cpus))
    more = shuffled_rounds(list(points), rounds - half, lambda name: launch_loop(device, threads[name], WINDOW_S,
                                                                                 cpus=points[name]))
    passes.append(pair_latencies(binary, cpus))
    per_launch = {name: statistics.mean(r["per_launch_s"] for r in raw[name] + more[name]) for name in points}
    switches = {name: statistics.mean(r["switches"] / sum(r["launches"]) for r in raw[name] + more[name])
                for name in points}
    for k, p in enumerate(passes):
        values = sorted(p.values())
        print(f"pass {k}: round trip min {values[0]:.0f} median {statistics.median(values):.0f} "
              f"max {values[-1]:.0f} ns", flush=True)
    for name in points:
        ns = [distance(lat, a, b) for a, b in itertools.combinations(points[name], 2)]
        print(f"{name:11} cpus {points[name]!s:34} mean pair {statistics.mean(ns) if ns else 0:6.0f} ns: "
              f"{per_launch[name] * 1e6:6.2f} us a launch, switches {switches[name]:.2f}", flush=True)
    record.write(out, device, rounds=rounds, window_s=WINDOW_S, trips=TRIPS, cpus=cpus,
                 pairs=[{f"{a} {b}": ns for (a, b), ns in p.items()} for p in passes],
                 points={name: list(p) for name, p in points.items()}, per_launch_s=per_launch, switches=switches,
                 runs={name: raw[name] + more[name] for name in points})


if __name__ == "__main__":
    main()
