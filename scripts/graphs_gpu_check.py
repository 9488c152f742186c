"""Check the graphed runtime's loss and gradients against one device, for every schedule it runs on one GPU.

For each schedule (one rank, its stages on this GPU) and each mode (a graph per action; one graph per step),
two steps of hw.run.cuda_graphs' runner, gradients cleared between them, against the whole model on one device running
the same micro-batches in turn (bf16: normwise relative error within bf16's tolerance), and against hw's eager
runner on the same schedule (how many gradient tensors are bit for bit equal). Also a conv net (batch norm).
Writes one JSON file (date, GPU, torch, the command, every case) and prints a table; exit status 1 if a case fails.

Usage: python scripts/graphs_gpu_check.py OUT.json [--cpu]   (~30 s on one H200; --cpu: the eager stand-in)
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time

import torch

from hw.nets.blocks import build_layer
from hw.run.cuda_graphs import local_graph_runner
from hw.run.ranks import release_unused
from hw.run.stage_runner import local_runner, make_batch
from parsim.files import write_atomic
from parsim.schedules import build
from parsim.workload import Model, conv_model, mlp_model, stage_layers

SCHEDULES = [("gpipe", None), ("1f1b", None), ("interleaved-1f1b", 2), ("looped-bfs", 2), ("zb-h1", None),
             ("zbv", None), ("dualpipev", None), ("interleaved-zb", 2)]
BF16_RTOL = 1.6e-2  # torch.testing's tolerance for bf16


def reference(model: Model, microbatches: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, dict]:
    """The whole model on one device, the micro-batches in turn, each loss weighted by its share: loss, gradients."""
    layers = [build_layer(model, i, 0, device).to(dtype) for i in range(len(model.layers))]  # as stage_modules draws
    x, y = make_batch(model, device, dtype)
    loss = None
    for xm, ym in zip(x.chunk(microbatches), y.chunk(microbatches)):
        out = xm
        for layer in layers:
            out = layer(out)
        part = torch.nn.functional.mse_loss(out, ym) * (xm.shape[0] / x.shape[0])
        part.backward()
        loss = part.detach() if loss is None else loss + part.detach()
    return loss, {f"{i}.{n}": p.grad for i, layer in enumerate(layers) for n, p in layer.named_parameters()}


def run_steps(runner, io, model: Model, steps: int = 2) -> tuple[torch.Tensor, dict]:
    """`steps` steps, gradients cleared before each: the last step's loss and gradients by global layer name."""
    params = [p for m in runner.stages.values() for p in m.parameters()]
    for _ in range(steps):
        for p in params:
            p.grad = None
        loss = runner.step(io)
    ids = stage_layers(model, runner.schedule.num_stages)
    return loss, {f"{ids[s][k]}.{n}": p.grad for s, m in runner.stages.items() for k, layer in enumerate(m)
                  for n, p in layer.named_parameters()}


def normwise(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def check(model: Model, name: str, virtual: int | None, microbatches: int, whole_step: bool, device: torch.device,
          dtype: torch.dtype) -> dict:
    schedule = build(name, 1, microbatches, virtual)
    t0 = time.perf_counter()
    graphed, io = local_graph_runner(model, schedule, device, dtype, whole_step=whole_step)
    capture_s = time.perf_counter() - t0
    loss, grads = run_steps(graphed, io, model)
    eager_loss, eager_grads = run_steps(*local_runner(model, schedule, device, dtype), model)
    ref_loss, ref_grads = reference(model, microbatches, device, dtype)
    worst = max(normwise(grads[k], g) for k, g in ref_grads.items())
    loss_error = abs(float(loss) - float(ref_loss)) / max(abs(float(ref_loss)), 1e-30)
    pool = graphed.graph_pool_bytes
    del graphed, io
    release_unused(device)
    return {"model": model.name, "schedule": name, "virtual_stages": virtual, "microbatches": microbatches,
            "mode": "graphs-step" if whole_step else "graphs", "grad_rel_error_vs_one_device": worst,
            "loss_rel_error_vs_one_device": loss_error,
            "bitwise_equal_to_hw_eager": sum(torch.equal(grads[k], g) for k, g in eager_grads.items()),
            "grad_tensors": len(eager_grads), "loss_equal_to_hw_eager": bool(torch.equal(loss, eager_loss)),
            "graphs": 1 if whole_step else sum(a.is_compute for a in schedule.actions[0]),
            "capture_s": capture_s, "graph_pool_bytes": pool,
            "ok": worst <= BF16_RTOL and loss_error <= BF16_RTOL and set(grads) == set(ref_grads)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="JSON file to write")
    p.add_argument("--cpu", action="store_true", help="on the CPU, through the eager stand-in (fp32)")
    p.add_argument("--microbatches", type=int, default=4)
    args = p.parse_args(argv)
    device = torch.device("cpu") if args.cpu else torch.device("cuda", 0)
    if not args.cpu and not torch.cuda.is_available():
        print("error: no CUDA GPU is visible; pass --cpu to run through the eager stand-in", file=sys.stderr)
        return 2
    dtype = torch.float32 if args.cpu else torch.bfloat16
    mlp = mlp_model(8, 64, 64) if args.cpu else mlp_model(8, 512, 2048)
    conv = conv_model(images=16, widths=(4, 8), blocks=(1, 1), side=8) if args.cpu else \
        conv_model(images=64, widths=(32, 64), blocks=(2, 2), side=16)
    cases = [(mlp, name, v, whole) for name, v in SCHEDULES for whole in (False, True)]
    cases += [(conv, "gpipe", None, False), (conv, "zb-h1", None, False), (conv, "1f1b", None, True)]
    results = []
    for model, name, v, whole in cases:
        results.append(check(model, name, v, args.microbatches, whole, device, dtype))
        r = results[-1]
        pool = r["graph_pool_bytes"]
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['model'][:28]:<28} {name:<17} {r['mode']:<11} "
              f"grad err {r['grad_rel_error_vs_one_device']:.2e}  loss err {r['loss_rel_error_vs_one_device']:.2e}  "
              f"bitwise = hw {r['bitwise_equal_to_hw_eager']}/{r['grad_tensors']}  {r['graphs']} graphs "
              f"in {r['capture_s']:.2f} s" + (f", pool {pool['reserved'] / 2**20:.0f} MiB" if pool else ""), flush=True)
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu", "torch": torch.__version__,
           "dtype": str(dtype), "tolerance_normwise": BF16_RTOL,
           "command": "python " + " ".join(sys.argv), "cases": results}
    write_atomic(args.out, json.dumps(doc, indent=2) + "\n")
    failed = [r for r in results if not r["ok"]]
    print(f"{len(results) - len(failed)}/{len(results)} cases within bf16 tolerance of one device; wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
