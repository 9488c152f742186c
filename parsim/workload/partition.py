"""Splitting a model's layers into contiguous stages: equal counts, a given balance, or balanced by time."""

from __future__ import annotations

from collections.abc import Callable

from parsim.errors import ModelError
from parsim.workload.models import Model, check_balance


def partition(num_layers: int, num_stages: int) -> list[range]:
    """Split layers into contiguous stages of equal count (the first stages take the remainder)."""
    check_stages(num_layers, num_stages)
    size, extra = divmod(num_layers, num_stages)
    return _ranges([size + (1 if s < extra else 0) for s in range(num_stages)])


def check_stages(num_layers: int, num_stages: int) -> None:
    """Refuse a split into no stages, or into more stages than there are layers."""
    if num_stages < 1:
        raise ModelError(f"need at least one stage, got {num_stages}")
    if num_stages > num_layers:
        raise ModelError(f"cannot split {num_layers} layers into {num_stages} stages: "
                         "use more layers or fewer GPUs")


def _ranges(balance: list[int] | tuple[int, ...]) -> list[range]:
    bounds = [0]
    for count in balance:
        bounds.append(bounds[-1] + count)
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def stage_layers(model: Model, num_stages: int) -> list[range]:
    """The layers of each stage: the model's balance if it has one, else equal counts.

    parsim's stage costs and hw's stages both come from here, so the simulated and the run split agree.
    """
    if model.balance is None:
        return partition(len(model.layers), num_stages)
    check_balance(model.balance, len(model.layers), num_stages)
    return _ranges(model.balance)


def partition_by_time(gpu: list[float], num_stages: int, host: list[float] | None = None,
                      host_fixed_s: float = 0.0) -> tuple[int, ...]:
    """Layers per stage (a balance) of contiguous stages whose slowest stage is as fast as it can be.

    A stage takes the sum of its layers' `gpu` times, or, given `host`, the slower of that and its
    host's time (host_fixed_s per stage plus its layers' launch times): within a stage the host
    launches while the GPU runs, so the two overlap, and a host-bound stage is slow however light
    its kernels. Exact, by dynamic programming over (stages, layers), each step's best cut found where two
    monotone sequences cross (_best_cut): O(stages x layers), so plan can split every configuration it
    considers. Where the equal split is already optimal it is kept: it is what `--partition equal` runs.
    """
    n = len(gpu)
    check_stages(n, num_stages)
    gpu_sum, host_sum = prefix_sums(gpu), prefix_sums(host) if host is not None else None

    def stage_time(a: int, b: int) -> float:
        t = gpu_sum[b] - gpu_sum[a]
        return t if host_sum is None else max(t, host_fixed_s + host_sum[b] - host_sum[a])

    inf = float("inf")
    # best[k][i]: the slowest stage of the best split of the first i layers into k stages; cut[k][i]: its last cut
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, num_stages + 1):
        cross = k - 1  # where best[k - 1] meets the last stage's time: it only moves right as that stage grows
        for i in range(k, n - (num_stages - k) + 1):
            best[k][i], cut[k][i], cross = _best_cut(best[k - 1], lambda j: stage_time(j, i), k - 1, i - 1,  # noqa: B023 - called now
                                                     cross)
    equal = partition(n, num_stages)
    if max(stage_time(r.start, r.stop) for r in equal) <= best[num_stages][n] * (1 + 1e-12):
        return tuple(len(r) for r in equal)
    balance, i = [], n
    for k in range(num_stages, 0, -1):
        balance.append(i - cut[k][i])
        i = cut[k][i]
    return tuple(reversed(balance))


def _best_cut(before: list[float], last: Callable[[int], float], lo: int, hi: int,
              cross: int) -> tuple[float, int, int]:
    """min over j in [lo, hi] of max(before[j], last(j)), the first j that gives it (what a scan of every j finds),
    and the first j from `cross` on where before[j] >= last(j) (or hi + 1).

    before[j] (the best split of the first j layers) never falls as j grows and last(j) (the stage from j on)
    never rises, in floats too (prefix sums only grow; rounding keeps order): left of that crossing the larger
    is last(j), falling, and from it on before[j], rising. The crossing never moves left as the last stage
    ends later (last(j) grows), so the caller passes the previous one and the search is linear in all.
    """
    a = cross
    while a <= hi and before[a] < last(a):
        a += 1
    if a > lo:
        left = last(a - 1)  # the least of the falling part, first reached where last(j) == left
        if a > hi or left <= before[a]:
            first, end = lo, a - 1
            if first < end and last(end - 1) <= left:  # layers of no time before it: the first of the tie
                while first < end:
                    mid = (first + end) // 2
                    if last(mid) <= left:
                        end = mid
                    else:
                        first = mid + 1
            return left, end, a
    return before[a], a, a


def prefix_sums(values: list[float]) -> list[float]:
    out = [0.0]
    for v in values:
        out.append(out[-1] + v)
    return out
