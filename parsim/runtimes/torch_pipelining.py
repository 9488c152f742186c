"""torch.distributed.pipelining's runtime, as torch 2.11 runs it (the version of the lent GPUs and the shipped profile).

What decides its step, read from its source (torch/distributed/pipelining/schedules.py):
- GPipe and 1F1B (PipelineScheduleSingle) post their messages from hand-written loops. GPipe receives
  just before each compute and, after the last forward, makes the compute stream wait for every forward
  send. 1F1B posts a forward's send together with the next backward's receive (and a backward's send
  with the next forward's receive) in one batch_isend_irecv and waits for the whole batch, so a compute
  also waits for the send posted with its receive; in warm-up and cool-down each compute's stream waits
  for the send posted before the previous compute.
- The other classes (_PipelineScheduleRuntime) run a comm-annotated list that torch builds itself
  (_add_send_recv): a send right after the compute that produces it, and the matching receive appended
  to the receiver's list at that moment, as the lists are laid down rank by rank in turns (FSDP's
  unshard/reshard and reduce-grad actions take turns too, though they cost nothing here). A compute
  waits for the receive it consumes; sends are waited for at the end of the step. Adjacent stages on
  one rank hand over without a message.
- Every message goes through batch_isend_irecv, which in 2.11 coalesces onto the process group's one
  NCCL stream per device: all of a rank's sends and receives run in posting order on one stream, so a
  receive posted early holds back later sends to any peer (pytorch/pytorch PR 165664, issue 175225;
  torch 2.12 dispatches single sends and receives on per-peer streams instead). Each batch is posted
  on the compute stream, so it first waits for the kernels launched before it, as hw's are.

Those programs are built in parsim.runtimes.torch_programs, loaded when the runtime first builds a schedule.
"""

from __future__ import annotations

from parsim.errors import ScheduleError
from parsim.runtimes.base import Runtime
from parsim.schedules import TORCH_PREFIX, Schedule

TORCH_VERSION = "2.11"
CLASSES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B", "looped-bfs": "LoopedBFS",
           "interleaved-zb": "InterleavedZeroBubble", "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}
MULTI_STAGE = {"interleaved-1f1b", "looped-bfs", "interleaved-zb"}  # v stages per rank, looped


class TorchPipelining(Runtime):
    """torch.distributed.pipelining's PipelineStage and schedule classes (see the module docstring)."""

    name = "torch"
    summary = f"torch.distributed.pipelining's schedule classes and runtime (torch {TORCH_VERSION})"
    keeps_outputs = True  # PipelineStage.output_chunks: the last stage's outputs, merged and returned by step()

    def schedules(self) -> tuple[str, ...]:
        return tuple(sorted(CLASSES))

    def check_name(self, schedule: str) -> None:
        schedule_key(schedule)

    def build(self, schedule: str, num_ranks: int, num_microbatches: int,
              virtual_stages: int | None = None) -> Schedule:
        name = schedule_key(schedule)
        p, m = num_ranks, num_microbatches
        if p < 1 or m < 1:
            raise ScheduleError(f"need at least one GPU and one micro-batch, got {p} and {m}")
        if name in MULTI_STAGE:
            v = virtual_stages or 2
            if v < 2:
                raise ScheduleError(f"torch's {CLASSES[name]} runs at least two stages per GPU, got {v}")
        elif virtual_stages not in (None, 2 if name in ("zbv", "dualpipev") else 1):
            raise ScheduleError(f"torch's {CLASSES[name]} sets its own stages per GPU; --virtual-stages does not apply")
        if name == "1f1b" and m < p:
            raise ScheduleError(f"torch's Schedule1F1B needs at least as many micro-batches as stages ({p}), got {m}")
        from parsim.runtimes.torch_programs import torch_schedule  # here: only a torch schedule built needs them

        return torch_schedule(name, p, m, virtual_stages or 2)


def schedule_key(text: str) -> str:
    """A torch schedule by parsim's name or torch's class name (`torch:Interleaved1F1B`)."""
    key = text.lower()
    if key.startswith(TORCH_PREFIX):
        by_class = {c.lower(): n for n, c in CLASSES.items()}
        key = by_class.get(key.removeprefix(TORCH_PREFIX), "")
    if key not in CLASSES:
        names = ", ".join(f"{n} ({c})" for n, c in CLASSES.items())
        raise ScheduleError(f"the torch runtime runs torch.distributed.pipelining's classes: {names}; got {text!r}")
    return key


TORCH = TorchPipelining()
