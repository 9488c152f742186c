"""Runs one training step of a parsim schedule on this rank, action by action, with torch.distributed.

The rank executes its action list unchanged: the program parsim simulates is the program run here.
Messages travel on one process group per directed channel (src, dst), as parsim models them:
forward activations and backward gradients never queue behind each other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from parsim.dataflow import transfers
from parsim.errors import ParsimError
from parsim.schedules import Action, Op, Schedule


class Groups:
    """Process groups made once and reused; every rank asks for the same ones in the same order, as torch needs."""

    def __init__(self) -> None:
        self._made: dict[tuple[int, ...], dist.ProcessGroup] = {}

    def __call__(self, ranks: tuple[int, ...]) -> dist.ProcessGroup:
        if ranks not in self._made:
            self._made[ranks] = dist.new_group(list(ranks))
        return self._made[ranks]


def channel_groups(schedule: Schedule, groups: Groups | None = None) -> dict[tuple[int, int], dist.ProcessGroup]:
    """One two-rank group per directed channel; every rank creates them all, in the same order."""
    groups = groups or Groups()
    return {pair: groups(pair) for pair in sorted(transfers(schedule))}


@dataclass
class StepState:
    """What the rank holds between actions of one step."""

    inputs: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)  # (stage, mb) -> stage input
    outputs: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)  # stage output, or loss on the last
    grads: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)  # grad of a stage's input, to send
    weight_work: dict[tuple[int, int], list] = field(default_factory=dict)  # I's leftovers for W (see _backward_input)
    received: dict[Action, tuple[torch.Tensor, dist.Work]] = field(default_factory=dict)  # posted receives
    arrived: dict[Action, torch.Tensor] = field(default_factory=dict)  # compute action -> its message
    sends: list[dist.Work] = field(default_factory=list)
    loss: torch.Tensor | None = None


@dataclass
class StepIO:
    """The batch, split into micro-batches, and how a message between stages is shaped."""

    inputs: list[torch.Tensor]  # per micro-batch, for stage 0
    targets: list[torch.Tensor]  # per micro-batch, for the last stage
    total_rows: int  # rows of the whole batch: each micro-batch's loss is weighted by its share

    def message_like(self, mb: int) -> torch.Tensor:
        return torch.empty_like(self.inputs[mb])  # every stage boundary carries (rows, hidden)


def split_batch(x: torch.Tensor, y: torch.Tensor, microbatches: int) -> StepIO:
    if x.shape[0] % microbatches:
        raise ParsimError(f"a batch of {x.shape[0]} rows does not split into {microbatches} equal micro-batches")
    return StepIO(list(x.chunk(microbatches)), list(y.chunk(microbatches)), x.shape[0])


class StageRunner:
    """Executes one rank's actions for the stages it hosts."""

    def __init__(self, schedule: Schedule, rank: int, stages: dict[int, nn.Module],
                 groups: dict[tuple[int, int], dist.ProcessGroup], loss_fn=nn.functional.mse_loss):
        self.schedule, self.rank, self.stages, self.groups = schedule, rank, stages, groups
        self.loss_fn = loss_fn
        self.last = schedule.num_stages - 1
        self.split_stages = {a.stage for a in schedule.actions[rank] if a.op == Op.BACKWARD_INPUT}

    def step(self, io: StepIO, observe: Callable[[Action, str], None] | None = None) -> torch.Tensor | None:
        """Run every action of this rank once; return the step's loss on the last stage, else None.

        observe(action, "start" | "end") is called around each action (timers, fault injection).
        """
        state = StepState()
        for action in self.schedule.actions[self.rank]:
            self._await_message(action, state)  # outside the observed span: it times compute only
            if observe:
                observe(action, "start")
            self.run(action, io, state)
            if observe:
                observe(action, "end")
        for work in state.sends:
            work.wait()
        return state.loss

    def run(self, a: Action, io: StepIO, st: StepState) -> None:
        handler = {Op.FORWARD: self._forward, Op.BACKWARD: self._backward, Op.BACKWARD_INPUT: self._backward_input,
                   Op.BACKWARD_WEIGHT: self._backward_weight, Op.SEND_F: self._send, Op.SEND_B: self._send,
                   Op.RECV_F: self._recv, Op.RECV_B: self._recv}[a.op]
        handler(a, io, st)

    def _peer_group(self, a: Action) -> tuple[int, dist.ProcessGroup]:
        peer = self.schedule.peer(a)
        sending = a.op in (Op.SEND_F, Op.SEND_B)
        return peer, self.groups[(self.rank, peer) if sending else (peer, self.rank)]

    def _recv(self, a: Action, io: StepIO, st: StepState) -> None:
        peer, group = self._peer_group(a)
        buf = io.message_like(a.microbatch)
        st.received[a] = (buf, dist.irecv(buf, src=peer, group=group))

    def _await_message(self, a: Action, st: StepState) -> None:
        """Before a compute action, wait for the message it consumes (if it comes from another rank)."""
        needs = {Op.FORWARD: (Op.RECV_F, a.stage > 0 and self.schedule.stage_to_rank[a.stage - 1] != self.rank),
                 Op.BACKWARD: (Op.RECV_B, a.stage < self.last
                               and self.schedule.stage_to_rank[a.stage + 1] != self.rank)}
        needs[Op.BACKWARD_INPUT] = needs[Op.BACKWARD]
        needs = needs.get(a.op)
        if needs and needs[1]:
            buf, work = st.received.pop(Action(needs[0], a.stage, a.microbatch))
            work.wait()  # on NCCL: the current stream waits; the host does not
            st.arrived[a] = buf

    def _send(self, a: Action, io: StepIO, st: StepState) -> None:
        peer, group = self._peer_group(a)
        key = (a.stage, a.microbatch)
        tensor = st.outputs[key].detach() if a.op == Op.SEND_F else st.grads.pop(key)
        st.sends.append(dist.isend(tensor.contiguous(), dst=peer, group=group))

    def _forward(self, a: Action, io: StepIO, st: StepState) -> None:
        s, i = a.stage, a.microbatch
        if s == 0:
            x = io.inputs[i]
        elif self.schedule.stage_to_rank[s - 1] == self.rank:
            x = st.outputs[(s - 1, i)].detach().requires_grad_()  # handed over locally; grads go back by hand
        else:
            x = st.arrived.pop(a).requires_grad_()
        if s in self.split_stages:  # keep each weighted module's output: W needs it and the grad reaching it
            with _capture_weighted_outputs(self.stages[s]) as captured:
                y = self.stages[s](x)
            st.weight_work[(s, i)] = captured
        else:
            y = self.stages[s](x)
        if s == self.last:
            y = self.loss_fn(y, io.targets[i]) * (x.shape[0] / io.total_rows)
            st.loss = y.detach() if st.loss is None else st.loss + y.detach()
        st.inputs[(s, i)], st.outputs[(s, i)] = x, y

    def _output_grad(self, a: Action, st: StepState) -> torch.Tensor | None:
        """The gradient arriving at stage a.stage's output: none on the last stage (its output is the loss)."""
        s, i = a.stage, a.microbatch
        if s == self.last:
            return None
        if self.schedule.stage_to_rank[s + 1] == self.rank:
            return st.grads.pop((s + 1, i))
        return st.arrived.pop(a)

    def _backward(self, a: Action, io: StepIO, st: StepState) -> None:
        s, i = a.stage, a.microbatch
        x, y = st.inputs.pop((s, i)), st.outputs.pop((s, i))
        st.weight_work.pop((s, i), None)  # a split stage may still run some micro-batches' backward whole
        torch.autograd.backward(y, self._output_grad(a, st))
        if s > 0:
            st.grads[(s, i)] = x.grad

    def _backward_input(self, a: Action, io: StepIO, st: StepState) -> None:
        """I: gradients of the stage's input and of each weighted module's output, no weight gradient.

        The graph is kept: W later runs each module's own backward node alone, from the gradient
        captured here, so no part of the backward is computed twice.
        """
        s, i = a.stage, a.microbatch
        x, y = st.inputs.pop((s, i)), st.outputs.pop((s, i))
        captured = st.weight_work[(s, i)]
        wanted = ([x] if x.requires_grad else []) + [out for _, out in captured]
        grads = torch.autograd.grad(y, wanted, self._output_grad(a, st), retain_graph=True, allow_unused=True)
        if x.requires_grad:
            st.grads[(s, i)], grads = grads[0], grads[1:]
        st.weight_work[(s, i)] = [(module, out, g) for (module, out), g in zip(captured, grads) if g is not None]

    def _backward_weight(self, a: Action, io: StepIO, st: StepState) -> None:
        """W: each weighted module's parameter gradients, from its output gradient that I kept."""
        for module, out, g in st.weight_work.pop((a.stage, a.microbatch)):
            torch.autograd.backward(out, g, inputs=list(module.parameters(recurse=False)))


