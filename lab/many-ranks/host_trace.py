"""Each rank's host time in a multi-rank eager pipeline step (--ranks), against controls on one rank (issue 43).

    python lab/many-ranks/host_trace.py --out DIR [--cpu] [--model 16x512x4096] [--runtimes hw,torch]
        [--schedules gpipe,1f1b,interleaved-1f1b] [--microbatches 8,32] [--rounds 4] [--steps 3] [--more]

--ranks processes (default 2; hw.run.ranks.spawn: NCCL on GPUs, gloo with --cpu). Every variant below is built once on each rank, then
timed in rounds, one block of each variant per round (so that the host's drift hits them alike): a lead step, then
`--steps` plain steps (timed only: step = zero_grad + runner.step + sync + barrier, as hw measure times it) and
`--steps` traced steps. A traced step records on each rank, on the host's clock (perf_counter) and the main thread's
CPU clock (thread_time):
- each action's span (hw's runner: its observe hook around every action, sends and receives included; torch's
  runtime: its computes, plus torch's `_batch_p2p` (posting a batch), `_wait_batch_p2p` and the stage's
  get_*_ops calls, wrapped from outside);
- inside those: dist.isend / dist.irecv (posting a message, NCCL's launch of its kernel), every Work.wait()
  (a proxy around the returned Work), torch.autograd.backward;
- the step's frame: zero_grad, runner.step, the end-of-step cuda sync, the barrier; Python GC pauses (gc.callbacks);
  the thread's voluntary / involuntary context switches (getrusage) and the process's CPU time per step.
Variants (MODEL = L x H x T, its stage on a rank = L/ranks layers of H at T/m tokens a micro-batch):
- pipe:RUNTIME:SCHEDULE:m      the --ranks-rank pipeline, as hw validate measures it (hw's runner pinned, torch's not)
- alone:RUNTIME:m              rank 0 alone runs a one-rank GPipe of ITS stage (L/ranks layers, m micro-batches; the
                               other ranks idle at a barrier): the same compute actions without messages or a peer
- both:RUNTIME:m               all ranks run that one-rank program at once, independently (no messages): CPU /
                               driver contention between two ranks launching
- gradin:hw:m                  alone, with the input requiring grad (as a received tensor does on stage 1)
- whole:hw                     rank 0 alone, the whole model, one micro-batch (the speedup's denominator)
- probe:N, probe:1             parsim.hostprobe's probe on N = --ranks ranks and on rank 0 alone (host speed per round)
With --more also:
- alone1f1b:RUNTIME:m          alone, in one-rank 1F1B order (F, B, F, B, ...): the order without the messages
- spin:hw:m                    alone, while rank 1 burns CPU in a Python loop about as long (no CUDA, no messages)
- alone:hw:m:same, both:hw:m:same, pipe:hw:SCHEDULE:m:same   HW_PIN=same: autograd's worker on the core of the
                               dispatching thread (hw.run.ranks.host_pinned), not unbound
Writes DIR/trace.json (every traced step's spans per rank, every plain step's time) and prints a summary.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's hw and parsim, run from anywhere
from hw.run.stage_runner import Groups, replica_batch  # noqa: E402
from hw.run.runtimes import job_groups, pins_host, runner_factory  # noqa: E402
from hw.run.ranks import host_pinned, local_rank, spawn  # noqa: E402
from parsim.hostprobe import probe as host_probe  # noqa: E402
from parsim.runtimes import get_runtime  # noqa: E402
from parsim.schedules import gpipe  # noqa: E402
from parsim.workload import mlp_model, model_from_spec  # noqa: E402

NOW = time.perf_counter
CPU = time.thread_time


class Recorder:
    """Spans (name, label, start, end, cpu_start, cpu_end, depth) of one traced step, relative to its start."""

    def __init__(self) -> None:
        self.on = False
        self.hw_mode = False  # stepping hw's runner: its dist.isend / irecv calls are spans
        self.t0 = 0.0
        self.depth = 0
        self.spans: list[tuple] = []
        self.gc: list[float] = []
        self._gc_start = None
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, info: dict) -> None:
        if not self.on:
            return
        if phase == "start":
            self._gc_start = NOW()
        elif self._gc_start is not None:
            self.gc.append(NOW() - self._gc_start)
            self._gc_start = None

    def start(self) -> None:
        self.spans, self.gc, self.depth, self.on = [], [], 0, True
        self.t0 = NOW()

    def stop(self) -> None:
        self.on = False

    def enter(self) -> tuple[float, float, int]:
        d = self.depth
        self.depth += 1
        return NOW(), CPU(), d

    def leave(self, name: str, label: str, opened: tuple[float, float, int]) -> None:
        t, c = NOW(), CPU()
        self.depth -= 1
        if self.on:
            self.spans.append((name, label, opened[0] - self.t0, t - self.t0, c - opened[1], opened[2]))

    def timed(self, name: str, fn, label_of=None):
        rec = self

        def call(*args, **kwargs):
            if not rec.on:
                return fn(*args, **kwargs)
            opened = rec.enter()
            try:
                return fn(*args, **kwargs)
            finally:
                rec.leave(name, label_of(args, kwargs) if label_of else "", opened)

        call.__wrapped__ = fn
        return call


REC: Recorder | None = None


class TimedWork:
    """A Work whose wait() is a span (the host blocked, or the stream made to wait)."""

    def __init__(self, work, name: str):
        self._work, self._name = work, name

    def wait(self, *args, **kwargs):
        if REC is None or not REC.on:
            return self._work.wait(*args, **kwargs)
        opened = REC.enter()
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            REC.leave(self._name, "", opened)

    def __getattr__(self, name):
        return getattr(self._work, name)


def instrument(rec: Recorder) -> None:
    """Wrap, in this process only, what hw's runner and torch's runtime call on the host."""
    import hw.run.stage_runner

    class Dist:
        """torch.distributed as hw's executor sees it, with isend / irecv timed (torch's P2POp, which checks for
        the real functions, is left alone)."""

        def __getattr__(self, name):
            return getattr(dist, name)

    proxy = Dist()
    for name in ("isend", "irecv"):
        inner = getattr(dist, name)

        def posted(*args, _inner=inner, _name=name, **kwargs):
            if not rec.on:
                return _inner(*args, **kwargs)
            opened = rec.enter()
            try:
                work = _inner(*args, **kwargs)
            finally:
                rec.leave(f"dist.{_name}", "", opened)
            return TimedWork(work, f"wait:{_name}")

        setattr(proxy, name, posted)
    hw.run.stage_runner.dist = proxy
    torch.autograd.backward = rec.timed("autograd.backward", torch.autograd.backward)
    try:
        from torch.distributed.pipelining import schedules as ts
    except ImportError:
        return
    if not (hasattr(ts, "_batch_p2p") and hasattr(ts, "_wait_batch_p2p")):
        print("torch.distributed.pipelining.schedules has no _batch_p2p / _wait_batch_p2p: messages not timed",
              file=sys.stderr)
        return
    batch = ts._batch_p2p

    def batch_p2p(ops, *args, **kwargs):
        if not rec.on:
            return batch(ops, *args, **kwargs)
        opened = rec.enter()
        try:
            works = batch(ops, *args, **kwargs)
        finally:
            desc = kwargs.get("desc") or (args[0] if args else "") or ""
            rec.leave("torch._batch_p2p", f"{desc}:{len(ops)}", opened)
        return works

    ts._batch_p2p = batch_p2p
    ts._wait_batch_p2p = rec.timed("torch._wait_batch_p2p", ts._wait_batch_p2p)


def wrap_torch_stage(rec: Recorder, runner) -> None:
    """torch's stage methods that build a batch's P2POps (host work of posting a message)."""
    for stage in getattr(runner, "piped", []):
        for name in ("get_fwd_recv_ops", "get_bwd_recv_ops", "get_fwd_send_ops", "get_bwd_send_ops"):
            if hasattr(stage, name):
                setattr(stage, name, rec.timed(f"torch.{name}", getattr(stage, name)))


class ActionSpans:
    """hw's observe hook: every action (compute and message) as a span named by its op."""

    def __init__(self, rec: Recorder):
        self.rec = rec
        self.open: dict = {}

    def __call__(self, action, phase: str) -> None:
        if not self.rec.on:
            return
        if phase == "start":
            self.open[action] = self.rec.enter()
        else:
            self.rec.leave(f"action:{action.op}", str(action), self.open.pop(action))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Variant:
    """One thing to step on this rank (or nothing: `idle`), and how its steps are settled."""

    def __init__(self, name: str, rank: int, device: torch.device, runtime: str, schedule, model, made,
                 pipeline_rank: int, active: bool, team, gradin: bool = False, spin: bool = False, pin: str = "1"):
        self.name, self.runtime, self.active, self.team = name, runtime, active, team
        self.device = device
        self.schedule, self.model = schedule, model
        self.spin, self.pin = spin, pin  # spin: this rank burns CPU in Python instead; pin: HW_PIN while stepping
        self.spin_s = 0.0036 * schedule.num_microbatches  # about rank 0's step of the same m (16x512x4096)
        if not active or spin:
            self.params, self.io, self.pinned, self.slot = [], None, False, local_rank(rank)
            return
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        self.runner, stages, replica = runner_factory(runtime)(schedule, model, pipeline_rank, device, dtype, made, 1)
        self.io = replica_batch(model, schedule, replica, 1, device, dtype)
        if gradin:
            self.io.inputs = [x.detach().clone().requires_grad_() for x in self.io.inputs]
        self.params = [p for m in stages.values() for p in m.parameters()]
        self.pinned = pins_host(self.runner) and device.type == "cuda"
        self.slot = local_rank(rank)

    def settle(self, rec: Recorder | None = None) -> None:
        o = rec.enter() if rec else None
        sync(self.device)
        if o:
            rec.leave("frame:sync", "", o)
        if self.team is not None:
            o = rec.enter() if rec else None
            dist.barrier(group=self.team)
            if o:
                rec.leave("frame:barrier", "", o)

    def step(self, observe=None, rec: Recorder | None = None) -> None:
        if self.spin:  # a CPU-bound Python loop as long as the peer's step (no CUDA, no messages)
            end = NOW() + self.spin_s
            x = 0
            while NOW() < end:
                x += 1
            return
        o = rec.enter() if rec else None
        for p in self.params:
            p.grad = None
        for x in self.io.inputs if self.io else ():
            if x.requires_grad:
                x.grad = None
        if o:
            rec.leave("frame:zero_grad", "", o)
        o = rec.enter() if rec else None
        self.runner.step(self.io, observe)
        if o:
            rec.leave("frame:runner.step", "", o)


