"""Where DDP's MLP step loses to parsim's prediction (issue 19): the step with its all-reduce, without it (no_sync),
and the all-reduce of the same gradients alone, in turns on 2 and 4 GPUs.

    python lab/data-parallel/ddp_overlap.py OUT.json [ROUNDS]

On 4 H100 (data/interfaces/h100x4-2026-11-27-dp-ddp) DDP's step over the MLP stack (16 x h=2048, 8192 tokens, bf16:
1.07 GB of gradients) took 3-6 ms more than the model, which overlaps the all-reduce with the backward almost
wholly. Per point here: `ddp` (hw.interfaces.data_parallel's step), `no_sync` (the same DDP module inside no_sync(): no
all-reduce), `allreduce` (the gradients' bytes all-reduced alone, in 25 MiB pieces one after another, as DDP's
buckets), `beside` (the plain module's forward and backward with that all-reduce issued first on a stream of its
own: as much overlap as the hardware allows). If `beside` takes about `no_sync` alone, the GPUs can hide the
all-reduce and DDP does not; if about `no_sync` + `allreduce`, running beside the all-reduce costs the step what
the all-reduce takes.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's hw, run from anywhere
from hw.interfaces.data_parallel import beside, build, forward_backward, slowest_steps, timed_steps  # noqa: E402
from hw.run.ranks import spawn  # noqa: E402
from parsim.sim.grad_allreduce import DDP_BUCKET_BYTES  # noqa: E402

COUNTS = (2, 4)
MODES = ("ddp", "no_sync", "allreduce", "beside")
STEPS = 10


def reduce(pieces: list[torch.Tensor], group) -> None:
    """The gradients' bytes all-reduced in DDP's bucket size, one piece after another."""
    for piece in pieces:
        dist.all_reduce(piece, group=group)


def worker(rank: int, world: int, device: torch.device, rounds: int, tiny: bool) -> dict:
    groups = {n: dist.new_group(list(range(n))) for n in COUNTS if n <= world}
    barrier = dist.new_group(backend="gloo")
    times: dict[str, list[float]] = {}
    built = {}
    gpu = device.type == "cuda"
    side = torch.cuda.Stream(device) if gpu else None
    for r in range(rounds):
        for n in groups:
            for mode in MODES:
                dist.barrier(group=barrier)
                if rank < n:
                    if n not in built:
                        model, rows, data = build("mlp", device, tiny)
                        module = DistributedDataParallel(model, device_ids=[device.index] if gpu else None,
                                                         process_group=groups[n])
                        step = forward_backward(module, data(math.ceil(rows / n)))
                        flat = torch.zeros(sum(p.numel() for p in model.parameters()),
                                           dtype=next(model.parameters()).dtype, device=device)
                        alone, _, _ = build("mlp", device, tiny)  # no DDP: its hooks sit on `model`'s parameters
                        plain = forward_backward(alone, data(math.ceil(rows / n)))
                        built[n] = (step, module, flat.split(DDP_BUCKET_BYTES // flat.element_size()), plain)
                    step, module, pieces, plain = built[n]
                    devices = [device]
                    if mode == "ddp":
                        got = timed_steps(step, devices, STEPS)
                    elif mode == "no_sync":
                        def quiet(step=step, module=module):
                            with module.no_sync():
                                step()
                        got = timed_steps(quiet, devices, STEPS)
                    elif mode == "allreduce":
                        got = timed_steps(lambda: reduce(pieces, groups[n]), devices, STEPS)
                    else:  # the plain module's step with the all-reduce beside it on a stream of its own
                        def both(pieces=pieces, group=groups[n], plain=plain):
                            beside(lambda: reduce(pieces, group), plain, side)
                        got = timed_steps(both, devices, STEPS)  # a device-wide sync: the side stream too
                    times.setdefault(f"{mode}:{n}", []).extend(got)
                dist.barrier(group=barrier)
    return times


def main() -> None:
    out = Path(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    gpu = torch.cuda.is_available()
    world = min(max(COUNTS), torch.cuda.device_count()) if gpu else 2
    per_rank = spawn(worker, world, (rounds, not gpu), "cuda" if gpu else "cpu", timeout_s=120, deadline_s=400)
    results = {}
    for key in per_rank[0]:
        slowest = slowest_steps(per_rank, key)
        results[key] = {"median_s": statistics.median(slowest), "steps_s": slowest}
        print(f"{key:12} {statistics.median(slowest) * 1e3:8.3f} ms (median of {len(slowest)} steps)", flush=True)
    out.write_text(json.dumps({"command": "python lab/data-parallel/ddp_overlap.py " + " ".join(sys.argv[1:]),
                               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "torch": torch.__version__,
                               "device": torch.cuda.get_device_name(0) if gpu else "cpu",
                               "gpus": world, "rounds": rounds, "steps": STEPS, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
