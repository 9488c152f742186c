"""Where the host time of a tiny model's data-parallel step goes (issue 19's known gap: the text's nn.Linear(5, 2)
steps took 0.36-0.74 ms at one GPU and 2.9-4.8 ms under DataParallel over 2-4 GPUs, predicted 0.06-1.2).

    python lab/data-parallel/dp_host_breakdown.py OUT.json [STEPS]

Per phase, the host's time (perf_counter, no sync inside the step; every GPU used synced before and after it),
the median over STEPS steps taken in turns with the other points:
- `module`: the plain module: zero_grad, forward, loss (.float().sum()), backward, the final sync;
- `dp` over 1..G GPUs: DataParallel.forward's own phases (scatter, replicate, parallel_apply, gather) as torch 2.11
  runs them, then loss, backward, the final sync;
- `mlp`: the same for the MLP stack (16 x h=2048, 8192 tokens, bf16), every GPU synced after each phase;
- `ddp` over 2..G ranks (a process each): zero_grad, forward, loss, backward, the final sync, rank 0's times.
Also a torch.profiler table (CPU time by op) of 20 steps of `module` and of `dp` over 2 GPUs.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's hw, run from anywhere
from hw.interfaces.data_parallel import TEXT_BATCH, build  # noqa: E402
from hw.timing import sync_all  # noqa: E402
from hw.run.ranks import spawn  # noqa: E402

ROUNDS = 10


def stamp(devices: list[torch.device], synced: bool) -> float:
    """The host's clock, after every GPU used has finished its work where `synced`."""
    if synced:
        sync_all(devices)
    return time.perf_counter()


def timed_step(model: nn.Module, forward, phases: tuple[str, ...], devices: list[torch.device],
               synced: bool) -> dict[str, float]:
    """zero_grad, the forward's `phases` (forward(mark) returns the output, calling mark() after each), the loss,
    backward and the final sync, each phase's host time (where `synced`, every GPU synced after each)."""
    sync_all(devices)
    t = [stamp(devices, synced)]

    def mark() -> None:
        t.append(stamp(devices, synced))

    model.zero_grad(set_to_none=True)
    mark()
    loss = forward(mark).float().sum()
    mark()
    loss.backward()
    mark()
    sync_all(devices)
    mark()
    names = ("zero_grad", *phases, "loss", "backward", "sync")
    return {n: b - a for n, a, b in zip(names, t, t[1:])} | {"step": t[-1] - t[0]}


def phases_module(model: nn.Module, x: torch.Tensor, devices: list[torch.device], synced: bool = False,
                  ) -> dict[str, float]:
    def forward(mark):
        out = model(x)
        mark()
        return out

    return timed_step(model, forward, ("forward",), devices, synced)


def phases_dp(dp: nn.DataParallel, x: torch.Tensor, devices: list[torch.device], synced: bool = False,
              ) -> dict[str, float]:
    """DataParallel.forward's body (torch 2.11), each phase timed."""
    def forward(mark):
        inputs, kwargs = dp.scatter((x,), {}, dp.device_ids)
        mark()
        if len(dp.device_ids) == 1:
            out = dp.module(*inputs[0], **kwargs[0])
            for _ in range(3):
                mark()
            return out
        replicas = dp.replicate(dp.module, dp.device_ids[:len(inputs)])
        mark()
        outputs = dp.parallel_apply(replicas, inputs, kwargs)
        mark()
        out = dp.gather(outputs, dp.output_device)
        mark()
        return out

    return timed_step(dp, forward, ("scatter", "replicate", "parallel_apply", "gather"), devices, synced)


def medians(samples: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(s[k] for s in samples) for k in samples[0]}


def profile_table(fn, steps: int = 20) -> str:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
    return prof.key_averages().table(sort_by="cpu_time_total", row_limit=30)


def single_process(steps: int, name: str = "text") -> dict:
    """DataParallel's phases over 1..G GPUs and the plain module's, in turns; for the MLP stack every GPU is synced
    after each phase (its kernels take longer than their launches)."""
    g = torch.cuda.device_count()
    dev0 = torch.device("cuda", 0)
    model, batch, data = build(name, dev0)
    x = data(batch)
    synced = name == "mlp"
    dps = {n: nn.DataParallel(model, device_ids=list(range(n))) for n in range(1, g + 1)}
    points = {"module": lambda: phases_module(model, x, [dev0], synced)}
    for n, dp in dps.items():
        devs = [torch.device("cuda", d) for d in range(n)]
        points[f"dp{n}"] = (lambda dp=dp, devs=devs: phases_dp(dp, x, devs, synced))
    for fn in points.values():  # warm up
        for _ in range(5):
            fn()
    got: dict[str, list] = {k: [] for k in points}
    for r in range(ROUNDS):
        order = list(points)
        random.Random(r).shuffle(order)
        for k in order:
            got[k] += [points[k]() for _ in range(steps)]
    tables = {"module": profile_table(points["module"])} if not synced else {}
    if g >= 2 and not synced:
        tables["dp2"] = profile_table(points["dp2"])
    return {"phases": {k: medians(v) for k, v in got.items()}, "tables": tables}


def ddp_worker(rank: int, world: int, device: torch.device, steps: int) -> dict:
    torch.manual_seed(0)
    model = nn.Linear(5, 2).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index])
    x = torch.randn((TEXT_BATCH + world - 1) // world, 5, device=device)
    for _ in range(5):
        phases_module(ddp, x, [device])
    out = []
    for _ in range(ROUNDS):
        dist.barrier()
        out += [phases_module(ddp, x, [device]) for _ in range(steps)]
    return medians(out)


def main() -> None:
    out_path = Path(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    result = {"command": "python lab/data-parallel/dp_host_breakdown.py " + " ".join(sys.argv[1:]),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__,
              "device": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(), "steps": steps}
    result |= single_process(steps)
    result["mlp"] = single_process(max(steps // 5, 2), "mlp")["phases"]
    result["ddp"] = {}
    for n in range(2, torch.cuda.device_count() + 1):
        result["ddp"][str(n)] = spawn(ddp_worker, n, (steps,), "cuda", timeout_s=60.0, deadline_s=120.0)[0]
    out_path.write_text(json.dumps(result, indent=1))
    for k, v in {**result["phases"], **{f"ddp{n}": v for n, v in result["ddp"].items()},
                 **{f"mlp-{k}": v for k, v in result["mlp"].items()}}.items():
        print(f"{k:8s} " + " ".join(f"{p}={s * 1e6:.0f}" for p, s in v.items()))
    for k, table in result["tables"].items():
        print(k)
        print(table)


if __name__ == "__main__":
    main()
