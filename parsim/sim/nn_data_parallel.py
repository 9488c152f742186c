"""nn.DataParallel's training step as torch runs it: one process, a thread per GPU, all under one GIL.

The main thread scatters the batch from GPU 0, replicates the model onto every GPU (a broadcast of the
parameters, then each module rebuilt in Python per replica), starts a thread per GPU that runs its
replica's forward, joins them, gathers the outputs onto GPU 0 and computes the loss there. Backward runs
in autograd's device threads, one per GPU, in C++ without the GIL, except the Python autograd functions
(Gather's backward scatters the output gradient, Broadcast's reduces the parameter gradients onto GPU 0).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from parsim.errors import ProfileError
from parsim.profile import CollectiveSpec, GilCosts, Profile
from parsim.sim.gil import Gil, GilLaunch, GilThread, gil_thread, wake_cost
from parsim.sim.machine import Launch, Machine, Op, Sync
from parsim.workload import StageCost


@dataclass(frozen=True)
class Replica:
    """What one GPU's replica does in a step: each layer's costs at its share of the batch, and its input's bytes."""

    layers: tuple[StageCost, ...]  # one per layer: forward, backward, output bytes (send_bytes), parameter bytes
    in_bytes: int
    modules: int  # modules `replicate` rebuilds per replica


def need_gil(profile: Profile, replicate: bool = False) -> GilCosts:
    """The profile's GIL costs, or one line naming the calibration that measures them."""
    gil = profile.gil
    if gil is None or not gil.wake or (replicate and gil.replicate_module_s is None):
        what = ("gil section" if gil is None else "gil.wake (wake-up costs; its gil section predates them)"
                if not gil.wake else "gil.replicate_module_s (needs a GPU)")
        raise ProfileError(f"this profile has no {what}, which the data-parallel scenario needs: "
                           "run `python -m hw calibrate --interfaces --out FILE` and pass --profile FILE")
    return gil


def need_collective(profile: Profile) -> CollectiveSpec:
    if "allreduce" not in profile.collectives:
        raise ProfileError("this profile has no collectives.allreduce cost, which data parallelism needs: "
                           "re-run `python -m hw calibrate` on several GPUs")
    return profile.collectives["allreduce"]


class _Python:
    """Splits a stretch of host time into the part that holds the GIL and the part that does not, as a launch does."""

    def __init__(self, gil: GilCosts):
        self.held_share = gil.held_share

    def __call__(self, op: Op | None, host_s: float) -> GilLaunch:
        return GilLaunch(op, host_s * self.held_share, host_s * (1 - self.held_share))


def call_s(costs: GilCosts, name: str, gpus: int, unmeasured: float) -> float:
    """DataParallel's call `name` over `gpus` GPUs, as `hw` timed it: linear between the measured GPU counts, along
    the last two beyond them, the nearest with one; `unmeasured` where it was not timed (a one-GPU calibration)."""
    points = sorted(tuple(q) for q in costs.calls.get(name, ()))
    if len(points) < 2:
        return points[0][1] if points else unmeasured
    i = min(max(bisect_left([g for g, _ in points], gpus), 1), len(points) - 1)
    (g0, t0), (g1, t1) = points[i - 1], points[i]
    return max(t0 + (t1 - t0) * (gpus - g0) / (g1 - g0), 0.0)


def _signal(m: Machine, label: str) -> Op:
    """A zero-length op on a track of its own: a host issuing it lets a host syncing on it go on."""
    return m.op(f"signal {label}", label, 0.0)


