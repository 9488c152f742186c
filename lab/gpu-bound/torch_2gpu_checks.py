"""Four candidate causes of torch's multi-stage runtime running slower on two GPUs than parsim predicts, each put
into the model and set against the 2-GPU reference run (issue 12's ranking at 4 micro-batches):

    python lab/gpu-bound/torch_2gpu_checks.py [PROFILE] [CSV]   (default: the shipped profile, the reference run)

1. NCCL kernels holding SMs while they wait for their peer: per rank, how long a message's kernel would run beside
   compute (from the moment its rank could start it to its end), under hw's runner and under torch's, from the
   simulated step. If that stole compute, the runtime with more of it would run slower than modelled.
2. torch posting a message at a higher host cost than hw's runner (`p2p_s`, carried from hw's: two GPUs measure it):
   the reference points re-predicted at several costs.
3. `wait()` blocking torch's host until a receive has arrived: a host sync on each receive before the compute
   that consumes it.
4. A receive's kernel, resident on its SMs while it waits for the peer, slowing the compute beside it: on one H200
   a chunk of MLP blocks ran at 0.6-0.7 of its speed beside a waiting kernel of 4-32 CTAs
   (lab/gpu-bound/resident_kernel.py), and NCCL 2.28 runs a send-receive as 32-64 CTAs. Check 1 split into receives and
   sends (hw's sends fit the peer's buffers: posted after their compute, they need no receiver to finish), and the
   step as the model predicts it without that slowdown and with it (the profile's `resident_comm`,
   parsim.sim.sharing).
"""

from __future__ import annotations

import csv
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's parsim, run from anywhere
from parsim.profile import load_profile  # noqa: E402
from parsim.runtimes import EAGER, TORCH  # noqa: E402
from parsim.schedules import COMPUTE_OPS, PAIRED_RECV  # noqa: E402
from parsim.sim.dataflow import iter_wait_keys  # noqa: E402
from parsim.sim.lower import compute_track, finish_step, lower, runtime_waits  # noqa: E402
from parsim.sim.machine import Launch, Machine, Sync  # noqa: E402
from parsim.sim.predict import predict  # noqa: E402
from parsim.sim.sharing import RECEIVES  # noqa: E402
from parsim.workload import stage_costs  # noqa: E402
from parsim.workload.models import model_from_spec  # noqa: E402

REFERENCE = "data/reference/torch-pipelining-h200x2-2026-11-22.csv"
P2P_US = (96, 200, 300, 500)


def _overlap(start: float, end: float, spans: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in spans)


SENDS = frozenset(PAIRED_RECV)


def comm_beside_compute(schedule, sim, kinds: frozenset[str]) -> list[float]:
    """Per rank, the seconds its messages' kernels (of the `kinds` named) could run beside its compute: from when
    the rank could start each (its host posted it and what it waits for on that rank is done) to the message's end."""
    machine = sim.machine
    op_of = {}
    for stream in machine.streams.values():
        for op in stream.ops:
            label = op.label
            for a in label[:2] if len(label) == 4 else (label,):  # a message's send and receive, or an action
                op_of[a] = op
    posted = {(h.name, id(op)): end for h in machine.hosts for op, _, end in h.spans()}
    more = runtime_waits(schedule.comm) if schedule.comm is not None else {}
    waits = iter_wait_keys(schedule, False)
    out = []
    for rank, acts in enumerate(schedule.actions):
        compute = [(op.start_s, op.end_s) for op in machine.streams[compute_track(rank)].ops]
        total = 0.0
        for a, (_, deps) in zip(acts, waits):  # waits runs rank by rank: this rank's share
            if a.op not in kinds:
                continue
            op = op_of[a]
            ready = posted.get((f"host{rank}", id(op)), 0.0)
            for d in list(deps) + list(more.get(a, [])):
                dep = op_of.get(tuple(d))
                if dep is not None and dep is not op:
                    ready = max(ready, dep.end_s)
            total += _overlap(ready, op.end_s, compute)
        out.append(total)
    return out


def blocking_step_s(schedule, model, profile) -> float:
    """torch's step with its host blocked at each receive until the message has arrived."""
    costs_profile = TORCH.costs(profile)
    costs = stage_costs(model, schedule.num_stages, schedule.num_microbatches, costs_profile)
    machine = Machine()
    lower(machine, schedule, costs, costs_profile)
    for rank, host in enumerate(machine.hosts):
        steps = []
        for step in host.steps:
            label = step.op.label if type(step) is Launch else None
            if label is not None and len(label) == 3 and label[0] in COMPUTE_OPS:
                received = tuple(d for d in step.op.deps if d.category == "comm" and d.label.dst == rank)
                if received:
                    steps.append(Sync(received))
            steps.append(step)
        host.steps[:] = steps
    finish_step(machine, costs_profile.host.step_s, costs_profile.host.begin_s)
    machine.run()
    return max(h.finished_at for h in machine.hosts)


def main() -> None:
    profile = load_profile(sys.argv[1] if len(sys.argv) > 1 else "parsim/profiles/default.json")
    rows = [r for r in csv.DictReader(open(sys.argv[2] if len(sys.argv) > 2 else REFERENCE))
            if r.get("runtime", "torch") == "torch"]
    costs = {us: dataclasses.replace(profile, runtimes={**profile.runtimes, "torch": dataclasses.replace(
        profile.runtimes["torch"], p2p_s=us * 1e-6)}) for us in P2P_US}
    print("point: measured ms | 1. message kernels beside compute, rank 0/1, ms, hw's runner vs torch's | "
          f"2. predicted at p2p_s {', '.join(map(str, P2P_US))} us | 3. host blocked at receives | "
          "4. receives / sends beside compute, hw vs torch; the step without and with their slowdown")
    for r in rows:
        model = model_from_spec(f"{r['layers']}x{r['hidden']}x{r['tokens']}")
        ranks, m, name = int(r["gpus"]), int(r["microbatches"]), r["schedule"]
        measured = float(r["measured_s"]) * 1e3
        beside, split = [], []
        ms = lambda seconds: "/".join(f"{s * 1e3:.1f}" for s in seconds)  # noqa: E731 (per rank)
        for runtime in (EAGER, TORCH):
            schedule = runtime.build(name, ranks, m)
            sim = predict(schedule, model, profile, runtime=runtime if runtime is TORCH else None)[1]
            recvs, sends = (comm_beside_compute(schedule, sim, kinds) for kinds in (RECEIVES, SENDS))
            beside.append(ms(r + s for r, s in zip(recvs, sends)))
            split.append(f"{ms(recvs)} {ms(sends)}")
        schedule = TORCH.build(name, ranks, m)
        at = [predict(schedule, model, costs[us], runtime=TORCH)[0].step_time_s * 1e3 for us in P2P_US]
        blocked = blocking_step_s(schedule, model, profile) * 1e3
        apart = predict(schedule, model, dataclasses.replace(profile, resident_comm=None),
                        runtime=TORCH)[0].step_time_s * 1e3
        shared = predict(schedule, model, profile, runtime=TORCH)[0].step_time_s * 1e3
        print(f"{name} m={m}: {measured:.2f} | hw {beside[0]}, torch {beside[1]} | "
              + ", ".join(f"{t:.1f} ({t / measured - 1:+.0%})" for t in at)
              + f" | {blocked:.1f} ({blocked / measured - 1:+.0%})"
              + f" | hw {split[0]}, torch {split[1]}; "
              + ", ".join(f"{t:.1f} ({t / measured - 1:+.0%})" for t in (apart, shared)))


if __name__ == "__main__":
    main()