def variants_for(rank: int, world: int, device: torch.device, groups: Groups, args) -> list[Variant]:
    """Every variant, built in one order on every rank (process groups are made collectively)."""
    model = model_from_spec(args.model)
    half = mlp_model(len(model.layers) // world, model.layers[0].hidden, model.tokens)  # one rank's stage
    out: list[Variant] = []
    team = groups(tuple(range(world)))

    def pipe(name, runtime, schedule, mdl):
        made = job_groups(runtime, schedule, groups)
        out.append(Variant(name, rank, device, runtime, schedule, mdl, made, rank, True, team))

    def pipe_pinned(name, runtime, schedule, mdl, pin):
        made = job_groups(runtime, schedule, groups)
        out.append(Variant(name, rank, device, runtime, schedule, mdl, made, rank, True, team, pin=pin))

    def one(name, runtime, schedule, mdl, ranks, gradin=False, spinners=(), pin="1"):
        """A one-rank program on each rank of `ranks` (the others idle, or burning CPU: `spinners`), each with a
        group of its own."""
        mine = {r: groups((r,)) if runtime == "torch" else None for r in range(world)}
        made = mine[rank] if runtime == "torch" else job_groups(runtime, schedule, groups)
        active = rank in ranks or rank in spinners
        together = len(ranks) + len(spinners) > 1
        out.append(Variant(name, rank, device, runtime, schedule, mdl, made, 0, active,
                           team if together else None, gradin, spin=rank in spinners, pin=pin))

    sched, mdl = host_probe(world)
    pipe(f"probe:{world}", "hw", sched, mdl)
    sched1, mdl1 = host_probe(1)
    one("probe:1", "hw", sched1, mdl1, (0,))
    one("whole:hw", "hw", gpipe(1, 1), model, (0,))
    for runtime in args.runtimes:
        for m in args.microbatches:
            one(f"alone:{runtime}:{m}", runtime, get_runtime(runtime).build("gpipe", 1, m), half, (0,))
            one(f"both:{runtime}:{m}", runtime, get_runtime(runtime).build("gpipe", 1, m), half, tuple(range(world)))
            if args.more:
                one(f"alone1f1b:{runtime}:{m}", runtime, get_runtime(runtime).build("1f1b", 1, m), half, (0,))
            if runtime == "hw":
                one(f"gradin:hw:{m}", "hw", gpipe(1, m), half, (0,), gradin=True)
                if args.more:
                    one(f"spin:hw:{m}", "hw", gpipe(1, m), half, (0,), spinners=(1,))
                    one(f"alone:hw:{m}:same", "hw", gpipe(1, m), half, (0,), pin="same")
                    one(f"both:hw:{m}:same", "hw", gpipe(1, m), half, tuple(range(world)), pin="same")
        for name in args.schedules:
            for m in args.microbatches:
                pipe(f"pipe:{runtime}:{name}:{m}", runtime, get_runtime(runtime).build(name, world, m), model)
                if args.more and runtime == "hw" and name != "interleaved-1f1b":
                    pipe_pinned(f"pipe:hw:{name}:{m}:same", runtime, get_runtime(runtime).build(name, world, m),
                                model, "same")
    return out


def rusage() -> tuple[int, int]:
    r = resource.getrusage(getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF))
    return r.ru_nvcsw, r.ru_nivcsw


