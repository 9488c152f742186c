"""Compute's speed beside a kernel that waits on its GPU (the profile's `resident_comm`; parsim.sim.sharing).

One GPU stands in for a receive whose peer has not sent yet: a Triton kernel of NCCL's send-receive shape spins
beside a chunk of MLP blocks (forward and backward) for 1.5x the chunk's time alone (there throughout) or 0.5x
(gone mid-way); the chunk's time by CUDA events, every point in turns each round. Needs Triton."""

from __future__ import annotations

import statistics
from typing import Any

import torch

from hw.nets.blocks import MlpBlock
from parsim.profile import ResidentComm
from parsim.sim.sharing import rate_beside

CHUNK = (2048, 2048, 4)  # hidden, tokens, blocks
CTAS = (32, 64)
WARPS = 16  # 512 threads a CTA (NCCL's run 640; Triton takes a power of two)
SPANS = (1.5, 0.5)  # the spin's length against the chunk alone


def spin_kernel() -> Any:
    """A Triton kernel (a triton.JITFunction, untyped) whose CTAs each wait `ns` nanoseconds on the GPU's clock,
    holding their SM."""
    import triton
    import triton.language as tl

    @triton.jit
    def spin(out_ptr, ns):  # type: ignore[no-untyped-def]  # Triton reads a kernel's annotations as argument types
        pid = tl.program_id(0)
        start = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [pid], dtype=tl.int64,
                                          is_pure=False, pack=1)
        now = start
        while now - start < ns:
            now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [pid], dtype=tl.int64,
                                            is_pure=False, pack=1)
        tl.store(out_ptr + pid, now - start)

    return spin


class Chunk:
    """`blocks` MLP blocks and a batch: one forward and backward, as a pipeline stage runs a micro-batch."""

    def __init__(self, hidden: int, tokens: int, blocks: int, device: torch.device):
        self.net = torch.nn.Sequential(*[MlpBlock(hidden) for _ in range(blocks)]).to(device, torch.bfloat16)
        self.x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
        self.dy = torch.randn_like(self.x)

    def __call__(self) -> None:
        self.net(self.x).backward(self.dy)


def timed(chunk: Chunk, spin: Any, ctas: int, spin_ns: int, device: torch.device, side: torch.cuda.Stream,
          warps: int = WARPS, after: Chunk | None = None) -> float:
    """The chunk's GPU time (s) with a spin of `ctas` CTAs beside it (none if ctas or spin_ns is 0): started ~10 us
    before it, or with `after`, released when that chunk, run first, ends (as torch's receive is)."""
    out = torch.zeros(max(ctas, 1), dtype=torch.int64, device=device)
    torch.cuda.synchronize(device)
    torch.cuda._sleep(2_000_000)  # ~1 ms: the host queues everything below before the GPU reaches it
    if after is not None:
        after()
    mark = torch.cuda.Event()
    mark.record()
    if ctas and spin_ns:
        side.wait_event(mark)
        with torch.cuda.stream(side):
            spin[(ctas,)](out, spin_ns, num_warps=warps)
    if after is None:
        torch.cuda._sleep(20_000)  # ~10 us: the spin is resident before the chunk's first kernel
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    chunk()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) / 1e3


def measure(device: torch.device, rounds: int = 7) -> tuple[ResidentComm, dict]:
    """The rate (median over the spins' CTA counts and lengths) and the raw times."""
    spin, side = spin_kernel(), torch.cuda.Stream(device)
    chunk = Chunk(*CHUNK, device)
    for _ in range(5):  # warm-up: Triton's compile, cuBLAS's heuristics
        timed(chunk, spin, CTAS[0], 100_000, device, side)
    alone_s = statistics.median(timed(chunk, spin, 0, 0, device, side) for _ in range(5))
    points = [(0, 0.0)] + [(k, span) for k in CTAS for span in SPANS]
    times: dict[tuple[int, float], list[float]] = {p: [] for p in points}
    for _ in range(rounds):
        for k, span in points:
            times[k, span].append(timed(chunk, spin, k, int(alone_s * span * 1e9), device, side))
    alone = statistics.median(times[0, 0.0])
    rows: list[dict[str, Any]] = [{"ctas": k, "threads": WARPS * 32, "spin_over_chunk": span,
                                   "ratio": statistics.median(t) / alone, "samples_s": t}
                                  for (k, span), t in times.items() if k]
    for row in rows:
        row["rate"] = rate_beside(row["ratio"], row["spin_over_chunk"])
    rate = statistics.median(r["rate"] for r in rows)
    source = (f"hw.calibrate.resident on {torch.cuda.get_device_name(device)}: chunk h={CHUNK[0]} x {CHUNK[1]} "
              f"tokens x {CHUNK[2]} blocks, {alone * 1e3:.2f} ms alone; beside {'/'.join(map(str, CTAS))} CTAs of "
              f"{WARPS * 32} threads, {rounds} rounds")
    return (ResidentComm(rate, source),
            {"chunk": dict(zip(("hidden", "tokens", "blocks"), CHUNK, strict=True)), "alone_s": times[0, 0.0],
             "rows": rows})


def main() -> None:
    """python -m hw.calibrate.resident OUT.json [ROUNDS]: the probe alone, its section and raw times with their
    provenance."""
    import json
    import sys
    import time
    from dataclasses import asdict

    from parsim.files import write_atomic

    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    device = torch.device("cuda", 0)
    section, raw = measure(device, rounds)
    doc = {"command": "python -m hw.calibrate.resident " + " ".join(sys.argv[1:]),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(device), "resident_comm": asdict(section), "samples": raw}
    write_atomic(sys.argv[1], json.dumps(doc, indent=1) + "\n")
    for row in raw["rows"]:
        print(f"{row['ctas']} CTAs, spin {row['spin_over_chunk']}x: {row['ratio']:.3f}x alone, rate {row['rate']:.3f}")
    print(f"rate {section.rate:.3f} ({section.source})")


if __name__ == "__main__":
    main()
