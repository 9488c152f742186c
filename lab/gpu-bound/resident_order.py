"""Does a waiting kernel that starts as torch starts a receive's slow the compute after it as the model says?

    python lab/gpu-bound/resident_order.py OUT.json [ROUNDS]

`hw calibrate` measures compute's speed beside a waiting kernel with the kernel resident first (it starts ~10 us
before the chunk: hw/calibrate/resident.py). torch's receive starts otherwise: its NCCL stream waits for the compute queued
before it, so its kernel becomes ready the moment that compute ends, as the next compute's first kernel does, and
must find SMs beside it. Here, on one GPU: chunk A then chunk B on the compute stream; the spin kernel (64 CTAs,
NCCL's grid for 8 MB) on another stream, made to wait for an event recorded after A, lasting 0.25-1.5x B's time
alone; B's time against B alone and against the model's (parsim.sim.sharing: B runs at `rate` while the kernel
waits), with the rate from calibrate's own probe in the same rounds. All points in turns each round.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's hw and parsim, run from anywhere
from hw.calibrate.resident import CHUNK, Chunk, spin_kernel, timed  # noqa: E402
from parsim.files import write_atomic  # noqa: E402
from parsim.sim.sharing import rate_beside, stretch  # noqa: E402

SPANS = (0.25, 0.5, 1.0, 1.5)
CTAS = 64


def main() -> None:
    out = Path(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 9
    device = torch.device("cuda", 0)
    spin, side = spin_kernel(), torch.cuda.Stream(device)
    a, b = Chunk(*CHUNK, device), Chunk(*CHUNK, device)
    for _ in range(5):
        timed(b, spin, CTAS, 100_000, device, side, after=a)
        timed(b, spin, CTAS, 100_000, device, side)
    alone = statistics.median(timed(b, spin, CTAS, 0, device, side, after=a) for _ in range(5))
    points = [("after", 0.0)] + [("after", s) for s in SPANS] + [("probe", s) for s in (1.5, 0.5)]
    times: dict[str, list[float]] = {f"{k}:{s}": [] for k, s in points}
    for _ in range(rounds):
        for kind, s in points:
            ns = int(alone * s * 1e9)
            times[f"{kind}:{s}"].append(timed(b, spin, CTAS, ns, device, side, after=a if kind == "after" else None))
    base = statistics.median(times["after:0.0"])
    ratio = {key: statistics.median(t) / base for key, t in times.items()}
    rate = statistics.median(rate_beside(ratio[f"probe:{s}"], s) for s in (1.5, 0.5))
    rows = [{"spin_over_chunk": s, "measured": ratio[f"after:{s}"], "modelled": stretch(rate, s)} for s in SPANS]
    for r in rows:
        print(f"spin {r['spin_over_chunk']:.2f}x after A: B took {r['measured']:.3f}x alone, "
              f"modelled {r['modelled']:.3f}x ({r['modelled'] / r['measured'] - 1:+.1%})", flush=True)
    print(f"rate from the probe in the same rounds: {rate:.3f}")
    write_atomic(out, json.dumps({
        "command": "python lab/gpu-bound/resident_order.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(device), "chunk": CHUNK, "ctas": CTAS, "rate": rate,
        "alone_s": base, "rows": rows, "samples_s": times}, indent=1) + "\n")


if __name__ == "__main__":
    main()
