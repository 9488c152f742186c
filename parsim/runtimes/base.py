"""What a runtime is: the part of the model that runs a schedule's actions on the host.

A runtime decides where each rank's sends and receives sit and how they are batched, what waits on
what (Schedule.comm), and what the host pays per compute action, per layer and per message (its
costs in the profile). The machine (the profile) and the schedule are the other two parts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace
from typing import TYPE_CHECKING

from parsim.errors import ProfileError, ScheduleError
from parsim.profile import ACCUMULATE, KernelCost, LayerCosts, OpCost, Profile, RuntimeCosts, correction_at
from parsim.schedules import SPLITS_BACKWARD, TORCH_PREFIX, Schedule, placement

if TYPE_CHECKING:
    from parsim.workload import Model


class Runtime(ABC):
    """A named way of running schedules: it builds them as it orders them and says what they cost its host."""

    name: str
    summary: str  # one line for --help and reports
    copy_streams: bool = False  # it posts messages as hw's runner does, so hw's copy streams apply
    keeps_outputs: bool = False  # its last stage keeps every micro-batch's output until the step ends
    holds_sends: bool = False  # each send's handle, and so its tensor, kept until the step ends (hw's runner)
    graphed: bool = False  # each compute action a CUDA graph, a rank's in one pool (parsim.workload.graph_memory)

    @abstractmethod
    def build(self, schedule: str, num_ranks: int, num_microbatches: int,
              virtual_stages: int | None = None) -> Schedule:
        """The named schedule with its messages placed, batched and awaited as this runtime does."""

    @abstractmethod
    def schedules(self) -> tuple[str, ...]:
        """The schedule names this runtime runs."""

    def check_name(self, schedule: str) -> None:
        """Refuse (ScheduleError) a schedule name this runtime does not run, before anything is built or read: one
        of its names, or torch:CLASS (checked when built)."""
        if schedule.lower() not in self.schedules() and not schedule.startswith(TORCH_PREFIX):
            raise ScheduleError(f"the {self.name} runtime has no schedule {schedule!r}; it runs "
                                f"{', '.join(self.schedules())} or torch:CLASS")

    def placement(self, schedule: str, num_ranks: int, virtual_stages: int | None = None) -> tuple[int, ...]:
        """Where build puts each stage (its stage_to_rank), without building: as the generators place them."""
        return placement(schedule, num_ranks, virtual_stages)

    def splits_backward(self, schedule: str) -> bool:
        """Whether build runs some backwards as I and W: a rank may then end on a W, which nothing waits for."""
        return schedule.lower() in SPLITS_BACKWARD

    def peak_bytes(self, model: Model, schedule: Schedule, data_parallel: int = 1, optimizer: str = "adam",
                   recompute: str = "never") -> int:
        """The most memory any one GPU holds in a step as this runtime runs `schedule`: parsim.workload.memory's
        walk (its last stage's outputs, and its sent tensors, kept where it keeps them), or a graphed runtime's
        (parsim.workload.graph_memory)."""
        if self.graphed:
            from parsim.workload.graph_memory import graphed_peak_bytes

            return graphed_peak_bytes(model, schedule, data_parallel, optimizer, recompute)
        from parsim.workload.memory import peak_bytes

        return peak_bytes(model, schedule, data_parallel, optimizer, recompute, self.keeps_outputs, self.holds_sends)

    def costs(self, profile: Profile) -> Profile:
        """`profile` as this runtime pays it: its host costs in place of hw's runner's."""
        spec = profile.runtimes.get(self.name)
        if spec is None:
            raise ProfileError(f"the profile has no costs for the {self.name!r} runtime; measure them with "
                               f"`python -m hw calibrate --runtimes {self.name}`")
        return run_by(profile, self.name, spec)


def run_by(profile: Profile, name: str, spec: RuntimeCosts) -> Profile:
    """`profile` with a runtime's host costs per action and message, its layers' host and GPU costs: at the shapes
    it was measured at, eager's times its measured ratios; elsewhere scaled (the fixed part of their GPU time by
    gpu_fixed_scale besides); and its gradient add where measured."""
    def op(cost: OpCost, ratios: tuple[tuple[float, float], ...] | None) -> OpCost:
        if ratios:
            return replace(cost, host_s=cost.host_s * spec.layer_host, corrections=times(cost, ratios))
        return replace(cost, host_s=cost.host_s * spec.layer_host,
                       fixed_s=cost.fixed_s * spec.gpu_scale * spec.gpu_fixed_scale,
                       flops_per_s=cost.flops_per_s / spec.gpu_scale)

    def layer(key: str, c: LayerCosts) -> LayerCosts:
        ratios = spec.gpu_ratios.get(key, {})
        backward = ratios.get("backward")
        return LayerCosts(op(c.forward, ratios.get("forward")), op(c.backward_input, backward),
                          op(c.backward_weight, backward))

    layers = {k: layer(k, c) for k, c in profile.layers.items()}
    meta = dict(profile.meta)
    if spec.unmeasured:
        carried = list(meta.get("carried_from_base") or [])
        meta["carried_from_base"] = carried + [f"{name}.{f}" for f in spec.unmeasured]
    host = replace(profile.host, action_s=spec.action_s, p2p_s=spec.p2p_s, step_s=spec.step_s, begin_s=spec.begin_s,
                   after_backward_s=spec.after_backward_s, batch_s=spec.batch_s,
                   split_backward_s=profile.host.split_backward_s * spec.layer_host,
                   grad_add_s=profile.host.grad_add_s * spec.layer_host)
    kernels = profile.kernels
    if spec.accumulate_Bps > 0:  # its gradient adds are modelled (lowering adds them to gradient actions)
        kernels = {**kernels, ACCUMULATE: KernelCost(spec.accumulate_s, spec.accumulate_Bps)}
    return replace(profile, host=host, layers=layers, meta=meta, kernels=kernels)


def times(cost: OpCost, ratios: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
    """cost's corrections times `ratios`, both by FLOPs: the product at every FLOPs either names."""
    points = sorted({w for w, _ in cost.corrections} | {w for w, _ in ratios})
    return tuple((w, (correction_at(cost.corrections, w) if cost.corrections else 1.0) * correction_at(ratios, w))
                 for w in points)
