"""Statistics on kernel latency samples: robust summaries, median confidence
intervals, speedups with honest uncertainty, and a noise-adaptive stopping rule.

Everything here is pure and GPU-free so it can be tested on synthetic streams.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from functools import lru_cache
from statistics import NormalDist
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

# Above this many samples the exact binomial sum is replaced by the normal
# approximation; at this size the two agree to within one rank.
EXACT_BINOMIAL_MAX_N = 1000


class LatencyStats(BaseModel):
    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    n: int
    median_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    p10_ms: float
    p90_ms: float
    stdev_ms: float
    cv: float
    ci_low_ms: float
    ci_high_ms: float
    confidence: float


class Speedup(BaseModel):
    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    ratio: float
    low: float
    high: float
    beyond_noise: bool


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")


def _validated_samples(samples_ms: Sequence[float]) -> np.ndarray:
    samples = np.asarray(samples_ms, dtype=np.float64).ravel()
    if samples.size == 0:
        raise ValueError("no latency samples")
    if not np.all(np.isfinite(samples)):
        raise ValueError("latency samples must be finite (found NaN or Inf)")
    if np.any(samples < 0):
        raise ValueError("latency samples must be non-negative")
    return samples


def _exact_symmetric_lower_rank(n: int, confidence: float) -> int:
    """Largest 1-based rank j with P(X_(j) <= median <= X_(n+1-j)) >= confidence.

    That coverage is 1 - 2 * P(B <= j - 1) for B ~ Binomial(n, 1/2). Integer
    arithmetic keeps the tail sums exact; returns 0 if even j = 1 falls short.
    """
    total = 1 << n
    tail = 0  # sum of C(n, i) for i < j
    term = 1  # C(n, j - 1)
    best = 0
    for j in range(1, (n + 1) // 2 + 1):
        tail += term
        if (total - 2 * tail) / total < confidence:
            break
        best = j
        term = term * (n - j + 1) // j
    return best


def _normal_symmetric_lower_rank(n: int, confidence: float) -> int:
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    # Flooring the lower rank errs toward a wider, conservative interval.
    return max(1, math.floor((n - z * math.sqrt(n)) / 2.0))


@lru_cache(maxsize=4096)
def median_ci_ranks(n: int, confidence: float = 0.95) -> tuple[int, int] | None:
    """1-based order-statistic ranks (j, k) bracketing the median, or None when
    no interval of order statistics reaches the requested confidence."""
    _check_confidence(confidence)
    if n < 1:
        raise ValueError("need at least one sample")
    if n <= EXACT_BINOMIAL_MAX_N:
        j = _exact_symmetric_lower_rank(n, confidence)
    else:
        j = _normal_symmetric_lower_rank(n, confidence)
    if j == 0:
        return None
    return j, n + 1 - j


def median_ci(sorted_samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median from sorted samples.

    Uses symmetric order statistics so the interval holds for any continuous
    distribution: kernel timings are skewed and multi-modal, so no normal fit.
    """
    values = np.asarray(sorted_samples, dtype=np.float64).ravel()
    if values.size == 0:
        raise ValueError("no samples")
    ranks = median_ci_ranks(int(values.size), float(confidence))
    if ranks is None:
        return float(values[0]), float(values[-1])
    j, k = ranks
    return float(values[j - 1]), float(values[k - 1])


def summarize(samples_ms: Sequence[float], confidence: float = 0.95) -> LatencyStats:
    _check_confidence(confidence)
    samples = np.sort(_validated_samples(samples_ms))
    n = int(samples.size)
    mean = float(np.mean(samples))
    stdev = float(np.std(samples, ddof=1)) if n > 1 else 0.0
    p10, median, p90 = (float(v) for v in np.percentile(samples, [10.0, 50.0, 90.0]))
    ci_low, ci_high = median_ci(samples, confidence)
    return LatencyStats(
        n=n,
        median_ms=median,
        mean_ms=mean,
        min_ms=float(samples[0]),
        max_ms=float(samples[-1]),
        p10_ms=p10,
        p90_ms=p90,
        stdev_ms=stdev,
        cv=stdev / mean if mean > 0 else 0.0,
        ci_low_ms=ci_low,
        ci_high_ms=ci_high,
        confidence=confidence,
    )


def geometric_mean(values: Sequence[float]) -> float:
    arr = np.asarray(values, dtype=np.float64).ravel()
    if arr.size == 0:
        raise ValueError("geometric mean of no values")
    if not np.all(arr > 0):
        raise ValueError("geometric mean needs strictly positive values")
    # Summing logs avoids overflow/underflow of a long running product.
    return float(np.exp(np.mean(np.log(arr))))


def _safe_ratio(numerator: float, denominator: float) -> float:
    if denominator > 0:
        return numerator / denominator
    return math.inf if numerator > 0 else 1.0


# A speedup counts only beyond this much, whatever the intervals say. Its two kernels are timed in one job,
# interleaved round by round, yet each round has its own allocations and moment on the GPU: on the H200 the
# same kernel's medians moved by up to 0.3% between them (bench/timing.py) while each one's interval was
# narrower, and the A/A trials (a kernel against itself) read 0.9986 to 1.0019. Separate jobs differ more
# (up to 3.9% on an H100): server/suspicion.py's re-timing has a tolerance of its own.
NOISE_FLOOR = 0.005


