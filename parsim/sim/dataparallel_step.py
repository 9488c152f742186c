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
from parsim.sim.gil import Gil, GilLaunch, GilThread, gil_thread
from parsim.sim.machine import Launch, Machine, Sync, Task
from parsim.workload import StageCost


@dataclass(frozen=True)
class Replica:
    """What one GPU's replica does in a step: each layer's costs at its share of the batch, its input's bytes, and
    its parameter tensors' bytes (what DataParallel's coalesced comm cuts into chunks)."""

    layers: tuple[StageCost, ...]  # one per layer: forward, backward, output bytes (send_bytes), parameter bytes
    in_bytes: int
    modules: int  # modules `replicate` rebuilds per replica
    tensors: tuple[int, ...] = ()  # in module order; (): one tensor of all the layers' parameter bytes

    @property
    def tensor_bytes(self) -> tuple[int, ...]:
        return self.tensors or (sum(c.grad_bytes for c in self.layers),)


COALESCE_BYTES = 10 << 20  # torch.nn.parallel.comm's buffer_size for broadcast_coalesced and reduce_add_coalesced


def coalesced(tensor_bytes: tuple[int, ...], close_at_limit: bool) -> list[int]:
    """The chunks (their bytes) torch's coalesced comm cuts tensors of one dtype into, one NCCL call each:
    broadcast_coalesced (C++ take_tensors) closes a chunk once it reaches the buffer (close_at_limit);
    reduce_add_coalesced (Python _take_tensors) closes one before a tensor that would overflow it."""
    chunks, size, open_chunk = [], 0, False
    for nbytes in tensor_bytes:
        if not close_at_limit and size and size + nbytes > COALESCE_BYTES:
            chunks.append(size)
            size = 0
        size, open_chunk = size + nbytes, True
        if close_at_limit and size >= COALESCE_BYTES:
            chunks.append(size)
            size, open_chunk = 0, False
    return chunks + [size] if open_chunk else chunks


def need_gil(profile: Profile, replicate: bool = False) -> GilCosts:
    """The profile's GIL costs, or one line naming the calibration that measures them."""
    gil = profile.gil
    if gil is None or not gil.wake or (replicate and gil.replicate_module_s is None):
        what = ("gil section" if gil is None else "gil.wake (wake-up costs; its gil section predates them)"
                if not gil.wake else "gil.replicate_module_s (needs a GPU)")
        raise ProfileError(f"this profile has no {what}, which the data-parallel scenario needs: "
                           "run `python -m hw calibrate --interfaces --out FILE` and pass --profile FILE")
    return gil


def zero_grad_s(costs: GilCosts, modules: int, tensors: int) -> float:
    """zero_grad(set_to_none=True) over `modules` modules holding `tensors` parameter tensors, as hw timed it (0 where
    the profile has no such timing)."""
    if costs.zero_grad_s is None:
        return 0.0
    return (costs.zero_grad_s + (modules - 1) * (costs.zero_grad_module_s or 0.0)
            + (tensors - 1) * (costs.zero_grad_param_s or 0.0))


def final_sync_s(costs: GilCosts, idle_sync_s: float | None, gpus: int) -> float:
    """The step's end: each of `gpus` GPUs synced in turn, the first as a small step's final sync was timed (its
    last kernels' tail; else as an idle GPU's), the rest idle by then (host.sync_s)."""
    idle = idle_sync_s or 0.0
    first = costs.step_sync_s if costs.step_sync_s is not None else idle
    return first + (gpus - 1) * idle


def loss_s(costs: GilCosts) -> float:
    """The loss, `.float().sum()` of the output: as timed, else an elementwise launch."""
    return costs.loss_s if costs.loss_s is not None else costs.launch_s


def need_collective(profile: Profile) -> CollectiveSpec:
    if "allreduce" not in profile.collectives:
        raise ProfileError("this profile has no collectives.allreduce cost, which data parallelism needs: "
                           "re-run `python -m hw calibrate` on several GPUs")
    return profile.collectives["allreduce"]


