"""The shape of a job's timed launches: how widely they spread and whether they fall into distinct modes.

An honest kernel's launches take about the same time: noise of a fraction of a percent to a few percent,
and rare outliers. A kernel that decides per launch (from its inputs, a clock, a counter) whether to run
fast or slow has launches in two groups with little between them; the median is the fast group's when
it holds a little over half of the launches, and the slow launches set everything else (the mean, the
upper end of the median's interval). `uneven_launches` (harness/judging.py) bounds the mean against the
median; the shape looks at the samples themselves, where the mean hides how they are spread.

Pure: samples in, statistics and reasons out. The timing protocol (harness/timing_protocol.py) measures
a case again in one more job when its shape is refused, and refuses the case only if that job's shape is
refused too. The thresholds come from honest kernels timed on an H100 (bench/spreads.py; docs/timing.md,
"Timing shapes"). The shape judges the kernel being judged only: `shape_waived` takes a yardstick's timing
(the task's own kernel, a best judged before, the vendor library, an approval's baseline under the guard) as
measured where its shape alone was refused, and `shape_waivers` names what it took past, for the record.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from harness.results import Reason, ReasonCode, TimingReport
from harness.stats import geometric_mean

# Both sides of a gap must hold at least this share of the launches for the gap to part two modes. Neither the
# median nor, from 20 launches, either end of its 95% interval falls in a smaller group at either end, slow or fast
# (the interval's ranks lie within the 25th and 75th percentiles at 20 launches, the 35th and 68th at 40, the 40th
# and 61st at 100): they stay among the other launches. Honest kernels show such groups: a few slow outliers (a
# clock step, an interrupt of the GPU's front end), and a reference with one thread per row timed on 16 SMs read
# 10% to 15% of its launches 14% slower on an H100 (docs/timing.md). A slow group of more than 10% still sets
# the 90th percentile, so the spread rule refuses it where its gap passes what honest kernels show.
MODE_SHARE = 0.25
# Two modes: the gap between them is at least this fraction of the median, and at least MODE_SEPARATION
# times the wider of the two sides' own spreads (p25 to p75 of each side).
MODE_GAP = 0.10
MODE_SEPARATION = 3.0
# A job's spread, (p90 - p10) / median, beyond SPREAD_MAX + SPREAD_JITTER_MS / median: short kernels jitter
# by a fixed amount of time as well as by a fraction of it. The widest honest spread measured is 17% (the
# reference on 16 SMs above, an H100, three jobs on one board): SPREAD_MAX was chosen from it, twice it and a
# little more; launches padded over a range spread far wider (45% of them padded by up to 2x: about 75%).
SPREAD_MAX = 0.35
SPREAD_JITTER_MS = 0.002
# The middle half's spread, (p75 - p25) / median, beyond MIDDLE_SPREAD_MAX (plus the same jitter). The median's
# interval lies within the middle half, so a kernel that widens it (slow launches bridged over a gap in steps
# under MODE_GAP, or smeared over a range) widens the middle half; honest kernels keep it within 8.8% (softmax_f32's
# reference as a candidate on rows-16384x1024, an H100, bench/recorded/h100-2026-12-07-b), where a slow side of 45%
# at 1.33x, bridged by three launches, reads about 32%. 20% keeps twice the honest width and more in hand.
MIDDLE_SPREAD_MAX = 0.20

SHAPE_CODES = frozenset({ReasonCode.TIMING_MODES, ReasonCode.TIMING_SPREAD})
WAIVED = "its launches' shape is not judged (a yardstick, not the kernel being judged): "


class TimingShape(BaseModel):
    model_config = ConfigDict(frozen=True)

    n: int
    median_ms: float
    p10_ms: float
    p90_ms: float
    spread: float            # (p90 - p10) / median
    middle_spread: float = 0.0  # (p75 - p25) / median
    mode_gap: float          # the widest gap between consecutive sorted samples with MODE_SHARE on each side, / median
    mode_below: float        # the share of launches below that gap
    mode_separation: float   # that gap / the wider of the two sides' interquartile ranges (inf: both sides flat)

    @property
    def jitter(self) -> float:
        """SPREAD_JITTER_MS as a share of the median, added to both spreads' bounds."""
        return SPREAD_JITTER_MS / self.median_ms if self.median_ms > 0 else 0.0

    @property
    def spread_allowed(self) -> float:
        return SPREAD_MAX + self.jitter

    @property
    def middle_spread_allowed(self) -> float:
        return MIDDLE_SPREAD_MAX + self.jitter

    @property
    def has_modes(self) -> bool:
        return self.mode_gap >= MODE_GAP and self.mode_separation >= MODE_SEPARATION