def data_parallel_step_s(replica: Replica, gpus: int, profile: Profile) -> float:
    """One step of nn.DataParallel over `gpus` GPUs (forward, loss, backward; no optimizer), from GPU 0's host."""
    costs = need_gil(profile, replicate=gpus > 1)
    launch_s = costs.launch_s
    m = Machine()
    gil = Gil(m.env, wake_cost(costs.wake), costs.cores)
    python = _Python(costs)
    main = gil_thread(m, "main", gil)
    coll = need_collective(profile) if gpus > 1 else None
    link = profile.links["nvlink"]
    param_bytes = sum(c.grad_bytes for c in replica.layers)

    # DataParallel's calls, each over all GPUs, as timed (else a launch per copy, a thread's start and join)
    copies = max(gpus - 1, 1)
    scatter_s = call_s(costs, "scatter", gpus, copies * launch_s) / copies  # per copy
    gather_s = call_s(costs, "gather", gpus, copies * launch_s) / copies
    thread_s = call_s(costs, "parallel_apply", gpus, gpus * costs.thread_s) / gpus  # per thread
    reduce_s = call_s(costs, "reduce_add", gpus, launch_s)

    # 1. scatter the batch from GPU 0, 2. replicate: broadcast the parameters, rebuild each module per replica
    inputs: dict[int, list[Op]] = {0: []}
    if gpus > 1:
        for d in range(1, gpus):
            copy = m.op(f"link 0->{d}", f"scatter to gpu{d}", link.time_s(replica.in_bytes), category="comm")
            main.steps.append(python(copy, scatter_s))
            inputs[d] = [copy]
        broadcast = m.op("nccl", "replicate: broadcast parameters",
                         coll.latency_s + param_bytes / coll.busbw_Bps, category="comm")
        main.steps.append(python(broadcast, launch_s))
        main.steps.append(GilLaunch(None, replica.modules * gpus * costs.replicate_module_s, 0.0))
        inputs = {d: ops + [broadcast] if d else ops for d, ops in inputs.items()}  # GPU 0 keeps its own

    # 3. parallel_apply: a thread per GPU runs its replica's forward; main joins them
    last_forward, ended = {}, []
    for d in range(gpus):
        thread = main
        if gpus > 1:
            start = _signal(m, f"start thread{d}")
            main.steps.append(GilLaunch(start, thread_s, 0.0))
            thread = gil_thread(m, f"thread{d}", gil)
            thread.steps.append(Sync((start,)))
        last_forward[d] = _forward(m, thread, python, replica, d, inputs[d])
        if gpus > 1:
            ended.append(_signal(m, f"end thread{d}"))
            thread.steps.append(GilLaunch(ended[-1], 0.0, 0.0))
    if ended:
        main.steps.append(Sync(tuple(ended)))

    # 4. gather the outputs onto GPU 0, the loss there; 5. backward
    out_bytes = replica.layers[-1].send_bytes
    gathered = [last_forward[0]]
    for d in range(1, gpus):
        copy = m.op(f"link {d}->0", f"gather from gpu{d}", link.time_s(out_bytes), category="comm")
        copy.deps.append(last_forward[d])
        main.steps.append(python(copy, gather_s))
        gathered.append(copy)
    loss = m.op("gpu0 compute", "loss", 0.0)
    loss.deps += gathered
    main.steps.append(python(loss, launch_s))
    called = _signal(m, "backward called")
    # loss.backward(): the call (the seed gradient's launch, autograd's set-up), then the engine's threads take over
    main.steps.append(python(called, launch_s + (costs.backward_call_s or 0.0)))
    done = _backward(m, gil, python, replica, gpus, (loss, called), (scatter_s, reduce_s), coll, param_bytes,
                     link.time_s(out_bytes))
    main.steps.append(Sync((done,)))
    return m.run()


def _forward(m: Machine, thread: GilThread, python: _Python, replica: Replica, gpu: int, after: list[Op]) -> Op:
    """The replica's layers launched one by one on its GPU; the last layer's op."""
    op = None
    for i, layer in enumerate(replica.layers):
        op = m.op(f"gpu{gpu} compute", f"F{i} gpu{gpu}", layer.forward.gpu_s)
        if i == 0:
            op.deps += after
        thread.steps.append(python(op, layer.forward.host_s))
    return op


def _backward(m: Machine, gil: Gil, python: _Python, replica: Replica, gpus: int, start: tuple[Op, Op],
              host: tuple[float, float], coll: CollectiveSpec | None, param_bytes: int, grad_copy_s: float) -> Op:
    """Autograd's device threads, from the backward call on: GPU 0's scatters the output gradient (Gather's
    backward, Python), each runs its replica's backward in C++, then GPU 0's reduces the parameter gradients
    (Broadcast's backward, Python). `start`: the loss's op and the call's signal; `host`: the scatter's host time
    per copy and the reduction's."""
    loss, called = start
    scatter_s, reduce_s = host
    threads = [gil_thread(m, f"autograd gpu{d}", gil) for d in range(gpus)]
    threads[0].steps.append(Sync((called,)))
    first: dict[int, list[Op]] = {0: [loss]}
    for d in range(1, gpus):
        copy = m.op(f"link 0->{d}", f"grad to gpu{d}", grad_copy_s, category="comm")
        copy.deps.append(loss)
        threads[0].steps.append(python(copy, scatter_s))
        first[d] = [copy]
    ready = _signal(m, "output gradient scattered")
    threads[0].steps.append(GilLaunch(ready, 0.0, 0.0))
    last, finished = [], []
    for d, thread in enumerate(threads):
        if d:
            thread.steps.append(Sync((ready,)))
        op = None
        for i, layer in reversed(list(enumerate(replica.layers))):
            work = layer.backward
            op = m.op(f"gpu{d} compute", f"B{i} gpu{d}", work.gpu_s)
            if i == len(replica.layers) - 1:
                op.deps += first[d]
            thread.steps.append(Launch(op, work.host_s, work.host_s / max(work.chunks, 1)))  # C++: no GIL
        last.append(op)
        finished.append(_signal(m, f"backward launched gpu{d}"))
        thread.steps.append(Launch(finished[-1], 0.0, 0.0))
    if gpus == 1:
        return last[0]
    reduce = m.op("nccl", "reduce parameter gradients to gpu0", coll.latency_s + param_bytes / coll.busbw_Bps,
                  category="comm")
    reduce.deps += last
    threads[0].steps += [Sync(tuple(finished)), python(reduce, reduce_s)]
    return reduce
