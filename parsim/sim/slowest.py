"""The slowest of n ranks: a step of n rank processes ends when the last of their host loops does.

Each rank's loop varies from step to step (and round to round) independently of the others' (docs/lab/many-ranks.md);
the step waits for the longest, whose expected excess over a loop's mean is E[max of n standard normals] times the
loop's sd. The model's ranks are deterministic, so a host-bound step is priced at that expected pace instead.
"""

from __future__ import annotations

import math
from functools import cache

from parsim.profile import Profile


@cache
def expected_max(n: int) -> float:
    """E[max of n independent standard normals]: 0 for one, 1/sqrt(pi) for two, ~1.03 for four."""
    if n < 1:
        raise ValueError(f"need at least one rank, got {n}")
    if n == 1:
        return 0.0
    from scipy import integrate, special  # here, not at import: half a second that most runs do not need

    def density(x: float) -> float:  # x times the max's density: n pdf(x) cdf(x)^(n-1)
        return x * n * math.exp(-x * x / 2) / math.sqrt(2 * math.pi) * float(special.ndtr(x)) ** (n - 1)

    return float(integrate.quad(density, -math.inf, math.inf)[0])


def slowest_factor(spread: float, ranks: int) -> float:
    """How much slower than its mean pace the slowest of `ranks` host loops runs, each with sd/mean `spread`."""
    return 1.0 + expected_max(ranks) * spread if spread else 1.0  # 1 + E x 0 is 1: no integral for it


def spread_of(excess: float, ranks: int) -> float:
    """The loops' sd over mean that an excess of the slowest over the mean loop (E[max] / mean - 1) on `ranks`
    ranks implies: calibrate measures the excess, the model carries it to other rank counts by E[max]."""
    return excess / expected_max(ranks) if ranks > 1 else 0.0


def at_slowest_pace(profile: Profile, ranks: int) -> Profile:
    """`profile` with every host cost at the pace of the slowest of `ranks` host loops (itself for one rank)."""
    factor = slowest_factor(profile.host.rank_spread, ranks)
    return profile.with_host_slower(factor) if factor != 1.0 else profile