def speedup(baseline: LatencyStats, candidate: LatencyStats) -> Speedup:
    """How many times faster the candidate is than the baseline (> 1 is faster).

    The interval pairs opposite CI ends, so it is deliberately conservative. Beyond noise: the
    intervals are disjoint and the conservative end is faster by more than NOISE_FLOOR.
    """
    if candidate.median_ms <= 0:
        raise ValueError("candidate median latency must be positive")
    ratio = baseline.median_ms / candidate.median_ms
    low = _safe_ratio(baseline.ci_low_ms, candidate.ci_high_ms)
    high = _safe_ratio(baseline.ci_high_ms, candidate.ci_low_ms)
    disjoint_and_faster = candidate.ci_high_ms < baseline.ci_low_ms
    return Speedup(ratio=ratio, low=low, high=high,
                   beyond_noise=disjoint_and_faster and ratio > 1.0 and low > 1.0 + NOISE_FLOOR)


# The one wording of a speedup's significance, shared by the tool answers, the report and the demo's table.
FASTER_BEYOND_NOISE = "faster beyond noise"
SLOWER_BEYOND_NOISE = "slower beyond noise"
WITHIN_NOISE = "within noise"
Significance = Literal["faster beyond noise", "slower beyond noise", "within noise"]


def significance(low: float | None, high: float | None, beyond_noise: bool | None = None) -> Significance:
    """What a speedup's 95% interval [low, high] says against 1.0, in words.

    Faster beyond noise: the whole interval lies above 1 + NOISE_FLOOR (as `speedup` decides it; an
    aggregate's `beyond_noise`, when given, must agree: it needs every case beyond noise). Slower beyond
    noise: the mirror image, the whole interval below 1 / (1 + NOISE_FLOOR), so that the baseline would be
    faster beyond noise than the candidate. Anything else, or an interval not known, is within noise.
    """
    if not _is_number(low) or not _is_number(high):
        return WITHIN_NOISE
    if low > 1.0 + NOISE_FLOOR and beyond_noise is not False:
        return FASTER_BEYOND_NOISE
    if high < 1.0 / (1.0 + NOISE_FLOOR):
        return SLOWER_BEYOND_NOISE
    return WITHIN_NOISE


def _is_number(value: float | None) -> bool:
    """A number, infinities included (a ratio over a zero latency); not None, not NaN, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def geomean_speedup(pairs: Sequence[tuple[LatencyStats, LatencyStats]]) -> Speedup:
    """Aggregate per-case speedups; it only counts as beyond noise when every
    case is, so one fast case cannot hide a regression elsewhere."""
    if len(pairs) == 0:
        raise ValueError("no (baseline, candidate) pairs")
    per_case = [speedup(baseline, candidate) for baseline, candidate in pairs]
    return Speedup(
        ratio=geometric_mean([s.ratio for s in per_case]),
        low=geometric_mean([s.low for s in per_case]),
        high=geometric_mean([s.high for s in per_case]),
        beyond_noise=all(s.beyond_noise for s in per_case),
    )


def median_rel_halfwidth(samples_ms: Sequence[float], confidence: float = 0.95) -> float:
    """Half-width of the median's confidence interval divided by the median (inf with no samples)."""
    values = np.sort(np.asarray(samples_ms, dtype=np.float64).ravel())
    if values.size == 0:
        return math.inf
    low, high = median_ci(values, confidence)
    return _safe_ratio((high - low) / 2.0, float(np.median(values))) if high > low else 0.0


class StoppingRule:
    """Keep sampling until the median CI is tight relative to the median.

    Quiet kernels stop at min_samples; noisy ones run to max_samples, which
    bounds the cost of timing while still giving stable numbers when possible.
    """

    def __init__(
        self,
        min_samples: int = 100,
        max_samples: int = 1000,
        target_rel_halfwidth: float = 0.005,
        confidence: float = 0.95,
    ) -> None:
        if min_samples < 1:
            raise ValueError("min_samples must be at least 1")
        if max_samples < min_samples:
            raise ValueError("max_samples must be >= min_samples")
        if not target_rel_halfwidth > 0:
            raise ValueError("target_rel_halfwidth must be positive")
        _check_confidence(confidence)
        self.min_samples = min_samples
        self.max_samples = max_samples
        self.target_rel_halfwidth = target_rel_halfwidth
        self.confidence = confidence
        self._samples: list[float] = []
        # Kept sorted incrementally so each is_finished() check is O(1) lookups.
        self._sorted: list[float] = []

    def add(self, sample_ms: float) -> None:
        value = float(sample_ms)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"latency sample must be finite and non-negative, got {sample_ms!r}")
        self._samples.append(value)
        bisect.insort(self._sorted, value)

    @property
    def samples(self) -> list[float]:
        return list(self._samples)

    def rel_halfwidth(self) -> float:
        """Half-width of the median CI divided by the median (inf if unknown)."""
        return median_rel_halfwidth(self._sorted, self.confidence)

    def is_finished(self) -> bool:
        n = len(self._samples)
        if n >= self.max_samples:
            return True
        if n < self.min_samples:
            return False
        return self.rel_halfwidth() <= self.target_rel_halfwidth
