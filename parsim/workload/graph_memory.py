"""Memory per GPU under the graphed runtimes (hw.run.cuda_graphs): each compute action is a CUDA graph (or a one-GPU
step is one), and all of a rank's graphs share one memory pool, captured in program order.

A capture allocates in the pool as eager PyTorch would, and what one graph frees the graphs captured after it reuse;
since every replay writes where its capture allocated, the pool keeps the most it ever held, so a rank holds its
pool's peak throughout. Unlike hw's eager runner, the graphs keep for every micro-batch each forward's output (the
last stage's too) and each backward's input gradient: they are the static tensors the next graph reads. A stage's
first gradient action (B or W) makes its gradients in the pool; each later one makes them again as temporaries
before adding them in. A split backward's weight-grad frees only what weighted modules keep: the rest of the stash
(the layers' `unweighted_stash_bytes_per_token`) lives as long as the forward's autograd graph, which the kept
output holds for good. It frees the rest as it goes: each weighted module's gradients are made after the modules
before it have released their saved inputs (each autograd.grad call frees its node's; the layers'
`early_freed_bytes_per_token`), so a stage's gradients never sit on its whole stash; the weighted modules' outputs
the stash holds, the captured outputs and the held output gradients go only when it ends, with its list of them. A
head's captured logits are the stage's output, kept anyway: counted once. A whole backward of a head runs its loss's
backward first and frees the loss's log-softmax before the head's matmul makes its weight gradient, as under the
eager runners (parsim.workload.memory.checkpointed). Outside the pool: the weights, one static
buffer per receive, stage 0's copy of the batch's inputs and the last stage's of its targets; a stage's first layer
keeps its input, which is one of those buffers or the previous stage's kept output, so that part of its stash is
not counted twice. The allocator's rounding and the free space in its segments are not modelled: the pool's peak is
what its blocks held at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from parsim.errors import ModelError
from parsim.schedules import Action, Op, Schedule
from parsim.workload.costs import microbatch_tokens
from parsim.workload.memory import LayerMemory, checkpointed, layer_memory, static_bytes_per_param
from parsim.workload.models import Model
from parsim.workload.partition import stage_layers
from parsim.workload.timed import TimedLayer
from parsim.workload.transformer import INDEX_BYTES


@dataclass(frozen=True)
class GraphedStage:
    """One stage of a graphed rank, for one micro-batch of `samples`, in bytes."""

    layers: tuple[LayerMemory, ...]
    unweighted: tuple[int, ...]  # per layer: the stash a split backward's weight-grad leaves held
    input: int  # its input (the previous stage's output, or the batch's inputs), which its first layer keeps
    output: int  # its output (on the last stage, the model's)
    loss: LayerMemory | None = None  # a head's loss apart (checkpointed): a whole backward runs its backward first
    after_loss: tuple[LayerMemory, ...] = ()  # with a loss, the layers as a whole backward frees them after it

    def whole_backward(self) -> GraphedStage:
        """The stage as a whole backward walks it once its loss's backward is done (itself without a loss)."""
        return replace(self, layers=self.after_loss, loss=None) if self.loss else self

    def stash(self, k: int) -> int:
        """Layer k's stash less the stage's input, which the first layer keeps and a static tensor holds already."""
        stash = self.layers[k].stash
        return stash - min(stash, self.input) if k == 0 else stash

    def weight_grad_frees(self, k: int) -> tuple[int, int]:
        """What a split backward's weight-grad frees of layer k: as it goes (the layer's `early`: inputs only weighted
        modules keep), and when it ends (the rest of the stash but what ops without weights keep, the outputs it
        captured, the output gradients it was handed). The stage's input, which the first layer keeps, is a static
        tensor: it leaves the first part."""
        layer = self.layers[k]
        freed = self.stash(k) - min(self.stash(k), self.unweighted[k])
        early = min(freed, layer.early - min(layer.early, self.input) if k == 0 else layer.early)
        return early, freed - early + layer.captured + layer.held


@dataclass(frozen=True)
class GraphedRank:
    """What one graphed rank holds, in bytes: outside the pool, and the pool's peak and its end (what stays
    allocated between steps: gradients, kept outputs and input gradients, what split backwards leave)."""

    static: int  # weights (and, for Adam, master weights and moments; gradients are in the pool)
    buffers: int  # one static buffer per receive, and stage 0's and the last stage's copies of the batch
    pool_peak: int
    pool_end: int

    @property
    def peak(self) -> int:
        return self.static + self.buffers + self.pool_peak


def graphed_ranks(model: Model, schedule: Schedule, samples: int, optimizer: str = "adam",
                  gradients: bool = True) -> list[GraphedRank]:
    """Per rank of `schedule`, what it holds when graphed, for micro-batches of `samples` samples; without
    `gradients`, the activations alone (no weights, no gradients)."""
    ids_of = stage_layers(model, schedule.num_stages)
    inputs = [_input_bytes(model) * samples] + [model.layers[ids[-1]].out_bytes_per_token * samples
                                                for ids in ids_of[:-1]]
    stages = []
    for s, ids in enumerate(ids_of):
        output = model.layers[ids[-1]].out_bytes_per_token * samples
        layers = tuple(layer_memory(model.layers[i], samples) for i in ids)
        if model.layers[ids[-1]].kind == "head":  # the logits it captures are the stage's output, kept anyway
            layers = layers[:-1] + (replace(layers[-1], captured=layers[-1].captured - min(layers[-1].captured,
                                                                                            output)),)
        if not gradients:
            layers = tuple(replace(layer, grads=0) for layer in layers)
        loss, after_loss = checkpointed(list(layers), [model.layers[i] for i in ids], samples)
        stages.append(GraphedStage(layers, tuple(model.layers[i].unweighted_stash_bytes_per_token * samples
                                                 for i in ids), inputs[s], output, loss, tuple(after_loss)))
    batch = (_input_bytes(model) * samples * schedule.num_microbatches,
             _target_bytes(model) * samples * schedule.num_microbatches)
    out = []
    for rank, acts in enumerate(schedule.actions):
        mine = [s for s, owner in enumerate(schedule.stage_to_rank) if owner == rank]
        static = 0
        if gradients:
            static = sum((static_bytes_per_param(optimizer, model.layers[i].dtype_bytes)
                          - (model.layers[i].dtype_bytes if optimizer == "adam" else 0)) * model.layers[i].params
                         for s in mine for i in ids_of[s])
        buffers = (batch[0] if 0 in mine else 0) + (batch[1] if schedule.num_stages - 1 in mine else 0)
        buffers += sum(stages[a.stage].input if a.op == Op.RECV_F else stages[a.stage].output
                       for a in acts if a.op in (Op.RECV_F, Op.RECV_B))
        out.append(GraphedRank(static, buffers, *pool_walk(acts, stages)))
    return out