def shape_of(samples_ms: Sequence[float]) -> TimingShape:
    """The shape of one job's (or one case's) timed launches."""
    samples = np.sort(np.asarray(samples_ms, dtype=np.float64).ravel())
    if samples.size == 0:
        raise ValueError("no latency samples")
    n = int(samples.size)
    p10, p25, median, p75, p90 = (float(v) for v in np.percentile(samples, [10.0, 25.0, 50.0, 75.0, 90.0]))
    scale = median if median > 0 else 1.0
    gap, below, separation = _widest_split(samples)
    return TimingShape(n=n, median_ms=median, p10_ms=p10, p90_ms=p90, spread=(p90 - p10) / scale,
                       middle_spread=(p75 - p25) / scale, mode_gap=gap / scale, mode_below=below,
                       mode_separation=separation)


def _widest_split(samples: np.ndarray) -> tuple[float, float, float]:
    """(gap, share below it, separation) of the widest gap between sorted samples i-1 and i with at least
    MODE_SHARE of the launches on each side; (0, 0, 0) when there are too few launches for two sides."""
    n = samples.size
    least = max(2, int(np.ceil(MODE_SHARE * n)))
    if n < 2 * least:
        return 0.0, 0.0, 0.0
    gaps = np.diff(samples)[least - 1:n - least]  # gaps[j] lies between samples least-1+j and least+j
    j = int(np.argmax(gaps))
    split = least + j                             # samples[:split] below the gap, samples[split:] above it
    gap = float(gaps[j])
    within = max(_iqr(samples[:split]), _iqr(samples[split:]))
    separation = gap / within if within > 0 else (float("inf") if gap > 0 else 0.0)
    return gap, split / n, separation


def _iqr(values: np.ndarray) -> float:
    low, high = np.percentile(values, [25.0, 75.0])
    return float(high - low)


def shape_reasons(shape: TimingShape, case: str) -> list[Reason]:
    """Why a job's launches are refused for their shape: distinct modes, or else a spread no honest kernel shows
    (two modes spread wide as well: the modes are the reason)."""
    if shape.has_modes:
        return [Reason(code=ReasonCode.TIMING_MODES, case=case, detail=(
            f"the {shape.n} timed launches fall into two groups: {shape.mode_below:.0%} of them below a gap of "
            f"{shape.mode_gap:.0%} of the median ({shape.median_ms * 1e3:.2f} us), {shape.mode_separation:.3g} "
            f"times the groups' own spread (at most {MODE_GAP:.0%} and {MODE_SEPARATION:g} times allowed): a "
            "kernel that runs fast on some launches and slow on others is scored by its fast ones"))]
    if shape.spread > shape.spread_allowed:
        return [Reason(code=ReasonCode.TIMING_SPREAD, case=case, detail=(
            f"the timed launches spread over {shape.spread:.0%} of the median ({shape.median_ms * 1e3:.2f} us) "
            f"from the 10th to the 90th percentile, beyond the {shape.spread_allowed:.0%} honest kernels stay "
            "within"))]
    if shape.middle_spread > shape.middle_spread_allowed:
        return [Reason(code=ReasonCode.TIMING_SPREAD, case=case, detail=(
            f"the middle half of the timed launches spreads over {shape.middle_spread:.0%} of the median "
            f"({shape.median_ms * 1e3:.2f} us) from the 25th to the 75th percentile, beyond the "
            f"{shape.middle_spread_allowed:.0%} honest kernels stay within"))]
    return []


def shape_waived(report: TimingReport) -> TimingReport:
    """A timing refused for its launches' shape alone, passed as measured, each shape reason kept as a warning; any
    other timing as it is. For a yardstick, not a verdict: the task's own kernel (softmax_f32's reference reads
    a quarter of its launches 16% slower on an H100 at times, bench/recorded/h100-2026-12-07-c), a best judged
    when it was recorded, the vendor library. A refused case's samples are its last job's, judged on its own like
    every job."""
    waivers = shape_waivers(report)
    if not waivers:
        return report
    cases = [c if c.passed else c.model_copy(update={
        "passed": True, "reasons": [], "warnings": c.warnings + [WAIVED + r.detail for r in c.reasons]})
        for c in report.cases]
    return report.model_copy(update={"passed": True, "cases": cases,
                                     "score_ms": geometric_mean([c.stats.median_ms for c in cases])})


def shape_waivers(report: TimingReport) -> dict[str, list[str]]:
    """Per case, the shape reasons (`code: detail`) that shape_waived takes a yardstick's timing past; empty where
    it takes none: a timing that passed, or one refused for any other reason as well."""
    if report.passed:
        return {}
    refused = [c for c in report.cases if not c.passed]
    if not refused or any(c.stats is None or not c.reasons or any(r.code not in SHAPE_CODES for r in c.reasons)
                          for c in refused):
        return {}
    return {c.case: [f"{r.code.value}: {r.detail}" for r in c.reasons] for c in refused}
