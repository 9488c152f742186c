"""Runs one training step of a parsim schedule on this rank, action by action, with torch.distributed.

The rank executes its action list unchanged: the program parsim simulates is the program run here.
Messages travel on one process group per directed channel (src, dst), as parsim models them:
forward activations and backward gradients never queue behind each other.

Recomputation runs a checkpointed micro-batch's stage forward again in its backward: inside autograd's backward
(torch.utils.checkpoint, non-reentrant), after the gradient has arrived; or, under copy streams where the gradient
arrives by a message, early (torchgpipe's Checkpoint/Recompute split): the forward ran under no_grad, and the
backward runs it again with grad before its compute stream waits for the gradient's receive, which the copy stream
moves meanwhile, then backpropagates the received gradient through the rebuilt graph.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from hw.nets.transformer import checkpoint_cores
from hw.usermodel.sources import timed_batch
from parsim.errors import ParsimError
from parsim.schedules import Action, Op, Schedule
from parsim.sim.dataflow import iter_waits, transfers
from parsim.workload import Model, microbatch_tokens, stage_layers
from parsim.workload.recompute import (
    SELECTIVE,
    check_mode,
    early_recomputing_actions,
    recomputes,
    recomputes_cores,
    splits_backward,
)
from parsim.workload.timed import TimedLayer

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (last stage's output, targets) -> loss


class Groups:
    """Process groups made once and reused; every rank asks for the same ones in the same order, as torch needs."""

    def __init__(self) -> None:
        self._made: dict[tuple[int, ...], dist.ProcessGroup] = {}

    def __call__(self, ranks: tuple[int, ...]) -> dist.ProcessGroup:
        if ranks not in self._made:
            self._made[ranks] = dist.new_group(list(ranks))
        return self._made[ranks]


def channel_groups(schedule: Schedule, groups: Groups | None = None, offset: int = 0, stride: int = 1,
                   ) -> dict[tuple[int, int], dist.ProcessGroup]:
    """One two-rank group per directed channel of the pipeline on ranks offset, offset + stride, ..; keyed by
    pipeline ranks (stride: the tensor-parallel degree, whose groups sit between a pipeline's ranks).

    Every process must make every group, its own or not, in the same order.
    """
    groups = groups or Groups()
    return {(a, b): groups((offset + stride * a, offset + stride * b)) for a, b in sorted(transfers(schedule))}


def grad_of(t: torch.Tensor) -> torch.Tensor:
    """`t.grad`, which the caller knows autograd has filled in: one clear error where it has not."""
    if t.grad is None:
        raise ParsimError(f"a tensor of shape {tuple(t.shape)} has no gradient where one was computed")
    return t.grad


def posted(work: dist.Work | None) -> dist.Work:
    """The handle of an asynchronous send, receive or collective (torch returns None only where this rank is not
    in the call's group, which hw never asks)."""
    if work is None:
        raise ParsimError("torch.distributed returned no handle for an asynchronous call of this rank")
    return work


class GradSync:
    """Data parallelism as DDP does it: a stage's gradients in buckets of ~25 MiB (last parameters
    first), each all-reduced over the stage's replicas as soon as its last gradient is final, while
    the rest of the backward runs; finish() waits for them and averages."""

    def __init__(self, module: nn.Module, group: dist.ProcessGroup, replicas: int, bucket_bytes: int = 25 * 2**20):
        self.group, self.replicas = group, replicas
        self.buckets: list[list[nn.Parameter]] = [[]]
        size = 0
        for p in reversed(list(module.parameters())):
            if self.buckets[-1] and size + p.numel() * p.element_size() > bucket_bytes:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += p.numel() * p.element_size()
            p.register_post_accumulate_grad_hook(self._hook(len(self.buckets) - 1))
        self.pending: list[int] | None = None
        self.works: list[tuple[int, torch.Tensor, dist.Work]] = []

    def _hook(self, bucket: int) -> Callable[[torch.Tensor], None]:
        """The hook a parameter of `bucket` calls once its gradient is accumulated."""
        return lambda _: self._ready(bucket)

    def arm(self) -> None:
        """The next gradient each parameter accumulates is its last of the step."""
        self.pending = [len(b) for b in self.buckets]

    def _ready(self, bucket: int) -> None:
        if self.pending is None:
            return
        self.pending[bucket] -= 1
        if self.pending[bucket] == 0:
            flat = torch.cat([grad_of(p).reshape(-1) for p in self.buckets[bucket]])
            self.works.append((bucket, flat, posted(dist.all_reduce(flat, group=self.group, async_op=True))))

    def finish(self) -> None:
        """Wait for every bucket's all-reduce and put the averaged gradients back into .grad."""
        for bucket, flat, work in self.works:
            work.wait()
            flat /= self.replicas
            at = 0
            for p in self.buckets[bucket]:
                grad = grad_of(p)
                grad.copy_(flat[at:at + p.numel()].view_as(grad))
                at += p.numel()
        self.pending, self.works = None, []


@dataclass
class StepState:
    """What the rank holds between actions of one step, each result keyed by the action that made it."""

    inputs: dict[Action, torch.Tensor] = field(default_factory=dict)  # forward -> its stage input
    outputs: dict[Action, torch.Tensor] = field(default_factory=dict)  # forward -> stage output, or loss on the last
    grads: dict[Action, torch.Tensor] = field(default_factory=dict)  # B or I -> grad of the stage's input
    weight_work: dict[Action, list] = field(default_factory=dict)  # forward's, then I's leftovers for W (see I)
    received: dict[Action, tuple[torch.Tensor, dist.Work]] = field(default_factory=dict)  # posted receives
    rng: dict[Action, RngState] = field(default_factory=dict)  # early-recomputed forward -> the RNG it ran from
    sends: list[dist.Work] = field(default_factory=list)
    loss: torch.Tensor | None = None


@dataclass
class StepIO:
    """The batch, split into micro-batches, and how a message between stages is shaped."""

    inputs: list[torch.Tensor]  # per micro-batch, for stage 0
    targets: list[torch.Tensor]  # per micro-batch, for the last stage
    total_rows: int  # rows of the whole batch: each micro-batch's loss is weighted by its share
    stage_shapes: tuple[tuple[int, ...], ...] = ()  # one sample of each stage's output; () as the input (MLP)
    dtype: torch.dtype | None = None  # of the messages between stages; None: the input's (not token ids')

    def message_like(self, a: Action) -> torch.Tensor:
        """A buffer for receive `a`: stage s-1's output for RECV_F(s), the gradient of stage s's output for
        RECV_B(s)."""
        x = self.inputs[a.microbatch]
        if not self.stage_shapes:
            return torch.empty_like(x, dtype=self.dtype)
        shape = self.stage_shapes[a.stage - 1 if a.op == Op.RECV_F else a.stage]
        return x.new_empty((x.shape[0], *shape), dtype=self.dtype)


def split_batch(x: torch.Tensor, y: torch.Tensor, microbatches: int,
                stage_shapes: tuple[tuple[int, ...], ...] = (), dtype: torch.dtype | None = None) -> StepIO:
    """The batch (inputs x, targets y) as `microbatches` equal micro-batches; one clear error where it does not
    split."""
    if x.shape[0] % microbatches:
        raise ParsimError(f"a batch of {x.shape[0]} rows does not split into {microbatches} equal micro-batches")
    return StepIO(list(x.chunk(microbatches)), list(y.chunk(microbatches)), x.shape[0], stage_shapes, dtype)


def stage_shapes(model: Model, num_stages: int) -> tuple[tuple[int, ...], ...]:
    """One sample of each stage's output under the model's split: what crosses each stage boundary."""
    return tuple(model.layers[layers[-1]].out_shape for layers in stage_layers(model, num_stages))


RngState = tuple[torch.Tensor, torch.Tensor | None]  # the CPU generator's state, and the GPU's where it ran there


def rng_state(device: torch.device) -> RngState:
    """The random generators' state a forward runs from (its dropout masks), as torch.utils.checkpoint keeps it."""
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


@contextmanager
def replayed_rng(state: RngState, device: torch.device) -> Iterator[None]:
    """While open, the generators as they were at `state`, so a forward run again draws what it drew; after, as
    they were before."""
    cpu, gpu = state
    with torch.random.fork_rng(devices=[device] if gpu is not None else [], device_type=device.type):
        torch.set_rng_state(cpu)
        if gpu is not None:
            torch.cuda.set_rng_state(gpu, device)
        yield


RECEIVES = frozenset({Op.RECV_F, Op.RECV_B})
Deps = tuple[Action, ...]
Handler = Callable[[Action, Deps, StepIO, StepState], None]


def data_waits(schedule: Schedule, rank: int) -> dict[Action, Deps]:
    """Per action of `rank`, the actions whose data it takes: parsim's own dataflow, as simulated.

    iter_waits on copy streams lists data alone. On the compute stream it adds, for a message, the
    compute issued before it: NCCL enforces that itself (a message waits for the stream current at posting).
    """
    mine = set(schedule.actions[rank])
    return {a: tuple(deps) for a, deps in iter_waits(schedule, copy_streams=True) if a in mine}


class Planned(NamedTuple):
    """One action as a step runs it: its handler, the actions whose data it takes, the receive it waits for first."""

    action: Action
    run: Handler
    deps: Deps
    message: Action | None


class StageRunner:
    """Executes one rank's actions for the stages it hosts."""

    def __init__(self, schedule: Schedule, rank: int, stages: dict[int, nn.Module],
                 groups: dict[tuple[int, int], dist.ProcessGroup], loss_fn: LossFn = nn.functional.mse_loss,
                 offset: int = 0, grad_sync: dict[int, GradSync] | None = None, copy_streams: bool = False,
                 recompute: str = "never", stride: int = 1, early_recompute: bool | None = None):
        """rank is the pipeline rank; offset the global rank of its replica's rank 0 (data parallelism), plus its
        place in its tensor-parallel group, stride that group's size (pipeline rank q is global offset + stride q);
        copy_streams posts messages on a dedicated CUDA stream (no effect on the CPU); recompute: which
        micro-batches' stage forwards are checkpointed (parsim.workload.recompute); early_recompute: whether a
        backward whose gradient arrives by a message runs its forward again before waiting for it (default: under
        copy streams, as parsim predicts it; the CPU's tests ask for it without)."""
        self.schedule, self.rank, self.stages, self.groups = schedule, rank, stages, groups
        on_gpu = any(p.is_cuda for m in stages.values() for p in m.parameters())
        self.copy_stream = torch.cuda.Stream() if copy_streams and on_gpu else None
        self.offset, self.stride, self.grad_sync = offset, stride, grad_sync or {}
        self.last_grad_action = {a.stage: a for a in schedule.actions[rank]
                                 if a.op in (Op.BACKWARD, Op.BACKWARD_WEIGHT)}
        self.loss_fn = loss_fn
        self.last = schedule.num_stages - 1
        self.recompute = check_recompute(schedule, recompute)
        early = copy_streams if early_recompute is None else early_recompute
        self.early = {a for a in early_recomputing_actions(schedule, self.recompute, early)
                      if schedule.stage_to_rank[a.stage] == rank}
        waits = data_waits(schedule, rank)
        self.rebuilt = {waits[a][0] for a in self.early}  # the forwards those backwards run again
        self.program = self._plan(waits)
        self.kept = {deps[0] for a, deps in waits.items() if a.op == Op.BACKWARD_INPUT}  # forwards an I runs from
        if recomputes_cores(recompute):  # each block checkpoints its own attention core, every micro-batch
            for module in stages.values():
                checkpoint_cores(module)

    def _plan(self, waits: dict[Action, Deps]) -> list[Planned]:
        """This rank's actions in program order, each with all it needs, so a step looks nothing up; an early
        recomputing backward waits for its gradient itself, after running its forward again."""
        handlers = {Op.FORWARD: self._forward, Op.BACKWARD: self._backward, Op.BACKWARD_INPUT: self._backward_input,
                    Op.BACKWARD_WEIGHT: self._backward_weight, Op.SEND_F: self._send, Op.SEND_B: self._send,
                    Op.RECV_F: self._recv, Op.RECV_B: self._recv}
        return [Planned(a, self._backward_early, waits[a], None) if a in self.early else
                Planned(a, handlers[a.op], waits[a], next((d for d in waits[a] if d.op in RECEIVES), None))
                for a in self.schedule.actions[self.rank]]

    def step(self, io: StepIO, observe: Callable[[Action, str], None] | None = None) -> torch.Tensor | None:
        """Run every action of this rank once; return the step's loss on the last stage, else None.

        observe(action, "start" | "end") is called around each action (timers, fault injection).
        """
        state = StepState()
        for action, run, deps, message in self.program:
            if message is not None:
                self._await_message(message, state)  # outside the observed span: it times compute only
            if observe:
                observe(action, "start")
            if self.grad_sync and self.last_grad_action.get(action.stage) == action:
                self.grad_sync[action.stage].arm()
            run(action, deps, io, state)
            if observe:
                observe(action, "end")
        for work in state.sends:
            work.wait()
        for sync in self.grad_sync.values():
            sync.finish()
        return state.loss

    def _peer_group(self, a: Action) -> tuple[int, dist.ProcessGroup]:
        peer = self.schedule.peer(a)
        sending = a.op in (Op.SEND_F, Op.SEND_B)
        return peer, self.groups[(self.rank, peer) if sending else (peer, self.rank)]

    @contextmanager
    def _message_stream(self, after: torch.Tensor | None = None) -> Iterator[None]:
        """Where a send or receive is posted. NCCL's stream first waits for the stream current at
        posting: by default the compute stream, so for every kernel launched before. With copy
        streams (torchgpipe's design) it is a dedicated one that waits only for the message's data."""
        if self.copy_stream is None:
            yield
            return
        ready = torch.cuda.current_stream().record_event() if after is not None else None
        with torch.cuda.stream(self.copy_stream):
            if ready is not None:
                self.copy_stream.wait_event(ready)
            yield

    def _recv(self, a: Action, deps: Deps, io: StepIO, st: StepState) -> None:
        peer, group = self._peer_group(a)
        buf = self._receive_buffer(a, io)
        with self._message_stream():
            st.received[a] = (buf, posted(dist.irecv(buf, src=self.offset + self.stride * peer, group=group)))

    def _receive_buffer(self, a: Action, io: StepIO) -> torch.Tensor:
        """Where receive `a` lands: a new buffer each step (a graphed runner has static ones)."""
        return io.message_like(a)

    @staticmethod
    def _await_message(recv: Action, st: StepState) -> None:
        """Before a compute action, wait for the receive whose message it consumes."""
        st.received[recv][1].wait()  # on NCCL: the current stream waits; the host does not

    @staticmethod
    def _handed(src: Action, st: StepState) -> torch.Tensor:
        """What `src` hands the action that depends on it: its received message, a forward's output
        (detached: its gradient goes back by hand), or an input-grad."""
        if src.op in RECEIVES:
            return st.received.pop(src)[0]
        if src.op == Op.FORWARD:
            return st.outputs[src].detach()
        return st.grads.pop(src)

    def _send(self, a: Action, deps: Deps, io: StepIO, st: StepState) -> None:
        peer, group = self._peer_group(a)
        tensor = self._handed(deps[0], st).contiguous()
        with self._message_stream(after=tensor):
            st.sends.append(posted(dist.isend(tensor, dst=self.offset + self.stride * peer, group=group)))

    def _forward(self, a: Action, deps: Deps, io: StepIO, st: StepState) -> None:
        """The stage on the previous stage's output, or on the batch on stage 0 (no deps); the loss on the last."""
        s, i = a.stage, a.microbatch
        x = self._handed(deps[0], st).requires_grad_() if deps else io.inputs[i]
        if a in self.kept:  # keep each weighted module's output: W needs it and the grad reaching it
            with capture_weighted_outputs(self.stages[s]) as captured:
                y = self.stages[s](x)
            st.weight_work[a] = captured
        elif a in self.rebuilt:  # keeps x and the RNG it ran from; its backward runs it again before its gradient
            st.rng[a] = rng_state(x.device)
            with torch.no_grad():
                y = self.stages[s](x)
        elif recomputes(self.recompute, i, self.schedule.num_microbatches):  # keeps x; the backward runs it again
            y = checkpoint(self.stages[s], x, use_reentrant=False)
        else:
            y = self.stages[s](x)
        if s == self.last:
            y = self.loss_fn(y, io.targets[i]) * (x.shape[0] / io.total_rows)
            st.loss = y.detach() if st.loss is None else st.loss + y.detach()
        st.inputs[a], st.outputs[a] = x, y

    def _output_grad(self, deps: Deps, st: StepState) -> torch.Tensor | None:
        """The gradient reaching a stage's output, from the backward's second dep: none on the last stage (the loss)."""
        return self._handed(deps[1], st) if len(deps) > 1 else None

    def _backward(self, a: Action, deps: Deps, io: StepIO, st: StepState) -> None:
        """B: gradients of the stage's input and weights, from its forward (deps[0]) and its output's gradient."""
        x, y = st.inputs.pop(deps[0]), st.outputs.pop(deps[0])
        torch.autograd.backward(y, self._output_grad(deps, st))
        if a.stage > 0:
            st.grads[a] = grad_of(x)

    def _backward_early(self, a: Action, deps: Deps, io: StepIO, st: StepState) -> None:
        """B with its forward run again first (torchgpipe's Recompute): launched on the compute stream before that
        stream waits for the gradient's receive (deps[1]), so it runs while the copy stream moves the gradient; then
        the gradients of the stage's input and weights through the rebuilt graph."""
        forward, recv = deps
        x = st.inputs.pop(forward)
        del st.outputs[forward]  # the no-grad forward's output, kept until now for its send
        with torch.enable_grad(), replayed_rng(st.rng.pop(forward), x.device):
            y = self.stages[a.stage](x)
        self._await_message(recv, st)
        torch.autograd.backward(y, self._handed(recv, st))
        if a.stage > 0:
            st.grads[a] = grad_of(x)

    def _backward_input(self, a: Action, deps: Deps, io: StepIO, st: StepState) -> None:
        """I: gradients of the stage's input and of each weighted module's output, no weight gradient.

        The graph is kept: W later runs each module's own backward node alone, from the gradient
        captured here, so no part of the backward is computed twice.
        """
        forward = deps[0]
        x, y = st.inputs.pop(forward), st.outputs.pop(forward)
        captured = st.weight_work.pop(forward)
        wanted = ([x] if x.requires_grad else []) + [out for _, out in captured]
        grads = torch.autograd.grad(y, wanted, self._output_grad(deps, st), retain_graph=True, allow_unused=True)
        if x.requires_grad:
            st.grads[a], grads = grads[0], grads[1:]
        st.weight_work[a] = [(module, out, g) for (module, out), g in zip(captured, grads, strict=True)
                             if g is not None]

    def _backward_weight(self, a: Action, deps: Deps, io: StepIO, st: StepState) -> None:
        """W: each weighted module's parameter gradients, from its output gradient that I (deps[0]) kept."""
        for module, out, g in st.weight_work.pop(deps[0]):
            torch.autograd.backward(out, g, inputs=list(module.parameters(recurse=False)))


def check_recompute(schedule: Schedule, recompute: str) -> str:
    """The mode, or one clear error where hw's runner cannot recompute `schedule`: one that splits its backward
    (its W needs the module outputs the forward captured, which a checkpointed stage does not keep; selective
    checkpoints only attention cores, which have no weights, so W's captures stay)."""
    if check_mode(recompute) not in ("never", SELECTIVE) and splits_backward(schedule):
        raise ParsimError(f"hw's runner recomputes whole backwards only: {schedule.name} splits its backward, "
                          "and its W needs the outputs its forward captured")
    return recompute


@contextmanager
def capture_weighted_outputs(stage: nn.Module) -> Iterator[list[tuple[nn.Module, torch.Tensor]]]:
    """While open, record (module, output) for every module of `stage` that owns parameters."""
    captured: list[tuple[nn.Module, torch.Tensor]] = []
    def keep(module: nn.Module, _: object, out: torch.Tensor) -> None:
        captured.append((module, out))

    handles = [m.register_forward_hook(keep)
               for m in stage.modules() if next(m.parameters(recurse=False), None) is not None]
    try:
        yield captured
    finally:
        for h in handles:
            h.remove()


def stage_modules(model: Model, schedule: Schedule, rank: int, device: torch.device, dtype: torch.dtype,
                  seed: int = 0) -> dict[int, nn.Module]:
    """The stages this rank hosts, with the weights every rank (and the reference) draws from `seed`."""
    from hw.nets.blocks import build_stage

    return {s: build_stage(model, schedule.num_stages, s, seed, device).to(dtype)
            for s, owner in enumerate(schedule.stage_to_rank) if owner == rank}


def make_batch(model: Model, device: torch.device, dtype: torch.dtype, seed: int = 1,
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Random inputs and targets, the same on every rank: (tokens, hidden) for an MLP stack, (images, C, S, S)
    for a conv net (the first layer's input, the last layer's output); token ids (sequences, seq) into a
    transformer's embedding and out of its head."""
    g = torch.Generator().manual_seed(seed)
    first, last = model.layers[0], model.layers[-1]
    if isinstance(first, TimedLayer):
        return timed_batch(first.source, first.in_shape, last.out_shape, model.tokens, g, device, dtype)
    x = (torch.randint(first.shape.vocab, (model.tokens, *first.in_shape), generator=g) if first.kind == "embed"
         else torch.randn((model.tokens, *first.in_shape), generator=g).to(dtype=dtype))
    y = (torch.randint(last.shape.vocab, (model.tokens, last.shape.seq), generator=g) if last.kind == "head"
         else torch.randn((model.tokens, *last.out_shape), generator=g).to(dtype=dtype))
    return x.to(device), y.to(device)


def local_runner(model: Model, schedule: Schedule, device: torch.device, dtype: torch.dtype,
                 recompute: str = "never") -> tuple[StageRunner, StepIO]:
    """A one-rank schedule's runner, with every stage on this one device, and its batch: a step timed in this
    process, with no process group (calibrate's probes, the diagnostic scripts). Its modules are runner.stages."""
    from hw.nets.blocks import loss_for

    runner = StageRunner(schedule, 0, stage_modules(model, schedule, 0, device, dtype), {}, loss_for(model),
                         recompute=recompute)
    io = split_batch(*make_batch(model, device, dtype), schedule.num_microbatches,
                     stage_shapes(model, schedule.num_stages), dtype)
    return runner, io


Made = tuple[list[dict[tuple[int, int], dist.ProcessGroup]], dict[int, dist.ProcessGroup]]


def clear_grads(runner: StageRunner) -> None:
    """Every .grad of the runner's stages to None, as a step begins in hw measure."""
    for module in runner.stages.values():
        for p in module.parameters():
            p.grad = None


def replica_groups(schedule: Schedule, groups: Groups, data_parallel: int = 1) -> Made:
    """Every replica's channel groups, and per pipeline rank the group of its replicas (replica r on
    ranks r*P ..). Every process makes them all, in one order, whether it takes part or not."""
    p = schedule.num_ranks
    channels = [channel_groups(schedule, groups, r * p) for r in range(data_parallel)]
    replicas = ({q: groups(tuple(q + r * p for r in range(data_parallel))) for q in range(p)} if data_parallel > 1
                else {})
    return channels, replicas


def replica_runner(schedule: Schedule, model: Model, rank: int, device: torch.device, dtype: torch.dtype,
                   made: Made, data_parallel: int = 1, copy_streams: bool = False, recompute: str = "never",
                   early_recompute: bool | None = None) -> tuple[StageRunner, dict[int, nn.Module], int]:
    """This rank's runner, its stages and its replica; gradients averaged over replicas with DDP's buckets;
    early_recompute as StageRunner takes it."""
    channels, replicas = made
    replica, q = divmod(rank, schedule.num_ranks)
    stages = stage_modules(model, schedule, q, device, dtype)
    sync = {s: GradSync(m, replicas[q], data_parallel) for s, m in stages.items()} if replicas else None
    from hw.nets.blocks import loss_for

    runner = StageRunner(schedule, q, stages, channels[replica], loss_for(model), offset=replica * schedule.num_ranks,
                         grad_sync=sync, copy_streams=copy_streams, recompute=recompute,
                         early_recompute=early_recompute)
    return runner, stages, replica


def replica_batch(model: Model, schedule: Schedule, replica: int, data_parallel: int, device: torch.device,
                  dtype: torch.dtype) -> StepIO:
    """The replica's equal share of the batch, split into the schedule's micro-batches."""
    microbatch_tokens(model, schedule.num_microbatches, data_parallel)  # the batch splits evenly, or one clear error
    x, y = make_batch(model, device, dtype)
    return split_batch(x.chunk(data_parallel)[replica], y.chunk(data_parallel)[replica], schedule.num_microbatches,
                       stage_shapes(model, schedule.num_stages), dtype)




