"""Does nn.DataParallel's comm wait for the GPUs? (issue 19's gap: over 3-4 H100 its backward leaves every GPU idle
2-5 ms at the same moment, and loss.backward() returns only when the GPUs are done, where on one GPU it returns
half-way.)

    python lab/data-parallel/dp_blocking_probe.py OUT.json

For n = 2..G GPUs, each of DataParallel's comm calls on the MLP stack's parameters (16 x h=2048, bf16) timed by the
host twice, in turns: with every GPU idle, and with every GPU's current stream first given BUSY_MS of a spinning
kernel (torch.cuda._sleep). A call that only enqueues takes the same host time both ways; one that waits for the
GPUs takes about BUSY_MS more. Then DataParallel's backward the same two ways (n = 1: the module's own), and the
host time of its gradient reduction (comm.reduce_add_coalesced) and of each of its chunks (comm.reduce_add), both
wrapped, with how long after the backward call each began; and the backward keeping its graph (retain_graph: what
it saved is freed afterwards, by this thread, not by autograd's device threads as it goes).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import comm

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's hw, run from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lab/ (record)
from hw.interfaces.data_parallel import build  # noqa: E402
from hw.timing import sync_all  # noqa: E402
import record  # noqa: E402

BUSY_MS = 20.0
REPEAT = 5


def spin_cycles(ms: float) -> int:
    """Cycles of torch.cuda._sleep that spin GPU 0 for about `ms` (timed)."""
    d = [torch.device("cuda", 0)]
    cycles = 1_000_000
    torch.cuda._sleep(cycles)
    sync_all(d)
    t = time.perf_counter()
    torch.cuda._sleep(cycles)
    sync_all(d)
    return int(cycles * ms * 1e-3 / (time.perf_counter() - t))


def host_and_wall(fn, devices: list[torch.device], busy: int) -> tuple[float, float]:
    """fn's host time and its time to every GPU done, after `busy` cycles of spinning queued on each GPU (0: none)."""
    sync_all(devices)
    if busy:
        for dev in devices:
            with torch.cuda.device(dev):
                torch.cuda._sleep(busy)
    t = time.perf_counter()
    fn()
    host = time.perf_counter() - t
    sync_all(devices)
    return host, time.perf_counter() - t


