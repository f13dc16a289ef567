"""Results too good to be true are refused, or re-verified before they count.

A kernel cannot move its compulsory bytes faster than the memory's peak bandwidth (the L2 is
flushed before every sample, though up to its size of outputs may still sit in it when the kernel
ends) nor do its flops faster than the compute peak of its class. A median
beyond that physical limit (harness/peaks.py: the larger of the measured and the theoretical peak,
beyond by more than PHYSICAL_MARGIN) is refused outright:
re-timing an impossible result proves nothing. Short of that, a result below the measured memory
roofline or a tenfold gain over a real baseline is rare enough to deserve a second look: such an
attempt is checked again on new secret inputs and timed again in a fresh worker; it counts only if
both agree.
"""

from __future__ import annotations

import secrets

from harness.arithmetic import compute_kind
from harness.peaks import PHYSICAL_MARGIN, LimitCheck, limit_checks, physical_peaks, theoretical_peaks, violations
from harness.task_model import Task
from harness.results import Reason, ReasonCode
from harness.stats import LatencyStats
from harness.worker_side.sass_mix import InstructionMix
from server.records import AttemptRecord, StatsRecord
from server.run import Run

SUSPICIOUS_SPEEDUP_RATIO = 10.0
# How far apart a flagged result's two medians may lie: its first timing's and its re-timing's in a fresh worker.
# Separate jobs differ more than the rounds of one job do: softmax_f32's initial kernel (48 us, 134 MB through
# the memory) read medians 3.9% apart over three jobs of an H100, and 3.3% apart in its re-verification. The
# medians are compared, not their intervals, whose slow ends a kernel sets with its own slow launches. A flagged
# result's score (its first median) may so be up to 10% better than its re-timing's; it was flagged for being
# ten times its baseline or under the roofline, which no 10% makes.
RETIMING_TOLERANCE = 0.10


def peak_bandwidth_bytes_per_s(environment: dict) -> float | None:
    """The measured copy bandwidth (harness/peaks.py) where the run has it; else the theoretical DRAM
    bandwidth from the device's memory clock and bus width (double data rate)."""
    measured_gbps = (environment.get("peaks") or {}).get("memory_gbps")
    gbps = measured_gbps or theoretical_peaks(environment)["memory_gbps"]
    return gbps * 1e9 if gbps else None


def physical_limit_checks(task: Task, environment: dict, stats: dict[str, dict],
                          mix: InstructionMix | None = None) -> list[LimitCheck]:
    """Each performance case's median (stats[case]: a LatencyStats dump) against the device's physical limits
    for the case's bytes (less the L2 its writes may stay in) and its flops at the peak of the units the kernel
    uses (`mix`, its SASS: harness/arithmetic.py compute_kind; without one, the task's `cost.compute`); a case
    without stats is not checked."""
    peaks = physical_peaks(environment)
    if not peaks:
        return []
    l2_bytes = environment.get("l2_bytes")
    cache = float(l2_bytes) if isinstance(l2_bytes, (int, float)) and l2_bytes > 0 else None
    checks = []
    for case in task.performance_cases:
        case_stats = stats.get(case.name)
        if not case_stats:
            continue
        checks += limit_checks(peaks, case.name, case_stats["median_ms"], task.bytes_moved(case.dims),
                               task.flops(case.dims), compute_kind(mix, task.cost.compute), cache_bytes=cache)
    return checks


def limit_record(checks: list[LimitCheck]) -> dict:
    """What history.json keeps of the checks: the peaks used and, per case and limit, achieved against peak."""
    return {"margin": PHYSICAL_MARGIN,
            "peaks": {c.kind: c.peak.model_dump(mode="json") for c in checks},
            "cases": [{"case": c.case, "kind": c.kind, "unit": c.unit, "work": c.work, "cache_bytes": c.cache_bytes,
                       "achieved": c.achieved, "peak": c.peak.peak,
                       "bound_ms": c.bound_ms, "median_ms": c.median_ms, "beyond": c.beyond} for c in checks]}


