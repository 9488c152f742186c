"""hw's runner with CUDA graphs (hw.run.cuda_graphs): hw's action lists, each compute action one graph launch.

Each stage's forward and backward of each micro-batch are captured once and replayed per action: the
host pays one launch per action (`action_s`), no per-layer launches (`layer_host`, measured: about 0), and
the GPU runs the captured kernels back to back, which saves part of each layer's fixed GPU time
(`gpu_fixed_scale`) and leaves its matmuls as they were (`gpu_scale`), both measured by
`hw calibrate --runtimes graphs`. Messages stay outside the graphs, posted as hw's runner posts them.
`graphs-step` captures a one-GPU step whole: one launch per step (`step_s`), none per action.
"""

from __future__ import annotations

from parsim.errors import ScheduleError
from parsim.runtimes.base import Runtime
from parsim.runtimes.eager import EAGER
from parsim.schedules import Schedule


class GraphsRuntime(Runtime):
    """hw's schedules, messages and waits (EAGER's build), with the graphed runner's costs from the profile."""

    name = "graphs"
    summary = "hw's runner replaying each stage's forward and backward as CUDA graphs: one launch per action"
    copy_streams = True
    graphed = True

    def build(self, schedule: str, num_ranks: int, num_microbatches: int,
              virtual_stages: int | None = None) -> Schedule:
        return EAGER.build(schedule, num_ranks, num_microbatches, virtual_stages)

    def schedules(self) -> tuple[str, ...]:
        return EAGER.schedules()


class StepGraphRuntime(GraphsRuntime):
    """A one-GPU step captured as one graph: no host cost per action, one launch and bookkeeping per step."""

    name = "graphs-step"
    summary = "one CUDA graph per step (one GPU, no messages): one launch per step"
    copy_streams = False

    def build(self, schedule: str, num_ranks: int, num_microbatches: int,
              virtual_stages: int | None = None) -> Schedule:
        if num_ranks != 1:
            raise ScheduleError(f"one graph per step runs on one GPU; with {num_ranks} its messages would have to "
                                "be captured inside the graph: use the graphs runtime")
        return super().build(schedule, num_ranks, num_microbatches, virtual_stages)


GRAPHS = GraphsRuntime()
STEP_GRAPH = StepGraphRuntime()