def probe_calls(model: nn.Module, x: torch.Tensor, n: int, busy: int) -> dict:
    ids = list(range(n))
    devs = [torch.device("cuda", d) for d in ids]
    params = list(model.parameters())
    grads = [[torch.ones_like(p, device=f"cuda:{d}") for p in params] for d in ids]
    one = [torch.ones(2048 * 8192, device=f"cuda:{d}", dtype=torch.bfloat16) for d in ids]
    outs = [torch.ones(x.shape[0] // n, x.shape[1], device=f"cuda:{d}", dtype=x.dtype) for d in ids]
    calls = {"broadcast_coalesced": lambda: comm.broadcast_coalesced(params, ids),
             "reduce_add_coalesced": lambda: comm.reduce_add_coalesced(grads, 0),
             "reduce_add_one_32MB": lambda: comm.reduce_add(one, 0),
             "scatter": lambda: comm.scatter(x, ids),
             "gather": lambda: comm.gather(outs, 0, 0)}
    out: dict[str, dict[str, list[float]]] = {name: {"idle_host": [], "idle_wall": [], "busy_host": [], "busy_wall": []}
                                              for name in calls}
    for k in range(REPEAT + 1):
        for name, fn in calls.items():
            for mode, cycles in (("idle", 0), ("busy", busy)):
                h, w = host_and_wall(fn, devs, cycles)
                if k:
                    out[name][f"{mode}_host"].append(h)
                    out[name][f"{mode}_wall"].append(w)
    return out


def probe_backward(model: nn.Module, x: torch.Tensor, n: int, busy: int) -> dict:
    devs = [torch.device("cuda", d) for d in range(n)]
    net = nn.DataParallel(model, device_ids=list(range(n))) if n > 1 else model
    chunks: list[tuple[float, float]] = []
    calls: list[tuple[float, float]] = []
    real, real_coalesced = comm.reduce_add, comm.reduce_add_coalesced
    start = [0.0]

    def timed(fn, into):
        def call(*args, **kwargs):
            t = time.perf_counter()
            r = fn(*args, **kwargs)
            into.append((t - start[0], time.perf_counter() - t))
            return r
        return call

    out: dict[str, list] = {"idle_host": [], "idle_wall": [], "busy_host": [], "busy_wall": [], "retained_host": [],
                            "retained_wall": [], "retained_free": [], "chunks_idle": [], "coalesced_idle": []}
    # looked up in the module at each call: by reduce_add_coalesced, and by ReduceAddCoalesced.forward
    comm.reduce_add, comm.reduce_add_coalesced = timed(real, chunks), timed(real_coalesced, calls)
    try:
        for k in range(REPEAT + 2):
            for mode, cycles in (("idle", 0), ("busy", busy), ("retained", 0)):
                net.zero_grad(set_to_none=True)
                loss = net(x).float().sum()
                chunks.clear()
                calls.clear()

                def backward():
                    start[0] = time.perf_counter()
                    loss.backward(retain_graph=mode == "retained")

                h, w = host_and_wall(backward, devs, cycles)
                t = time.perf_counter()
                del loss  # the graph, and with it what it saved: freed here, in this thread, where retained
                free = time.perf_counter() - t
                if k >= 2:
                    out[f"{mode}_host"].append(h)
                    out[f"{mode}_wall"].append(w)
                    if mode == "retained":
                        out["retained_free"].append(free)
                    if mode == "idle":
                        out["chunks_idle"].append(list(chunks))
                        out["coalesced_idle"].append(list(calls))
    finally:
        comm.reduce_add, comm.reduce_add_coalesced = real, real_coalesced
    return out


def main() -> None:
    g = torch.cuda.device_count()
    model, batch, data = build("mlp", torch.device("cuda", 0))
    x = data(batch)
    busy = spin_cycles(BUSY_MS)
    out = {"gpus": g, "busy_ms": BUSY_MS, "busy_cycles": busy, "calls": {}, "backward": {}}
    for n in range(1, g + 1):
        calls = out["calls"][n] = probe_calls(model, x, n, busy) if n > 1 else {}
        back = out["backward"][n] = probe_backward(model, x, n, busy)
        med = statistics.median
        print(f"n={n} (host ms idle -> busy, wall idle -> busy; busy adds {BUSY_MS:.0f} ms of GPU work)")
        for name, t in list(calls.items()) + [("DataParallel backward", back)]:
            print(f"  {name}: host {med(t['idle_host']) * 1e3:.2f} -> {med(t['busy_host']) * 1e3:.2f}, wall "
                  f"{med(t['idle_wall']) * 1e3:.2f} -> {med(t['busy_wall']) * 1e3:.2f}")
        print(f"  backward keeping its graph (retain_graph): host {med(back['retained_host']) * 1e3:.2f}, wall "
              f"{med(back['retained_wall']) * 1e3:.2f}, the graph freed afterwards {med(back['retained_free']) * 1e3:.2f}")
        last = back["chunks_idle"][-1]
        if last:
            print(f"  backward's reduction: {len(last)} chunks, first at {last[0][0] * 1e3:.2f} ms, last ends "
                  f"{(last[-1][0] + last[-1][1]) * 1e3:.2f} ms; chunk host ms median {med(c[1] for c in last) * 1e3:.3f}"
                  f", max {max(c[1] for c in last) * 1e3:.3f}; reduce_add_coalesced "
                  + ", ".join(f"{s * 1e3:.2f}-{(s + d) * 1e3:.2f} ms" for s, d in back["coalesced_idle"][-1]))
    record.write(Path(sys.argv[1]), torch.device("cuda", 0), **out)


if __name__ == "__main__":
    main()
