"""hw's own runner: parsim's action lists executed one by one with eager PyTorch (hw.run.stage_runner)."""

from __future__ import annotations

from parsim.profile import Profile
from parsim.runtimes.base import Runtime
from parsim.schedules import SCHEDULES, Schedule, build


class EagerRuntime(Runtime):
    """Each message alone on its directed channel's own process group (so its own NCCL stream), posted on the
    compute stream just before the compute that needs it (or on copy streams); a compute waits only for the
    message it consumes; the host pays `host.action_s` per compute action, each layer's `host_s`, and
    `host.p2p_s` per message."""

    name = "hw"
    summary = "hw's eager runner: parsim's action lists, one process group per directed channel"
    copy_streams = True
    holds_sends = True  # StageRunner waits its sends once the step is done; each handle holds its tensor till then

    def build(self, schedule: str, num_ranks: int, num_microbatches: int,
              virtual_stages: int | None = None) -> Schedule:
        return build(schedule, num_ranks, num_microbatches, virtual_stages)

    def schedules(self) -> tuple[str, ...]:
        return tuple(sorted(SCHEDULES))

    def costs(self, profile: Profile) -> Profile:
        return profile  # the profile's own host costs are this runner's


EAGER = EagerRuntime()
