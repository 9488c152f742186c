"""Memory per GPU: weights, gradients and optimizer state, plus the activations and working memory its program
holds, walked layer by layer through the schedule.

A forward adds each layer's stash (what autograd keeps for its backward), and the stage's output, which the
runner keeps until the backward; a backward frees them layer by layer; each layer's transient working memory
counts only while it runs. A split backward's input-grad frees nothing and keeps every weighted module's output
gradient (and the forward keeps those modules' outputs) until its weight-grad has made every gradient; the
weight-grad frees each layer's saved inputs that only weighted modules keep (`LayerMemory.early`) as it goes, after
that layer's gradients. A recomputed micro-batch's forward keeps only its stage's input; its backward runs the
forward again, rebuilding what the forward would have kept, then frees it as any backward does. Selective
recomputation keeps every layer's stash but what its attention core alone keeps (its log-sum-exp): the core's
rebuild in the backward comes after the layer's larger MLP stash is freed, so it raises no peak. The batch itself is
not counted.

A whole backward of the head runs its loss's backward first: the loss's fp32 gradients and log-softmax are freed
before the head's matmul makes its weight gradient. A later backward adds each parameter's new gradient into .grad
as soon as it is made, so it holds one parameter's apart at a time (the layer's largest). Under hw's runner
(`holds_sends`) every tensor a rank sends stays allocated until the step ends, where the runner waits its sends.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from parsim.errors import ModelError
from parsim.schedules import Action, Op, Schedule
from parsim.workload.costs import microbatch_tokens
from parsim.workload.models import Model
from parsim.workload.partition import stage_layers
from parsim.workload.recompute import (
    RECOMPUTING_OPS,
    check_mode,
    loss_kept_bytes_per_token,
    recomputes,
    recomputes_cores,
)

# extra bytes per parameter, beyond the weight, by optimizer
OPTIMIZERS = {
    "adam": "mixed-precision Adam: bf16 weights and gradients, fp32 master weights and two fp32 moments "
            "(16 bytes per parameter), all held for the whole step",
    "none": "weights, and gradients made during the step (what `hw measure` runs: no optimizer step)",
}
MASTER_AND_MOMENTS_BYTES = 12  # Adam's fp32 master weight and two moments


@dataclass(frozen=True)
class LayerMemory:
    """One layer's memory for one micro-batch, in bytes."""

    stash: int
    forward_workspace: int
    backward_workspace: int
    captured: int  # kept from the forward for a split backward's weight-grad
    held: int  # output gradients a split backward's input-grad keeps for its weight-grad
    grads: int  # its parameters' gradients
    grad_step: int  # its largest parameter's gradient: what a later backward holds apart before adding it
    early: int = 0  # of the stash, what a split backward's weight-grad frees as it makes the gradients (see _walk)
    peak_grads: int | None = None  # of its gradients, those made when its backward's working memory peaks; None: all

    def backward_peak(self, made: int) -> int:
        """The most its backward holds beyond what was held before it, `made` its gradients' bytes it makes: its
        working memory beside the gradients made by then (its last weighted module's), or all of them."""
        by_then = made if self.peak_grads is None else min(made, self.peak_grads)
        return max(self.backward_workspace + by_then, made)


def layer_memory(layer: Any, samples: int, selective: bool = False) -> LayerMemory:
    """One layer's memory (a Model's layer: a Layer, or a transformer's) for a micro-batch of `samples`; with
    `selective`, its stash less what its attention core alone keeps (parsim.workload.recompute)."""
    stash = layer.stash_bytes_per_token - (layer.core_freed_bytes_per_token if selective else 0)
    return LayerMemory(stash * samples, layer.forward_workspace_bytes_per_token * samples,
                       layer.backward_workspace_bytes_per_token * samples,
                       layer.captured_bytes_per_token * samples,
                       layer.weight_grad_held_bytes_per_token * samples, layer.params * layer.dtype_bytes,
                       largest_grad_bytes(layer), layer.early_freed_bytes_per_token * samples,
                       peak_grad_bytes(layer))


def peak_grad_bytes(layer: Any) -> int | None:
    """The gradients its backward has made when its working memory peaks (an MLP block's: fc2's, the first
    module its backward runs); None (all of them) for a layer that does not say."""
    params = getattr(layer, "backward_peak_params", None)
    return None if params is None else int(params * layer.dtype_bytes)


def largest_grad_bytes(layer: Any) -> int:
    """Its largest parameter's gradient: autograd adds each parameter's new gradient into .grad as soon as it is
    made (AccumulateGrad runs first of what is ready), so a later backward holds one apart at a time; a layer that
    does not say (a profiled one) counts all of them."""
    return int(getattr(layer, "largest_param", layer.params) * layer.dtype_bytes)


