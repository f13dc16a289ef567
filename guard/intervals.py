"""A distribution-free interval on a shift, from a few independent rounds: the Hodges-Lehmann estimate
and Tukey's interval of Walsh averages, with the exact Wilcoxon signed-rank distribution.

Why this and not a bootstrap or the order statistics of the rounds: a guard round is a pair of timing
jobs (the kernel and its baseline, interleaved), and the rounds are few (8 to a few dozen) because each
costs a job. With so few values a bootstrap under-covers, and the sign-test interval (order statistics,
harness/stats.py `median_ci`) needs about 1.5 times as many rounds for the same width. The signed-rank
interval is exact for any continuous distribution symmetric about its centre; a round's log ratio of two
medians of ~100 launches is close to symmetric, and exactly so when nothing changed and the two kernels'
noise is alike, which is where a false alarm would come from. It is robust too: up to 29% of the rounds
may be wild before the estimate follows them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from statistics import NormalDist

from pydantic import BaseModel, ConfigDict

# Beyond this many rounds the exact distribution is replaced by its normal approximation; a guard's
# bound is far below it.
EXACT_MAX_N = 200


class Shift(BaseModel):
    """A location estimate with its interval, in the values' own unit (the guard passes log ratios)."""

    model_config = ConfigDict(frozen=True)

    estimate: float
    low: float
    high: float
    confidence: float  # the interval's exact coverage (at least the one asked for)
    n: int


@lru_cache(maxsize=256)
def _signed_rank_counts(n: int) -> tuple[int, ...]:
    """counts[s] = number of subsets of {1..n} whose sum is s: the null distribution of W+ times 2**n."""
    counts = [1] + [0] * (n * (n + 1) // 2)
    for rank in range(1, n + 1):
        for s in range(rank * (rank + 1) // 2, rank - 1, -1):
            counts[s] += counts[s - rank]
    return tuple(counts)


@lru_cache(maxsize=4096)
def walsh_depth(n: int, confidence: float) -> tuple[int, float] | None:
    """(d, coverage): the interval [W_(d), W_(M+1-d)] of the M = n(n+1)/2 sorted Walsh averages covers
    the centre with probability `coverage` >= confidence; None when even d = 1 falls short."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if n < 1:
        return None
    if n > EXACT_MAX_N:
        z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
        mean, sd = n * (n + 1) / 4.0, math.sqrt(n * (n + 1) * (2 * n + 1) / 24.0)
        d = math.floor(mean - z * sd)  # flooring errs toward a wider interval
        return (d, confidence) if d >= 1 else None
    counts, total = _signed_rank_counts(n), 1 << n
    best, tail = None, 0
    for d in range(1, n * (n + 1) // 4 + 1):
        tail += counts[d - 1]  # P(W+ <= d - 1) * 2**n
        coverage = 1.0 - 2.0 * tail / total
        if coverage < confidence:
            break
        best = (d, coverage)
    return best


def walsh_averages(values: Sequence[float]) -> list[float]:
    xs = list(values)
    return sorted((xs[i] + xs[j]) / 2.0 for i in range(len(xs)) for j in range(i, len(xs)))


def shift_interval(values: Sequence[float], confidence: float) -> Shift | None:
    """The Hodges-Lehmann estimate of the values' centre and its signed-rank interval; None when there
    are too few values for any interval at this confidence (fewer than 8 at 99%)."""
    if any(not math.isfinite(v) for v in values):
        raise ValueError("values must be finite")
    depth = walsh_depth(len(values), confidence)
    if depth is None:
        return None
    d, coverage = depth
    walsh = walsh_averages(values)
    m = len(walsh)
    middle = (walsh[(m - 1) // 2] + walsh[m // 2]) / 2.0
    return Shift(estimate=middle, low=walsh[d - 1], high=walsh[m - d], confidence=coverage, n=len(values))