class _Python:
    """Splits a stretch of host time into the part that holds the GIL and the part that does not, as a launch does."""

    def __init__(self, gil: GilCosts):
        self.held_share = gil.held_share

    def __call__(self, op: Task | None, host_s: float) -> GilLaunch:
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


def chunked_call_s(costs: GilCosts, name: str, gpus: int) -> tuple[float, float]:
    """A coalesced call's host time for its first chunk (`name`, timed on one) and for each further one
    (`name`_chunk); a launch each where not timed."""
    return call_s(costs, name, gpus, costs.launch_s), call_s(costs, f"{name}_chunk", gpus, costs.launch_s)


def backward_stretch(costs: GilCosts, gpus: int) -> float:
    """How much longer autograd's device threads take over their backward's host work when `gpus` of them run at
    once than one alone: hw's probe model's backward over that many GPUs against one GPU (at least 1; 1 where not
    timed)."""
    alone = call_s(costs, "backward", 1, 0.0)
    return max(call_s(costs, "backward", gpus, alone) / alone, 1.0) if alone > 0 else 1.0


def _coalesced_comm(m: Machine, thread: GilThread, python: _Python, label: str, chunks: list[int],
                    host: tuple[float, float], coll: CollectiveSpec, after: list[Task]) -> Task:
    """One coalesced NCCL call, chunk by chunk: the host pays host[0] for the call's first chunk and host[1] for
    each further one, each chunk runs after its issue and the one before it (one latency for the call); its
    last chunk's op."""
    op: Task | None = None
    for i, nbytes in enumerate(chunks):
        op = m.op("nccl", f"{label} ({i + 1}/{len(chunks)})", (0.0 if i else coll.latency_s) + nbytes / coll.busbw_Bps,
                  category="comm")
        op.deps += after
        thread.steps.append(python(op, host[1] if i else host[0]))
    assert op is not None, "a coalesced call moves at least one chunk"
    return op


def _signal(m: Machine, label: str) -> Task:
    """A zero-length op on a track of its own: a host issuing it lets a host syncing on it go on."""
    return m.op(f"signal {label}", label, 0.0)


def data_parallel_step_s(replica: Replica, gpus: int, profile: Profile) -> float:
    """One step of nn.DataParallel over `gpus` GPUs (zero_grad, forward, loss, backward, a sync of every GPU; no
    optimizer), from GPU 0's host."""
    costs = need_gil(profile, replicate=gpus > 1)
    launch_s = costs.launch_s
    m = Machine()
    gil = Gil.calibrated(m.env, costs)
    python = _Python(costs)
    main = gil_thread(m, "main", gil)
    coll = need_collective(profile) if gpus > 1 else None
    link = profile.links["nvlink"]
    main.steps.append(GilLaunch(None, zero_grad_s(costs, replica.modules + 1, len(replica.tensor_bytes)), 0.0))

    # DataParallel's calls, each over all GPUs, as timed (else a launch per copy or chunk, a thread's start and join)
    copies = max(gpus - 1, 1)
    scatter_s = call_s(costs, "scatter", gpus, copies * launch_s) / copies  # per copy
    gather_s = call_s(costs, "gather", gpus, copies * launch_s) / copies
    thread_s = call_s(costs, "parallel_apply", gpus, gpus * costs.thread_s) / gpus  # per thread
    broadcast_s, reduce_s = chunked_call_s(costs, "broadcast", gpus), chunked_call_s(costs, "reduce_add", gpus)

    # 1. scatter the batch from GPU 0 (over one GPU: no copy, the call where timed), 2. replicate: broadcast the
    # parameters, rebuild each module per replica
    inputs: dict[int, list[Task]] = {0: []}
    if gpus == 1 and any(g == 1 for g, _ in costs.calls.get("scatter", ())):
        main.steps.append(GilLaunch(None, call_s(costs, "scatter", 1, 0.0), 0.0))
    if gpus > 1:
        assert coll is not None and costs.replicate_module_s is not None  # needed above for several GPUs
        for d in range(1, gpus):
            copy = m.op(f"link 0->{d}", f"scatter to gpu{d}", link.time_s(replica.in_bytes), category="comm")
            main.steps.append(python(copy, scatter_s))
            inputs[d] = [copy]
        broadcast = _coalesced_comm(m, main, python, "replicate: broadcast parameters",
                                    coalesced(replica.tensor_bytes, close_at_limit=True), broadcast_s, coll, [])
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
    main.steps.append(python(loss, loss_s(costs)))
    called = _signal(m, "backward called")
    # loss.backward(): the call (the seed gradient's launch, autograd's set-up), then the engine's threads take over
    main.steps.append(python(called, launch_s + (costs.backward_call_s or 0.0)))
    done = _backward(m, gil, python, replica, gpus, (loss, called), (scatter_s, reduce_s), coll,
                     link.time_s(out_bytes), backward_stretch(costs, gpus))
    main.steps.append(Sync((done,)))
    return m.run() + final_sync_s(costs, profile.host.sync_s, gpus)