def graphed_peak_bytes(model: Model, schedule: Schedule, data_parallel: int = 1, optimizer: str = "adam",
                       recompute: str = "never") -> int:
    """The most any one GPU of `schedule` holds when graphed (graphed_ranks), its micro-batches the batch split over
    `data_parallel` replicas and the schedule's micro-batches."""
    check_no_recompute(recompute)
    samples = microbatch_tokens(model, schedule.num_microbatches, data_parallel)
    return max(r.peak for r in graphed_ranks(model, schedule, samples, optimizer))


def graphed_activation_bytes(model: Model, schedule: Schedule, data_parallel: int = 1,
                             recompute: str = "never") -> list[int]:
    """Per rank, the most activation memory it holds when graphed: its pool's peak without gradients, and its
    static buffers."""
    check_no_recompute(recompute)
    samples = microbatch_tokens(model, schedule.num_microbatches, data_parallel)
    return [r.buffers + r.pool_peak for r in graphed_ranks(model, schedule, samples, gradients=False)]


def check_no_recompute(recompute: str) -> None:
    """One clear error for a recompute mode other than never: the graphed runtimes keep every activation."""
    if recompute != "never":
        raise ModelError(f"the graphed runtimes keep every activation (--recompute {recompute}): hw recomputes under "
                         "its eager runner only")


def pool_walk(acts: tuple[Action, ...], stages: list[GraphedStage]) -> tuple[int, int]:
    """The pool's peak and its end over one rank's program in capture order (see the module's docstring)."""
    split = {(a.stage, a.microbatch) for a in acts if a.op == Op.BACKWARD_INPUT}
    first: dict[int, Action] = {}
    for a in acts:
        if a.op in (Op.BACKWARD, Op.BACKWARD_WEIGHT):
            first.setdefault(a.stage, a)
    held = peak = 0
    for a in acts:
        stage, extra = stages[a.stage], (a.stage, a.microbatch) in split
        layers = stage.layers
        if a.op == Op.FORWARD:
            for k, layer in enumerate(layers):
                peak = max(peak, held + layer.forward_workspace)
                held += stage.stash(k) + (layer.captured if extra else 0)
            held += stage.output
        elif a.op in (Op.BACKWARD, Op.BACKWARD_INPUT):
            made = 0  # gradients made, returned together at the end
            if a.op == Op.BACKWARD and stage.loss:  # the loss's backward first, its log-softmax freed after it
                peak = max(peak, held + stage.loss.backward_workspace)
                held -= stage.loss.stash
                stage = stage.whole_backward()
                layers = stage.layers
            for k in reversed(range(len(layers))):
                layer = layers[k]
                if a.op == Op.BACKWARD:
                    peak = max(peak, held + layer.backward_peak(layer.grads))
                    held += layer.grads - stage.stash(k)
                    made += layer.grads
                else:  # input-grad: the stash stays for the weight-grad, beside the output gradients it keeps
                    peak = max(peak, held + layer.backward_workspace)
                    held += layer.held
            held += stage.input if a.stage > 0 else 0  # the input's gradient, kept
            peak = max(peak, held)
            if a.op == Op.BACKWARD and a != first[a.stage]:
                held -= made  # added into the first action's gradients, then freed
        elif a.op == Op.BACKWARD_WEIGHT:  # layer by layer in forward order, as the forward captured the modules
            made = at_end = 0
            for k, layer in enumerate(layers):
                held += layer.grads
                made += layer.grads
                peak = max(peak, held)
                now, later = stage.weight_grad_frees(k)
                held -= now
                at_end += later
            held -= at_end + (made if a != first[a.stage] else 0)
        peak = max(peak, held)
    return peak, held


def _input_bytes(model: Model) -> int:
    """One sample of the batch's inputs: token ids into an embedding (or a profiled model that takes ids), else the
    first layer's input in its dtype (hw.run.stage_runner.make_batch)."""
    first = model.layers[0]
    ids = first.kind == "embed" or (isinstance(first, TimedLayer) and first.source.input_high)
    return int(math.prod(first.in_shape) * (INDEX_BYTES if ids else first.dtype_bytes))


def _target_bytes(model: Model) -> int:
    """One sample of the batch's targets: a class id per row of logits (a transformer's head, a profiled model that
    classifies), else values of the last layer's output."""
    last = model.layers[-1]
    if last.kind == "head" or (isinstance(last, TimedLayer) and last.source.target == "classes"):
        return int(math.prod(last.out_shape[:-1]) * INDEX_BYTES)
    return int(math.prod(last.out_shape) * last.dtype_bytes)
