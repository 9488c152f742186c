"""Diagnose compute-bound steps: a layer's GPU time inside hw's real step against calibrate's probes.

One GPU, 16 MLP blocks h=2048, 8192 tokens, 1 micro-batch (the grid's most compute-bound point):
 - in situ: steps of hw's own executor, CUDA events around the forward and the backward action;
 - calibrate's chain probe (4 chained layers, fresh and after ~1 s of load) and the same with 16 layers;
 - the chain probe with every layer's output kept alive, as a real step keeps its activations.
Usage: python lab/gpu-bound/gpu_spans.py OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys

import torch

from hw.run.stage_runner import local_runner
from hw.run.observers import ActionTimer
from hw.nets.blocks import MlpBlock
from hw.timing import gpu_time_s, sync
from parsim.schedules import gpipe
from parsim.workload import mlp_model

H, T, L = 2048, 8192, 16
SUSTAINED_HEAT = 600  # large matmuls before a hot timing: ~1 s of full load, as long as hw measure's timed steps


def in_situ(device: torch.device, steps: int = 10) -> dict:
    model = mlp_model(L, H, T)
    runner, io = local_runner(model, gpipe(1, 1), device, torch.bfloat16)
    stage = runner.stages[0]
    for _ in range(5):
        runner.step(io)
    timer = ActionTimer(device)
    for _ in range(steps):
        for p in stage.parameters():
            p.grad = None
        runner.step(io, timer)
    sync(device)
    per_op = {op: statistics.median(v) / L for (_, op), v in timer.seconds().items()}
    return {"forward_per_layer_s": per_op["F"], "backward_per_layer_s": per_op["B"]}


def chain(device: torch.device, depth: int, keep: bool, heat: int) -> dict:
    stack = torch.nn.Sequential(*(MlpBlock(H) for _ in range(depth))).to(device, torch.bfloat16)
    x = torch.randn(T, H, device=device, dtype=torch.bfloat16, requires_grad=True)
    kept: list[torch.Tensor] = []

    def forward() -> torch.Tensor:
        y = stack(x)
        if keep:
            kept.append(y)  # the graph, and every saved activation, stays alive
            if len(kept) > 4:
                kept.pop(0)
        return y

    y = stack(x)
    g = torch.randn_like(y)
    params = list(stack.parameters())
    fwd = gpu_time_s(forward, device, batch=2, repeat=5, lead_cycles=20_000_000, heat=heat) / depth
    kept.clear()
    full = gpu_time_s(lambda: torch.autograd.grad(y, [x, *params], g, retain_graph=True), device, batch=2,
                      repeat=5, lead_cycles=20_000_000, heat=heat) / depth
    return {"depth": depth, "keep": keep, "heat": heat, "forward_per_layer_s": fwd, "backward_per_layer_s": full}


def main() -> None:
    device = torch.device("cuda", 0)
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "in_situ": [], "chain": []}
    for depth, keep, heat in ((4, False, 0), (4, False, SUSTAINED_HEAT), (16, False, SUSTAINED_HEAT),
                              (4, True, SUSTAINED_HEAT)):
        r = chain(device, depth, keep, heat)
        out["chain"].append(r)
        print(f"chain depth {depth} keep {keep} heat {heat}: forward {r['forward_per_layer_s']*1e3:.3f} ms/layer, "
              f"backward {r['backward_per_layer_s']*1e3:.3f}", flush=True)
    for _ in range(2):
        r = in_situ(device)
        out["in_situ"].append(r)
        print(f"in situ: forward {r['forward_per_layer_s']*1e3:.3f} ms/layer, "
              f"backward {r['backward_per_layer_s']*1e3:.3f}", flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
