"""Does a kernel that sits on a few SMs, waiting, slow the compute beside it? (issue 12, torch on two GPUs)

    python lab/gpu-bound/resident_kernel.py OUT.json [ROUNDS]

On two GPUs torch.distributed.pipelining 2.11 posts a receive early (when its sender sends) on the rank's one NCCL
stream; its kernel starts once the compute queued before it is done and then waits, resident on its SMs, until the
peer's data arrives, beside the compute queued after it. hw's runner posts a receive just before the compute that
needs it (nothing computes beside it), and its sends, posted after their compute, fit the peer's buffers. Simulated
on the 2-GPU reference (lab/gpu-bound/torch_2gpu_checks.py), torch's receives sit 6.9-7.6 ms a step beside compute on
each rank at 4 micro-batches and hw's none. If a resident kernel holding a few SMs slows a chunk of MLP blocks
much, that is where torch's multi-stage classes lose their step on two GPUs.

One GPU stands in for the peer: a spin kernel of k CTAs (512 threads each, as NCCL's) that waits on the GPU's
clock for a set time, started just before a chunk of MLP blocks (forward and backward, bf16) on the compute
stream; the chunk's time (CUDA events) against the same chunk with nothing beside it, k = 0, 1, 2, 4, 8, 16, 32,
the spin lasting 1.5x the chunk (resident throughout) or 0.5x (gone mid-way), all points in turns each round.
Needs Triton (the device image's torch has it).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's hw, run from anywhere
from hw.calibrate.resident import Chunk, spin_kernel, timed  # noqa: E402
from parsim.files import write_atomic  # noqa: E402

SHAPES = ((2048, 2048, 4), (2048, 1024, 4), (4096, 4096, 2))  # hidden, tokens, blocks: the 2-GPU reference's
# chunk at 4 and 8 micro-batches (16 blocks over 4 stages of 8192 tokens), and a wider one
CTAS = (0, 1, 2, 4, 8, 16, 32)
SPANS = (1.5, 0.5)  # the spin's length against the chunk alone
NCCL_PROBE = """
import json, os, sys, torch, torch.distributed as dist
from torch.profiler import ProfilerActivity, profile
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", NCCL_DEBUG="INFO")
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
grids = {}
for mb in (2, 8):  # the reference's messages at 8 and 4 micro-batches
    a = torch.ones(mb << 19, device="cuda", dtype=torch.bfloat16); b = torch.empty_like(a)
    ops = [dist.P2POp(dist.isend, a, 0), dist.P2POp(dist.irecv, b, 0)]
    for _ in range(3):
        for w in dist.batch_isend_irecv(ops): w.wait()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for w in dist.batch_isend_irecv(ops): w.wait()
        torch.cuda.synchronize()
    prof.export_chrome_trace("/tmp/nccl_self.json")
    events = json.load(open("/tmp/nccl_self.json"))["traceEvents"]
    grids[mb] = [(e["name"][:60], e.get("args", {}).get("grid"), e.get("args", {}).get("block"))
                 for e in events if e.get("cat") == "kernel"]
print("GRIDS " + json.dumps(grids), flush=True)
dist.destroy_process_group()
"""


def nccl_channels() -> str:
    """NCCL's own account of its channels on this GPU (NCCL_DEBUG=INFO lines that name channels), and the grid of
    its kernel for a send and receive of 2 and 8 MB to itself (one rank: two GPUs may pick other counts)."""
    try:
        run = subprocess.run([sys.executable, "-c", NCCL_PROBE], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "timed out"
    return "\n".join(line for line in (run.stdout + run.stderr).splitlines()
                     if "channels" in line.lower() or "NCCL version" in line or "GRIDS" in line)[-4000:]


def main() -> None:
    out = Path(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    device = torch.device("cuda", 0)
    spin = spin_kernel()
    side = torch.cuda.Stream(device)
    chunks = {shape: Chunk(*shape, device) for shape in SHAPES}
    alone = {}
    for shape, chunk in chunks.items():  # warm-up, and each chunk's time alone to size the spins
        for _ in range(5):
            timed(chunk, spin, 1, 100_000, device, side)
        alone[shape] = statistics.median(timed(chunk, spin, 0, 0, device, side) for _ in range(5))
    points = [(shape, k, span) for shape in SHAPES for k in CTAS for span in (SPANS if k else (0.0,))]
    times: dict[str, list[float]] = {f"{s}:{k}:{span}": [] for s, k, span in points}
    for _ in range(rounds):
        for shape, k, span in points:
            times[f"{shape}:{k}:{span}"].append(
                timed(chunks[shape], spin, k, int(alone[shape] * span * 1e9), device, side))
    rows = []
    for shape, k, span in points:
        t = statistics.median(times[f"{shape}:{k}:{span}"])
        base = statistics.median(times[f"{shape}:0:0.0"])
        rows.append({"hidden": shape[0], "tokens": shape[1], "blocks": shape[2], "ctas": k, "spin_over_chunk": span,
                     "chunk_s": t, "alone_s": base, "ratio": t / base, "samples_s": times[f"{shape}:{k}:{span}"]})
        print(f"h={shape[0]} tokens={shape[1]} blocks={shape[2]} k={k:2} spin {span:.1f}x: "
              f"{t * 1e3:7.3f} ms, {t / base:5.3f}x alone", flush=True)
    write_atomic(out, json.dumps({
        "command": "python lab/gpu-bound/resident_kernel.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(device),
        "sms": torch.cuda.get_device_properties(device).multi_processor_count,
        "rows": rows, "nccl": nccl_channels()}, indent=1))


if __name__ == "__main__":
    main()