def worker(rank: int, world: int, device: torch.device, args) -> dict:
    global REC
    REC = rec = Recorder()
    instrument(rec)
    groups = Groups()
    built = time.perf_counter()
    variants = variants_for(rank, world, device, groups, args)
    for v in variants:
        if v.active and v.runtime == "torch":
            wrap_torch_stage(rec, v.runner)
    team = groups(tuple(range(world)))
    observe = ActionSpans(rec)
    for v in variants:  # warm-up, in the same order on every rank
        if v.active:
            for _ in range(args.warmup):
                v.step()
                v.settle()
        dist.barrier(group=team)
    sync(device)
    results: dict[str, dict] = {v.name: {"plain": [], "traced": []} for v in variants}
    built = time.perf_counter() - built
    for rnd in range(args.rounds):
        for v in variants:
            dist.barrier(group=team)
            if not v.active:
                dist.barrier(group=team)
                continue
            rec.hw_mode = v.runtime == "hw"
            os.environ["HW_PIN"] = v.pin
            ctx = host_pinned(device, v.slot) if v.pinned else _null()
            with ctx:
                v.step()  # lead
                v.settle()
                for _ in range(args.steps):
                    t0 = NOW()
                    v.step()
                    v.settle()
                    results[v.name]["plain"].append((rnd, NOW() - t0))
                for _ in range(args.steps):
                    csw0, p0 = rusage(), time.process_time()
                    rec.start()
                    v.step(observe, rec)
                    v.settle(rec)
                    total = NOW() - rec.t0
                    rec.stop()
                    csw1, p1 = rusage(), time.process_time()
                    results[v.name]["traced"].append({
                        "round": rnd, "step_s": total, "spans": rec.spans, "gc_s": rec.gc,
                        "vcsw": csw1[0] - csw0[0], "ivcsw": csw1[1] - csw0[1], "process_cpu_s": p1 - p0})
            dist.barrier(group=team)
    return {"rank": rank, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "build_s": built, "variants": {v.name: {"active": v.active, "runtime": v.runtime,
                                                     "schedule": v.schedule.name,
                                                     "microbatches": v.schedule.num_microbatches,
                                                     "ranks": v.schedule.num_ranks,
                                                     "stages": v.schedule.num_stages,
                                                     "model": v.model.name, "layers": len(v.model.layers),
                                                     "actions": [str(a) for a in v.schedule.actions[0 if v.schedule.num_ranks == 1 else rank]],
                                                     **results[v.name]} for v in variants}}


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def summary(per_rank: list[dict]) -> str:
    lines = []
    for name in per_rank[0]["variants"]:
        parts = []
        for r in per_rank:
            v = r["variants"][name]
            if not v["active"]:
                continue
            plain = statistics.median(s for _, s in v["plain"]) * 1e3
            traced = v["traced"]
            med = statistics.median(t["step_s"] for t in traced) * 1e3
            kinds: dict[str, list[float]] = {}
            for t in traced:
                per: dict[str, float] = {}
                for nm, _, a, b, _, depth in t["spans"]:
                    if (depth == 1 and nm.startswith("action:")) or nm.startswith(("frame:", "torch._")):
                        per[nm] = per.get(nm, 0.0) + (b - a)
                for k, s in per.items():
                    kinds.setdefault(k, []).append(s)
            top = ", ".join(f"{k.split(':', 1)[-1]} {statistics.median(s) * 1e3:.2f}" for k, s in sorted(kinds.items()))
            parts.append(f"r{r['rank']}: plain {plain:.2f} traced {med:.2f} [{top}]")
        lines.append(f"{name:32s} " + " | ".join(parts))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--model", default="16x512x4096")
    ap.add_argument("--runtimes", default="hw,torch")
    ap.add_argument("--schedules", default="gpipe,1f1b,interleaved-1f1b")
    ap.add_argument("--microbatches", default="8,32")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--more", action="store_true", help="also the order, spin and HW_PIN=same variants")
    ap.add_argument("--ranks", type=int, default=2, help="pipeline ranks (default 2); a stage is L / ranks layers")
    args = ap.parse_args()
    args.runtimes = args.runtimes.split(",")
    args.schedules = args.schedules.split(",")
    args.microbatches = [int(m) for m in args.microbatches.split(",")]
    os.makedirs(args.out, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    per_rank = spawn(worker, args.ranks, (args,), "cpu" if args.cpu else "cuda", args.timeout, deadline_s=args.timeout * 8)
    record = {"command": " ".join(["python", *sys.argv]), "date": started, "wall_s": time.perf_counter() - t0,
              "torch": torch.__version__, "python": platform.python_version(), "machine": platform.node(),
              "cpus": os.cpu_count(), "device": per_rank[0]["device"], "args": {k: v for k, v in vars(args).items()},
              "span_fields": ["name", "label", "start_s", "end_s", "thread_cpu_s", "depth"], "ranks": per_rank}
    with open(os.path.join(args.out, "trace.json"), "w") as f:
        json.dump(record, f)
    text = summary(per_rank)
    Path(args.out, "summary.txt").write_text(text + "\n")
    print(text)
    print(f"wall {record['wall_s']:.1f} s")


if __name__ == "__main__":
    main()
