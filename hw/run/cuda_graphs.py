"""hw's runner with each stage's compute replayed as CUDA graphs: the host pays one launch per action.

Every compute action of the rank (a stage's forward, backward, input-grad or weight-grad of one micro-batch)
is captured once, in program order, into one memory pool per rank, and replayed in that same order every
step: graphs sharing a pool must replay as they were captured, since a later capture may reuse memory an
earlier one freed (Megatron-LM captures one graph per layer and micro-batch in pipeline order for the same
reason). Data moves between graphs through static tensors: a receive lands in its consumer's input buffer,
a stage reads the output of the stage before it on the same rank, the batch is copied into stage 0's inputs.
Weight gradients accumulate inside the graphs as autograd accumulates `.grad`: a stage's first gradient
action of the step (its first B or W) defines them, each later one adds into them, in program order; the
parameters' `.grad` are those static tensors. A `.grad` already there at the start of a step is added in
right after the first action, where autograd would add that action's gradient to it (a + b == b + a, so
bit for bit). Messages stay outside the graphs, posted as hw's runner posts them (StageRunner), on copy
streams if asked.

With `whole_step`, a one-rank pipeline (no messages) captures its whole step as one graph instead.
Where there is no GPU, EagerGraphs stands in for the graphs: same interface, the captured function run
again at each replay, so the CPU tests cover buffers, capture order and gradients.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn

from hw.nets.blocks import loss_for
from hw.run.ranks import release_unused
from hw.run.stage_runner import (
    RECEIVES,
    Deps,
    LossFn,
    Made,
    StageRunner,
    StepIO,
    StepState,
    capture_weighted_outputs,
    make_batch,
    replica_batch,
    split_batch,
    stage_modules,
    stage_shapes,
)
from parsim.errors import ParsimError
from parsim.schedules import Action, Op, Schedule
from parsim.workload import Model

CAPTURE_MODE = "thread_local"  # NCCL's watchdog thread polls its events while a rank captures: only this thread's
# unsafe calls may break the capture (global mode would fail on the watchdog's)


class Graph(Protocol):
    """A captured piece of GPU work: capture(fn) records what fn launches; replay() runs it again."""

    def capture(self, fn: Callable[[], None]) -> None: ...

    def replay(self) -> None: ...


class GraphMaker(Protocol):
    """Makes a rank's graphs, all in one memory pool, and runs the eager warm-up before their capture."""

    def graph(self, label: object) -> Graph: ...

    def warm_up(self, fn: Callable[[], None]) -> None: ...

    def capturing(self) -> contextlib.AbstractContextManager[None]: ...

    def pool_bytes(self) -> dict[str, int] | None: ...