def _forward(m: Machine, thread: GilThread, python: _Python, replica: Replica, gpu: int, after: list[Task]) -> Task:
    """The replica's layers launched one by one on its GPU; the last layer's op."""
    op: Task | None = None
    for i, layer in enumerate(replica.layers):
        op = m.op(f"gpu{gpu} compute", f"F{i} gpu{gpu}", layer.forward.gpu_s)
        if i == 0:
            op.deps += after
        thread.steps.append(python(op, layer.forward.host_s))
    assert op is not None, "a replica has at least one layer"
    return op


def _backward(m: Machine, gil: Gil, python: _Python, replica: Replica, gpus: int, start: tuple[Task, Task],
              host: tuple[float, tuple[float, float]], coll: CollectiveSpec | None, grad_copy_s: float,
              stretch: float) -> Task:
    """Autograd's device threads, from the backward call on: GPU 0's scatters the output gradient (Gather's
    backward, Python), each runs its replica's backward in C++, then GPU 0's reduces the parameter gradients
    chunk by chunk (Broadcast's backward, Python). `start`: the loss's op and the call's signal; `host`: the
    scatter's host time per copy and the reduction's (its first chunk, each further one); `stretch`: the device
    threads' host work's, all running at once (backward_stretch)."""
    loss, called = start
    scatter_s, reduce_s = host
    threads = [gil_thread(m, f"autograd gpu{d}", gil) for d in range(gpus)]
    threads[0].steps.append(Sync((called,)))
    first: dict[int, list[Task]] = {0: [loss]}
    for d in range(1, gpus):
        copy = m.op(f"link 0->{d}", f"grad to gpu{d}", grad_copy_s, category="comm")
        copy.deps.append(loss)
        threads[0].steps.append(python(copy, scatter_s))
        first[d] = [copy]
    ready = _signal(m, "output gradient scattered")
    threads[0].steps.append(GilLaunch(ready, 0.0, 0.0))
    last: list[Task] = []
    finished: list[Task] = []
    for d, thread in enumerate(threads):
        if d:
            thread.steps.append(Sync((ready,)))
        op: Task | None = None
        for i, layer in reversed(list(enumerate(replica.layers))):
            work = layer.backward
            op = m.op(f"gpu{d} compute", f"B{i} gpu{d}", work.gpu_s)
            if i == len(replica.layers) - 1:
                op.deps += first[d]
            host_s = work.host_s * stretch
            thread.steps.append(Launch(op, host_s, host_s / max(work.chunks, 1)))  # C++: no GIL
        assert op is not None, "a replica has at least one layer"
        last.append(op)
        finished.append(_signal(m, f"backward launched gpu{d}"))
        thread.steps.append(Launch(finished[-1], 0.0, 0.0))
    if gpus == 1:
        return last[0]
    threads[0].steps.append(Sync(tuple(finished)))
    assert coll is not None, "several GPUs reduce over a collective"
    return _coalesced_comm(m, threads[0], python, "reduce parameter gradients to gpu0",
                           coalesced(replica.tensor_bytes, close_at_limit=False), reduce_s, coll, last)