def static_bytes_per_param(optimizer: str, dtype_bytes: int) -> int:
    """Bytes per parameter held the whole step: the weight, and for Adam its gradient, master and moments."""
    if optimizer not in OPTIMIZERS:
        raise ModelError(f"unknown optimizer {optimizer!r}; choose from {', '.join(OPTIMIZERS)}")
    return dtype_bytes + (dtype_bytes + MASTER_AND_MOMENTS_BYTES if optimizer == "adam" else 0)


def rank_peak_bytes(model: Model, schedule: Schedule, samples: int, optimizer: str = "adam",
                    recompute: str = "never", keeps_outputs: bool = False, holds_sends: bool = False) -> list[int]:
    """Per rank of `schedule`, the most memory it holds at once: weights (and, for Adam, gradients and
    optimizer state), plus activations and working memory at the worst point of its program, for
    micro-batches of `samples` samples, recomputed as `recompute` says (parsim.workload.recompute); with
    `keeps_outputs`, the last stage's every output kept to the step's end (a runtime's: torch's); with
    `holds_sends`, every tensor the rank sends kept to the step's end (hw's runner: see sent_bytes)."""
    split = {(a.stage, a.microbatch) for acts in schedule.actions for a in acts if a.op == Op.BACKWARD_INPUT}
    ids_of = stage_layers(model, schedule.num_stages)
    selective = recomputes_cores(check_mode(recompute))
    stages = [[layer_memory(model.layers[i], samples, selective) for i in ids] for ids in ids_of]
    outputs = [model.layers[ids[-1]].out_bytes_per_token * samples for ids in ids_of]
    m = schedule.num_microbatches
    redo = {(s, i) for s in range(schedule.num_stages) for i in range(m) if recomputes(recompute, i, m)}
    last = schedule.num_stages - 1
    apart = checkpointed(stages[last], [model.layers[i] for i in ids_of[last]], samples)  # only a head has a loss
    peaks = []
    for rank, acts in enumerate(schedule.actions):
        mine = [s for s, owner in enumerate(schedule.stage_to_rank) if owner == rank]
        static = sum(static_bytes_per_param(optimizer, model.layers[i].dtype_bytes) * model.layers[i].params
                     for s in mine for i in ids_of[s])
        sent = sent_bytes(acts, outputs) if holds_sends else {}
        peaks.append(_walk(acts, stages, outputs, last, split, static, optimizer == "none", redo, keeps_outputs,
                           apart, sent))
    return peaks


def sent_bytes(acts: tuple[Action, ...], outputs: list[int]) -> dict[Action, int]:
    """Per send of a rank's program, the bytes it keeps allocated to the step's end: hw's runner waits its sends
    only once the step is done, and each send's handle holds its tensor (NCCL's WorkNCCL.outputs_, gloo's send
    work), so a stage's output sent forward outlives its backward, and its input's gradient sent back lives on."""
    return {a: outputs[a.stage] if a.op == Op.SEND_F else outputs[a.stage - 1]
            for a in acts if a.op in (Op.SEND_F, Op.SEND_B)}


def peak_bytes(model: Model, schedule: Schedule, data_parallel: int = 1, optimizer: str = "adam",
               recompute: str = "never", keeps_outputs: bool = False, holds_sends: bool = False) -> int:
    """The most any one GPU of `schedule` holds (rank_peak_bytes), its micro-batches the batch split over
    `data_parallel` replicas and the schedule's micro-batches: what plan screens and hw validate predicts."""
    samples = microbatch_tokens(model, schedule.num_microbatches, data_parallel)
    return max(rank_peak_bytes(model, schedule, samples, optimizer, recompute, keeps_outputs, holds_sends))


def checkpointed(layers: list[LayerMemory], model_layers: list[Any], samples: int,
                 ) -> tuple[LayerMemory | None, list[LayerMemory]]:
    """A stage with its loss apart, as a checkpoint of it runs and as any whole backward frees it: the loss (what a
    head's loss keeps, and its backward's working memory), and the layers without it, a head's: its stash less the
    log-softmax, the logits alone as its working memory (the gradient of the logits, beside which the head's
    matmul makes its weight gradient once the loss's fp32 gradients and log-softmax are freed)."""
    loss, rebuilt = None, []
    for memory, layer in zip(layers, model_layers, strict=True):
        kept = loss_kept_bytes_per_token(layer) * samples
        if not kept:
            rebuilt.append(memory)
            continue
        loss = LayerMemory(kept, 0, memory.backward_workspace, 0, 0, 0, 0)
        logits = layer.out_bytes_per_token * samples
        rebuilt.append(replace(memory, stash=memory.stash - kept, forward_workspace=logits, backward_workspace=logits))
    return loss, rebuilt