class CudaGraphs:
    """torch.cuda.CUDAGraph objects captured on one side stream into one shared pool."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)
        self.peak = 0  # the most the pool had allocated at once during the last captures

    def graph(self, label: object) -> CudaGraph:
        return CudaGraph(self)

    def warm_up(self, fn: Callable[[], None]) -> None:
        """Run fn eagerly on the capture stream: lazy initialisation (cuBLAS handles, autograd's device thread)
        must not happen inside a capture."""
        with self.on_side_stream():
            fn()
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()  # the warm-up's eager memory goes back; the graphs hold their own pool

    def on_side_stream(self) -> _Joined:
        """`with`: work on the capture stream, after what the current stream has queued; the current one then waits
        for it."""
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        return _Joined(self.stream, self.device)

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """`with`: the captures, recording the most the pool had allocated at once meanwhile: the intermediates a
        graph frees are then allocated, and every replay writes into them again (the allocator counts them free).
        It resets the device's peak-memory count: nothing outside the pool allocates while graphs are captured."""
        torch.cuda.synchronize(self.device)
        outside = torch.cuda.memory_allocated(self.device) - self.pool_bytes()["allocated"]
        torch.cuda.reset_peak_memory_stats(self.device)
        yield
        torch.cuda.synchronize(self.device)
        self.peak = torch.cuda.max_memory_allocated(self.device) - outside

    def pool_bytes(self) -> dict[str, int]:
        """Bytes of the graphs' pool on this GPU: reserved, allocated now, and at the captures' peak."""
        segments = [s for s in torch.cuda.memory_snapshot() if tuple(s.get("segment_pool_id", ())) == tuple(self.pool)]
        return {"reserved": sum(s["total_size"] for s in segments),
                "allocated": sum(s["allocated_size"] for s in segments), "peak": self.peak}


class _Joined:
    """`with`: work on `stream`; afterwards the current stream waits for it."""

    def __init__(self, stream: torch.cuda.Stream, device: torch.device):
        self.stream, self.device = stream, device
        self.context = torch.cuda.stream(stream)

    def __enter__(self) -> None:
        self.context.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.context.__exit__(*exc)
        torch.cuda.current_stream(self.device).wait_stream(self.stream)


class CudaGraph:
    """One CUDA graph of the maker's pool. Captured without torch.cuda.graph's per-capture synchronize and
    garbage collection (a rank captures hundreds)."""

    def __init__(self, maker: CudaGraphs):
        self.maker = maker
        self.cuda_graph = torch.cuda.CUDAGraph()

    def replay(self) -> None:
        """Launch the graph, then record a timing event behind it: without the event, once a process had replayed a few
        hundred graphs, the GPU idled between a step's replays (an event without timing did not help)."""
        self.cuda_graph.replay()
        torch.cuda.Event(enable_timing=True).record()

    def capture(self, fn: Callable[[], None]) -> None:
        with self.maker.on_side_stream():
            self.cuda_graph.capture_begin(pool=self.maker.pool, capture_error_mode=CAPTURE_MODE)
            try:
                fn()
            finally:
                self.cuda_graph.capture_end()


class EagerGraphs:
    """A stand-in for CUDA graphs (the CPU, tests): a graph runs its function at capture and at each replay.

    `log` records ("capture" | "replay", label) in order, to check that replays follow the captures.
    """

    def __init__(self) -> None:
        self.log: list[tuple[str, object]] = []

    def graph(self, label: object) -> EagerGraph:
        return EagerGraph(label, self.log)

    def warm_up(self, fn: Callable[[], None]) -> None:
        fn()

    def capturing(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def pool_bytes(self) -> None:
        return None


class EagerGraph:
    """One stand-in graph: its captured function, run again at each replay."""

    def __init__(self, label: object, log: list[tuple[str, object]]):
        self.label, self.log = label, log
        self.fn: Callable[[], None] | None = None

    def capture(self, fn: Callable[[], None]) -> None:
        self.log.append(("capture", self.label))
        self.fn = fn
        fn()  # as a capture runs the Python once, making the static tensors

    def replay(self) -> None:
        if self.fn is None:
            raise ParsimError(f"graph {self.label} replayed before it was captured")
        self.log.append(("replay", self.label))
        self.fn()


def graph_maker(device: torch.device) -> GraphMaker:
    """CUDA graphs on a GPU, the eager stand-in elsewhere."""
    return CudaGraphs(device) if device.type == "cuda" else EagerGraphs()


@dataclass(eq=False)
class Held:
    """What one action's graph reads and writes, kept from its capture through every replay."""

    x: torch.Tensor | None = None  # F: the stage input as a leaf (a view of a static tensor)
    out: torch.Tensor | None = None  # F: the stage's output; B or I: the gradient of the stage's input
    loss: torch.Tensor | None = None  # F on the last stage: its micro-batch's weighted loss
    weighted: list = field(default_factory=list)  # F: (module, output) for I; I: (module, output, grad) for W


def held(t: torch.Tensor | None, what: object) -> torch.Tensor:
    """A tensor an action holds for a later one, which program order guarantees is there: one clear error where
    it is not."""
    if t is None:
        raise ParsimError(f"{what}'s tensor read before the action that makes it ran")
    return t


def io_shapes(io: StepIO) -> tuple:
    """What the graphs are captured for: a batch of other shapes needs new ones."""
    return (tuple(x.shape for x in io.inputs), tuple(y.shape for y in io.targets), io.total_rows, io.stage_shapes,
            io.inputs[0].dtype, io.inputs[0].device)


class GraphRunner(StageRunner):
    """Executes one rank's actions as StageRunner does, each compute action a replay of its captured graph."""

    def __init__(self, schedule: Schedule, rank: int, stages: dict[int, nn.Module],
                 groups: dict[tuple[int, int], dist.ProcessGroup], graphs: GraphMaker,
                 loss_fn: LossFn = nn.functional.mse_loss, copy_streams: bool = False, whole_step: bool = False):
        super().__init__(schedule, rank, stages, groups, loss_fn, copy_streams=copy_streams)
        if whole_step and any(not a.is_compute for a in schedule.actions[rank]):
            raise ParsimError("one graph per step runs a one-GPU pipeline only: a rank that sends or receives "
                              "would need its NCCL messages captured in the graph")
        self.graphs, self.whole_step = graphs, whole_step
        self.params = [p for s in sorted(stages) for p in stages[s].parameters()]
        self.acc: dict[nn.Parameter, torch.Tensor] = {}  # each parameter's gradient of the step: its .grad
        # stage -> its first gradient-producing action (B or W): it defines self.acc
        self.first_grad: dict[int, Action] = {}
        for a in schedule.actions[rank]:
            if a.op in (Op.BACKWARD, Op.BACKWARD_WEIGHT):
                self.first_grad.setdefault(a.stage, a)
        self.carried: dict[int, list[tuple[torch.Tensor, nn.Parameter]]] = {}  # stage -> .grad there at the start
        self.held: dict[Action, Held] = {}
        self.replays: dict[Action, Callable[[], None]] = {}
        self.whole: Graph | None = None
        self.shapes: tuple | None = None
        self.io: StepIO | None = None
        self.captures = 0  # capture passes run: one per batch shape
        self.graph_pool_bytes: dict[str, int] | None = None
        self.inputs: list[torch.Tensor] = []  # the static tensors outside the pool (_static_tensors)
        self.targets: list[torch.Tensor] = []
        self.received: dict[Action, torch.Tensor] = {}

    # --- capture (warm-up, before any timed step) ------------------------------------------------------------

    def prepare(self, io: StepIO) -> None:
        """Capture every compute action of the rank for io's shapes, in program order (once per shape)."""
        self.io = io
        shapes = io_shapes(io)
        if shapes == self.shapes:
            return
        self._static_tensors(io)
        functions = {p.action: self._function(p.action, p.deps) for p in self.program if p.action.is_compute}
        saved = [b.detach().clone() for m in self.stages.values() for b in m.buffers()]

        def run_all() -> None:
            for fn in functions.values():
                fn()

        def warm_up() -> None:
            run_all()
            self._forget()

        self.graphs.warm_up(warm_up)
        self.replays, self.whole = {}, None
        collecting = gc.isenabled()
        gc.disable()  # a collection mid-capture could destroy an old runner's graphs (see hw.run.ranks.release_unused)
        try:
            with self.graphs.capturing():
                if self.whole_step:
                    self.whole = self.graphs.graph("step")
                    self.whole.capture(run_all)
                else:
                    for a, fn in functions.items():
                        graph = self.graphs.graph(a)
                        graph.capture(fn)
                        self.replays[a] = graph.replay
        finally:
            if collecting:
                gc.enable()
        with torch.no_grad():  # the warm-up (and the stand-in's capture) ran the forwards: batch norm's statistics
            for b, kept in zip((b for m in self.stages.values() for b in m.buffers()), saved, strict=True):
                b.copy_(kept)
        self.shapes, self.captures = shapes, self.captures + 1
        self.graph_pool_bytes = self.graphs.pool_bytes()

    def _static_tensors(self, io: StepIO) -> None:
        """The graphs' inputs: the batch's micro-batches on stage 0 and targets on the last stage, and one
        buffer per receive; each gets its data before a replay reads it."""
        zeros = torch.zeros_like
        self.inputs = [zeros(x) for x in io.inputs] if 0 in self.stages else []
        self.targets = [zeros(y) for y in io.targets] if self.last in self.stages else []
        self.received = {a: io.message_like(a).zero_() for a in self.schedule.actions[self.rank] if a.op in RECEIVES}
        self.total_rows = io.total_rows
        self.held = {a: Held() for a in self.schedule.actions[self.rank] if a.is_compute}
        self.loss_sum: torch.Tensor | None = None
        forwards = [a for a in self.schedule.actions[self.rank] if a.op == Op.FORWARD and a.stage == self.last]
        self.first_loss = forwards[0] if forwards else None

    def _forget(self) -> None:
        """Drop what the warm-up left in the held tensors and its gradients (its eager memory, not to be held beside
        the captures' own), keeping each Held object."""
        for h in self.held.values():
            h.x = h.out = h.loss = None
            h.weighted = []
        self.loss_sum = None
        self.acc = {}

    def static_bytes(self) -> int:
        """Bytes of the static tensors outside the graphs' pool: the batch's copies and one buffer per receive."""
        tensors = [*self.inputs, *self.targets, *self.received.values()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def _source(self, dep: Action) -> Callable[[], torch.Tensor]:
        """Where an action reads what `dep` hands it: a receive's buffer, or the static output of a forward
        (its stage's output) or a backward (its input's gradient) on this rank."""
        if dep.op in RECEIVES:
            buffer = self.received[dep]
            return lambda: buffer
        kept = self.held[dep]
        return lambda: held(kept.out, dep)

    def _function(self, a: Action, deps: Deps) -> Callable[[], None]:
        """The function a graph captures for action `a`, reading its inputs when it runs."""
        make = {Op.FORWARD: self._forward_fn, Op.BACKWARD: self._backward_fn,
                Op.BACKWARD_INPUT: self._backward_input_fn, Op.BACKWARD_WEIGHT: self._backward_weight_fn}[a.op]
        return make(a, deps)

    def _forward_fn(self, a: Action, deps: Deps) -> Callable[[], None]:
        """The stage on its input (the previous stage's output, or the batch on stage 0); the loss on the last,
        summed into loss_sum in program order, as StageRunner sums it."""
        stage, h, i = self.stages[a.stage], self.held[a], a.microbatch
        source = self._source(deps[0]) if deps else None
        kept, last, first = a in self.kept, a.stage == self.last, a == self.first_loss

        def forward() -> None:
            x = source().detach().requires_grad_() if source else self.inputs[i]
            if kept:  # I and W need each weighted module's output
                with capture_weighted_outputs(stage) as captured:
                    y = stage(x)
                h.weighted = captured
            else:
                y = stage(x)
            h.x, h.out = x, y
            if last:
                h.loss = loss = self.loss_fn(y, self.targets[i]) * (x.shape[0] / self.total_rows)
                if first:
                    self.loss_sum = loss.detach().clone()
                else:
                    held(self.loss_sum, "the step's loss").add_(loss.detach())

        return forward

    def _root(self, a: Action, f: Held) -> torch.Tensor:
        """What a backward of `a` starts from: its forward's loss on the last stage, else its forward's output."""
        return held(f.loss if a.stage == self.last else f.out, a)

    def _backward_fn(self, a: Action, deps: Deps) -> Callable[[], None]:
        """B: the input's gradient, and the weights' added into their accumulators."""
        f, h = self.held[deps[0]], self.held[a]
        grad = self._source(deps[1]) if len(deps) > 1 else None
        params = list(self.stages[a.stage].parameters())
        first = a == self.first_grad[a.stage]

        def backward() -> None:
            fx = held(f.x, deps[0])
            x = [fx] if fx.requires_grad else []
            grads = torch.autograd.grad(self._root(a, f), x + params, grad() if grad else None)
            if x:
                h.out, grads = grads[0], grads[1:]
            self._accumulate(params, grads, first)

        return backward

    def _accumulate(self, params: list[nn.Parameter], grads: Sequence[torch.Tensor], first: bool) -> None:
        """The stage's first gradient action defines the step's gradients; each later one adds into them."""
        if first:
            self.acc.update(zip(params, _owned(grads), strict=True))
        else:
            torch._foreach_add_([self.acc[p] for p in params], list(grads))

    def _backward_input_fn(self, a: Action, deps: Deps) -> Callable[[], None]:
        """I: the input's gradient and each weighted module's output gradient, the graph kept for W."""
        f, h = self.held[deps[0]], self.held[a]
        grad = self._source(deps[1]) if len(deps) > 1 else None

        def backward_input() -> None:
            captured, f.weighted = f.weighted, []
            fx = held(f.x, deps[0])
            x = [fx] if fx.requires_grad else []
            grads = torch.autograd.grad(self._root(a, f), x + [out for _, out in captured], grad() if grad else None,
                                        retain_graph=True, allow_unused=True)
            if x:
                h.out, grads = grads[0], grads[1:]
            h.weighted = [(module, out, g) for (module, out), g in zip(captured, grads, strict=True)
                          if g is not None]

        return backward_input

    def _backward_weight_fn(self, a: Action, deps: Deps) -> Callable[[], None]:
        """W: each weighted module's parameter gradients from the output gradient I kept, added in."""
        i, first = self.held[deps[0]], a == self.first_grad[a.stage]

        def backward_weight() -> None:
            work, i.weighted = i.weighted, []
            params: list[nn.Parameter] = []
            grads: list[torch.Tensor] = []
            for module, out, g in work:
                mine = list(module.parameters(recurse=False))
                grads += torch.autograd.grad(out, mine, g)
                params += mine
            self._accumulate(params, grads, first)

        return backward_weight

    # --- a step ----------------------------------------------------------------------------------------------

    def step(self, io: StepIO, observe: Callable[[Action, str], None] | None = None) -> torch.Tensor | None:
        """Run every action of this rank once, each compute a replay; return the step's loss on the last stage."""
        if io is not self.io:
            self.prepare(io)
        self._begin(io)
        if self.whole is not None:
            self.whole.replay()
        else:
            super().step(io, observe)
        self._finish()
        return None if self.loss_sum is None else self.loss_sum.clone()  # the static sum changes next step

    def _begin(self, io: StepIO) -> None:
        """The batch into the static inputs; any .grad already there set aside to add in after the first action."""
        if self.inputs:
            torch._foreach_copy_(self.inputs, io.inputs)
        if self.targets:
            torch._foreach_copy_(self.targets, io.targets)
        if self.copy_stream is not None:  # this step's receives land in buffers the last step's graphs read
            self.copy_stream.wait_stream(torch.cuda.current_stream())
        self.carried = {}
        if all(p.grad is None for p in self.params):
            return
        if self.whole is not None:
            raise ParsimError("one graph per step needs every .grad cleared (None) before the step; to accumulate "
                              "gradients over steps, run the graphs runtime (a graph per action)")
        for s, module in self.stages.items():
            # the first action overwrites the static gradients, which may be these very tensors
            self.carried[s] = [(p.grad.clone() if p.grad is self.acc.get(p) else p.grad, p)
                               for p in module.parameters() if p.grad is not None]

    def _add_carried(self, stage: int) -> None:
        """After the stage's first gradient action: old .grad + its gradient, as autograd would have summed them."""
        pairs = self.carried.pop(stage, None)
        if pairs:
            torch._foreach_add_([self.acc[p] for _, p in pairs], [old for old, _ in pairs])

    def _finish(self) -> None:
        """Each parameter's .grad is its static gradient (or, where it had a tensor of its own, holds its value)."""
        for p in self.params:
            acc, g = self.acc.get(p), p.grad
            if acc is None or g is acc:
                continue
            if g is None:
                p.grad = acc
            elif g.data_ptr() != acc.data_ptr():
                g.copy_(acc)

    def _receive_buffer(self, a: Action, io: StepIO) -> torch.Tensor:
        return self.received[a]

    def _forward(self, a: Action, deps: Deps, io: StepIO, st: StepState) -> None:
        if deps and deps[0].op in RECEIVES:
            del st.received[deps[0]]  # its message is already in the graph's input buffer
        self.replays[a]()
        st.outputs[a] = held(self.held[a].out, a)

    def _backward(self, a: Action, deps: Deps, io: StepIO, st: StepState) -> None:
        if len(deps) > 1 and deps[1].op in RECEIVES:
            del st.received[deps[1]]
        self.replays[a]()
        if self.carried and a.op == Op.BACKWARD and a == self.first_grad[a.stage]:
            self._add_carried(a.stage)
        if a.stage > 0:
            st.grads[a] = held(self.held[a].out, a)

    _backward_input = _backward

    def _backward_weight(self, a: Action, deps: Deps, io: StepIO, st: StepState) -> None:
        self.replays[a]()
        if self.carried and a == self.first_grad[a.stage]:
            self._add_carried(a.stage)


def _owned(grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The gradients as tensors of their own (a clone where one shares memory with another or is not
    contiguous): later actions add into them in place."""
    seen: set[int] = set()
    out: list[torch.Tensor] = []
    for g in grads:
        ptr = g.untyped_storage().data_ptr()
        if ptr in seen or not g.is_contiguous():
            g = g.clone()
        seen.add(ptr)
        out.append(g)
    return out


def graphs_runner(schedule: Schedule, model: Model, rank: int, device: torch.device, dtype: torch.dtype, made: Made,
                  data_parallel: int = 1, copy_streams: bool = False, whole_step: bool = False,
                  ) -> tuple[GraphRunner, dict[int, nn.Module], int]:
    """hw.run.runtimes' factory for the graphs runtime: this rank's GraphRunner with its graphs captured now, on a
    batch of the job's shapes, so no timed step captures."""
    if data_parallel > 1:
        raise ParsimError("the graphs runtime runs one pipeline replica: its gradients accumulate inside the graphs, "
                          "where DDP's bucket hooks never fire")
    channels, _ = made
    release_unused(device)
    stages = stage_modules(model, schedule, rank, device, dtype)
    runner = GraphRunner(schedule, rank, stages, channels[0], graph_maker(device), loss_for(model),
                         copy_streams=copy_streams, whole_step=whole_step)
    runner.prepare(replica_batch(model, schedule, 0, 1, device, dtype))
    return runner, stages, 0


def step_graph_runner(schedule: Schedule, model: Model, rank: int, device: torch.device, dtype: torch.dtype,
                      made: Made, data_parallel: int = 1, copy_streams: bool = False,
                      ) -> tuple[GraphRunner, dict[int, nn.Module], int]:
    """hw.run.runtimes' factory for one graph per step (one rank, no messages)."""
    return graphs_runner(schedule, model, rank, device, dtype, made, data_parallel, copy_streams, whole_step=True)


def local_graph_runner(model: Model, schedule: Schedule, device: torch.device, dtype: torch.dtype,
                       whole_step: bool = False) -> tuple[GraphRunner, StepIO]:
    """executor.local_runner's graphed twin: a one-rank schedule's GraphRunner on this device, captured, and its
    batch (calibrate's probes, scripts/graphs_gpu_check.py)."""
    runner = GraphRunner(schedule, 0, stage_modules(model, schedule, 0, device, dtype), {}, graph_maker(device),
                         loss_for(model), whole_step=whole_step)
    io = split_batch(*make_batch(model, device, dtype), schedule.num_microbatches,
                     stage_shapes(model, schedule.num_stages))
    runner.prepare(io)
    return runner, io