@contextmanager
def _capture_weighted_outputs(stage: nn.Module) -> Iterator[list[tuple[nn.Module, torch.Tensor]]]:
    """While open, record (module, output) for every module of `stage` that owns parameters."""
    captured: list[tuple[nn.Module, torch.Tensor]] = []
    handles = [m.register_forward_hook(lambda mod, _, out: captured.append((mod, out)))
               for m in stage.modules() if next(m.parameters(recurse=False), None) is not None]
    try:
        yield captured
    finally:
        for h in handles:
            h.remove()


def stage_modules(model, schedule: Schedule, rank: int, device: torch.device, dtype: torch.dtype,
                  seed: int = 0) -> dict[int, nn.Module]:
    """The stages this rank hosts, with the weights every rank (and the reference) draws from `seed`."""
    from hw.models import build_stage

    return {s: build_stage(model, schedule.num_stages, s, seed, device).to(dtype)
            for s, owner in enumerate(schedule.stage_to_rank) if owner == rank}


def make_batch(model, device: torch.device, dtype: torch.dtype, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Random inputs and targets of (tokens, hidden), the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    shape = (model.tokens, model.layers[0].hidden)
    return (torch.randn(shape, generator=g).to(device, dtype), torch.randn(shape, generator=g).to(device, dtype))


def gradient_step_worker(rank: int, world: int, device: torch.device, schedule: Schedule, model,
                         dtype: torch.dtype, fail_at: tuple[int, int] | None = None) -> dict:
    """One pipelined step: this rank's loss (last stage) and its parameters' gradients by global name."""
    from parsim.workload import partition

    stages = stage_modules(model, schedule, rank, device, dtype)
    runner = StageRunner(schedule, rank, stages, channel_groups(schedule))
    x, y = make_batch(model, device, dtype)
    observe = None
    if fail_at and fail_at[0] == rank:
        done = iter(range(10**9))

        def observe(action: Action, phase: str) -> None:
            if phase == "end" and next(done) == fail_at[1]:
                raise RuntimeError(f"injected failure after {action}")

    loss = runner.step(split_batch(x, y, schedule.num_microbatches), observe)
    layer_ids = partition(len(model.layers), schedule.num_stages)
    grads = {f"{layer_ids[s][k]}.{name}": p.grad.cpu()
             for s, module in stages.items() for k, layer in enumerate(module)
             for name, p in layer.named_parameters()}
    return {"loss": None if loss is None else loss.cpu(), "grads": grads}