def _walk(acts: tuple[Action, ...], stages: list[list[LayerMemory]], outputs: list[int], last: int,
          split: set[tuple[int, int]], static: int, made_grads: bool,
          redo: set[tuple[int, int]] | frozenset[tuple[int, int]] = frozenset(), keeps_outputs: bool = False,
          apart: tuple[LayerMemory | None, list[LayerMemory]] | None = None,
          sent: dict[Action, int] | None = None) -> int:
    """The peak of one rank's program; made_grads: each layer's gradients appear at its first backward; `redo`:
    the (stage, micro-batch) pairs whose forward keeps only its input (outputs[stage - 1]) and what its loss keeps
    outside the checkpoint until recomputed; `apart`: the last stage with its loss apart (checkpointed), whose
    backward runs first in a recomputed or whole backward; keeps_outputs: the last stage's outputs stay to the end,
    where they are merged into one more copy; `sent`: the bytes each send keeps to the end (sent_bytes): a sent
    output is not freed by its backward, a sent input gradient stays from its backward on."""
    held = peak = static
    graded: set[tuple[int, int]] = set()
    sent = sent or {}

    def forward(layers: list[LayerMemory], extra: bool, keep: bool) -> None:
        """A forward's layers one by one: each one's working memory, and its stash kept (`keep`) or not."""
        nonlocal held, peak
        for layer in layers:
            peak = max(peak, held + layer.forward_workspace)
            if keep:
                held += layer.stash + (layer.captured if extra else 0)

    def grads(stage: int, i: int, layer: LayerMemory) -> tuple[int, int]:
        """A layer's backward's gradients: those it leaves (made_grads: the step's first makes .grad), and those
        it holds at once (a later one makes each parameter's gradient apart, then adds it into .grad)."""
        first = (stage, i) not in graded
        graded.add((stage, i))
        kept = layer.grads if first and made_grads else 0
        return kept, (kept if first else layer.grad_step)

    for a in acts:
        layers = stages[a.stage]
        kept = outputs[a.stage] if a.stage != last else 0
        pair = (a.stage, a.microbatch)
        recomputed = pair in redo
        # a split backward's I keeps the loss's graph for its W: only a whole or recomputed backward frees it first
        loss, again = apart if apart and a.stage == last and (recomputed or a.op == Op.BACKWARD) else (None, layers)
        kept_input = outputs[a.stage - 1] if recomputed and a.stage > 0 else 0  # all a recomputed forward keeps
        if a.op == Op.FORWARD:
            forward(layers, pair in split, keep=not recomputed)
            if loss:  # the loss's log-softmax made beside the logits and their fp32 copy
                peak = max(peak, held + layers[-1].forward_workspace + loss.stash)
            held += kept + kept_input + (loss.stash if loss else 0) + \
                (outputs[last] if keeps_outputs and a.stage == last else 0)
        elif a.op in RECOMPUTING_OPS:
            held -= 0 if Action(Op.SEND_F, a.stage, a.microbatch) in sent else kept
            if loss:  # the loss's backward first (outside the checkpoint), its log-softmax freed after it
                peak = max(peak, held + loss.backward_workspace)
                held -= loss.stash
            layers = again
            if recomputed:  # the forward again, its stash rebuilt in place of the input it kept
                held -= kept_input
                forward(layers, pair in split, keep=True)
            for i in reversed(range(len(layers))):
                layer = layers[i]
                if a.op == Op.BACKWARD:
                    new, made = grads(a.stage, i, layer)
                    peak = max(peak, held + layer.backward_peak(made))
                    held += new - layer.stash
                else:
                    peak = max(peak, held + layer.backward_workspace)
                    held += layer.held
            held += sent.get(Action(Op.SEND_B, a.stage, a.microbatch), 0)  # its input's gradient, sent back
        elif a.op == Op.BACKWARD_WEIGHT:  # the graph I kept goes only once every weight-grad is done
            for i, layer in enumerate(layers):
                new, made = grads(a.stage, i, layer)
                peak = max(peak, held + made)
                held += new - layer.early
            held -= sum(layer.stash - layer.early + layer.captured + layer.held for layer in layers)
        peak = max(peak, held)
    if keeps_outputs:  # the kept outputs merged into one tensor at the step's end, beside them
        peak = max(peak, held + outputs[last] * sum(a.op == Op.FORWARD and a.stage == last for a in acts))
    return peak