def limit_reasons(checks: list[LimitCheck]) -> list[Reason]:
    return [Reason(code=ReasonCode.BEYOND_PHYSICAL_LIMIT, case=c.case, detail=c.detail()) for c in violations(checks)]


def beyond_physical_limit(run: Run, entry: AttemptRecord) -> list[Reason]:
    """An attempt's timed medians against the device's physical limits: one reason per case beyond them (its
    worst limit); [] when none is, or when the device has no peak to check against. The numbers go into
    entry.physical_limit either way. For attempts only: the baseline is the task's own kernel."""
    stats = {name: s.to_json() for name, s in entry.stats().items()}
    checks = physical_limit_checks(run.task, run.environment, stats, entry.compile.mix if entry.compile else None)
    if checks:
        entry.physical_limit = limit_record(checks)
    return limit_reasons(checks)


def flags(run: Run, entry: AttemptRecord) -> list[str]:
    found = []
    ratio = entry.speedup_vs_baseline.ratio if entry.speedup_vs_baseline else None
    if ratio is not None and ratio > SUSPICIOUS_SPEEDUP_RATIO:
        found.append(f"{ratio:.1f}x faster than the baseline (more than {SUSPICIOUS_SPEEDUP_RATIO:g}x)")
    bandwidth = peak_bandwidth_bytes_per_s(run.environment)
    for case in run.task.performance_cases:
        moved = run.task.bytes_moved(case.dims)
        median_ms = entry.median_ms(case.name)
        if bandwidth and moved and median_ms * 1e-3 < moved / bandwidth:
            found.append(f"{case.name}: {median_ms * 1e3:.2f} us is below the memory roofline "
                         f"({moved / bandwidth * 1e6:.2f} us to move {moved:.0f} bytes at {bandwidth / 1e9:.0f} GB/s)")
    return found


def reverify(run: Run, entry: AttemptRecord, kernel, clock) -> tuple[dict, list[Reason]]:
    """New secret inputs, then timing in a fresh worker, compared case by case with the attempt's own timing:
    (what was found, reasons to reject)."""
    visible = list(run.task.visible_cases)
    seeds = {case.name: secrets.randbits(31) for case in visible}
    check = clock.run(run.executor.check, kernel, visible, seeds)
    if not check.passed:
        return {"seeds": seeds, "passed": False}, [
            r.model_copy(update={"detail": f"re-verification: {r.detail}"}) for r in check.reasons]
    run.executor.fresh_worker()  # nothing carried over from the first timing
    timing = clock.run(run.executor.time, kernel, list(run.task.performance_cases))
    medians = {c.case: c.stats.median_ms for c in timing.cases if c.stats}
    reasons = [r.model_copy(update={"detail": f"re-verification: {r.detail}"}) for r in timing.reasons]
    if timing.passed:
        reasons += retiming_disagreements(entry.stats(), {c.case: c.stats for c in timing.cases if c.stats})
    return {"seeds": seeds, "passed": timing.passed and not reasons, "medians_ms": medians}, reasons


def retiming_disagreements(first: dict[str, StatsRecord], second: dict[str, LatencyStats]) -> list[Reason]:
    """A flagged result counts only if its second timing agrees with the first in every case it timed: the two
    medians within RETIMING_TOLERANCE of each other. One reason per case that does not, naming both."""
    reasons = []
    for case, stats in first.items():
        again = second.get(case)
        if again is None:
            reasons.append(Reason(code=ReasonCode.RETIMING_DISAGREES, case=case, detail=(
                f"re-verification: {case} was not timed again (first median {stats.median_ms * 1e3:.2f} us)")))
        elif max(again.median_ms, stats.median_ms) > min(again.median_ms, stats.median_ms) * (1 + RETIMING_TOLERANCE):
            reasons.append(Reason(code=ReasonCode.RETIMING_DISAGREES, case=case, detail=(
                f"re-verification: {case} timed again in a fresh worker at a median of {again.median_ms * 1e3:.2f} us, "
                f"against {stats.median_ms * 1e3:.2f} us the first time: more than {RETIMING_TOLERANCE:.0%} apart "
                f"(two honest jobs' medians moved up to 3.9%)")))
    return reasons
