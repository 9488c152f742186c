"""Where the GIL experiment's threads sleep: every pthread mutex lock and condition wait that slept, by the library
that called it, counted by an LD_PRELOAD library (lab/gil/lockcount.c, built here with the C compiler).

    python lab/gil/gil_locks.py OUT.json [ROUNDS]

The experiment at 3-8 threads allocating its results sleeps ~7 times a launch, at most ~1.4 times not allocating
(data/interfaces/h200-2026-11-25-release-probes); a model of CPython's GIL alone (its mutex and condition
variable) gives at most ~3 (docs/lab/data-parallel-interfaces.md, the GIL experiment's items). The counts say whose locks the other sleeps
are in: the interpreter's (the GIL), torch's (the CUDA caching allocator's mutex), the CUDA driver's; and each
wait on the GIL's condition variable by its origin, the first function up the stack outside libc and the
interpreter, and the frame above it (which torch binding's release it waited after). A lock or
wait is counted slow when it took 1.5 us or more (the thread slept; an uncontended one takes ~50 ns). The
experiment's loops of lab/gil/gil_release_probes.py, allocating and not, at 1, 2, 3, 4, 6, 8 threads, in turns.
"""

from __future__ import annotations

import ctypes
import functools
import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # its sibling scripts, run from anywhere
from preload import preloaded  # noqa: E402

LIBRARY = Path("/tmp/liblockcount.so")
COUNTS = (1, 2, 3, 4, 6, 8)
WINDOW_S = 0.2


def counted(lib: ctypes.CDLL) -> list[dict]:
    buf = ctypes.create_string_buffer(1 << 20)
    n = lib.lockcount_dump(buf, len(buf))
    rows = []
    for line in buf.value[:max(n, 0)].decode().splitlines():
        kind, path, symbol, calls, slow, slow_ns = line.split("\t")
        if kind.startswith("cond-") and symbol.startswith("?+"):  # a hidden symbol: its name from the symbol table
            symbol = function_at(path, symbol[2:])
        rows.append({"kind": kind, "library": Path(path).name, "symbol": symbol, "calls": int(calls),
                     "slow": int(slow), "slow_ns": int(slow_ns)})
    return rows


@functools.cache
def function_at(path: str, offset: str) -> str:
    """The function at `offset` into the library at `path` (addr2line, demangled), else the offset."""
    try:
        out = subprocess.run(["addr2line", "-f", "-C", "-e", path, offset], capture_output=True, text=True,
                             timeout=30).stdout.split("\n")[0]
    except (OSError, subprocess.SubprocessError):
        return offset
    return out if out and out != "??" else offset


def main() -> None:
    lib = preloaded(HERE / "lockcount.c", LIBRARY)
    import torch
    from gil_release_probes import loop  # a sibling script: puts this checkout's hw on the path

    out = Path(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    points = [(place, n) for place in ("alloc-after", "out-after") for n in COUNTS]
    for place, n in points:
        loop(device, n, place, 0.0, 0.02)  # warm-up
    results = defaultdict(list)
    for r in range(rounds):
        for place, n in points:
            lib.lockcount_reset()
            run = loop(device, n, place, 0.0, WINDOW_S)
            rows = counted(lib)
            launches = sum(run["launches"])
            results[f"{place}:{n}"].append({"per_launch_s": run["per_launch_s"], "launches": launches,
                                            "sleeps": sum(run["sleeps"]), "locks": rows})
    summary = {}
    for key, rs in results.items():
        launches = sum(r["launches"] for r in rs)
        by = defaultdict(lambda: [0, 0, 0])
        for r in rs:
            for row in r["locks"]:  # by library; a wait's origin by its function too
                where = row["library"] + (":" + row["symbol"] if row["kind"].startswith("cond-") else "")
                b = by[(row["kind"], where)]
                b[0] += row["calls"]
                b[1] += row["slow"]
                b[2] += row["slow_ns"]
        sleeps = sum(r["sleeps"] for r in rs) / launches
        per = {f"{k}@{lib_}": {"calls": c / launches, "slow": s / launches, "slow_us": ns / 1e3 / launches}
               for (k, lib_), (c, s, ns) in by.items()}
        summary[key] = {"per_launch_s": sorted(r["per_launch_s"] for r in rs)[len(rs) // 2], "sleeps": sleeps,
                        "per_launch": per}
        print(f"{key:14} {summary[key]['per_launch_s'] * 1e6:6.2f} us a launch, {sleeps:4.2f} sleeps a launch")
        for name, v in sorted(per.items(), key=lambda kv: -kv[1]["slow"]):
            if v["slow"] >= 0.01 or v["calls"] >= 0.5:
                print(f"    {name[:70]:70} {v['calls']:6.2f} calls, {v['slow']:5.2f} slow, {v['slow_us']:6.2f} us slow "
                      "a launch")
    out.write_text(json.dumps({"command": "python lab/gil/gil_locks.py " + " ".join(sys.argv[1:]),
                               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "torch": torch.__version__, "python": sys.version.split()[0],
                               "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                               "window_s": WINDOW_S, "rounds": rounds, "summary": summary,
                               "raw": results}) + "\n")


if __name__ == "__main__":
    main()
