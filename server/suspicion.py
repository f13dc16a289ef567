"""Results too good to be true are re-verified before they count.

A kernel cannot move its compulsory bytes faster than the memory's peak bandwidth (the L2 is
flushed before every sample), and a tenfold gain over a real baseline is rare enough to deserve a
second look. Such an attempt is checked again on new secret inputs and timed again in a fresh
worker; it counts only if both agree.
"""

from __future__ import annotations

import secrets

from harness.verdict import Reason
from server.run import Run

SPEEDUP_FLAG = 10.0


def peak_bandwidth_bytes_per_s(environment: dict) -> float | None:
    """The measured copy bandwidth (harness/peaks.py) where the run has it; else the theoretical DRAM
    bandwidth from the device's memory clock and bus width (double data rate)."""
    measured_gbps = (environment.get("peaks") or {}).get("memory_gbps")
    if measured_gbps:
        return measured_gbps * 1e9
    clock_khz, bus_bits = environment.get("memory_clock_khz"), environment.get("memory_bus_bits")
    if not clock_khz or not bus_bits:
        return None
    return clock_khz * 1e3 * 2 * bus_bits / 8


def flags(run: Run, entry: dict) -> list[str]:
    found = []
    ratio = (entry.get("speedup_vs_baseline") or {}).get("ratio")
    if ratio is not None and ratio > SPEEDUP_FLAG:
        found.append(f"{ratio:.1f}x faster than the baseline (more than {SPEEDUP_FLAG:g}x)")
    bandwidth = peak_bandwidth_bytes_per_s(run.environment)
    for case in run.task.performance_cases:
        moved = run.task.bytes_moved(case.dims)
        median_ms = entry["timing"][case.name]["stats"]["median_ms"]
        if bandwidth and moved and median_ms * 1e-3 < moved / bandwidth:
            found.append(f"{case.name}: {median_ms * 1e3:.2f} us is below the memory roofline "
                         f"({moved / bandwidth * 1e6:.2f} us to move {moved:.0f} bytes at {bandwidth / 1e9:.0f} GB/s)")
    return found


def reverify(run: Run, kernel, clock) -> tuple[dict, list[Reason]]:
    """New secret inputs, then timing in a fresh worker: (what was found, reasons to reject)."""
    visible = list(run.task.visible_cases)
    seeds = {case.name: secrets.randbits(31) for case in visible}
    check = clock.run(run.executor.check, kernel, visible, seeds)
    if not check.passed:
        return {"seeds": seeds, "passed": False}, [
            r.model_copy(update={"detail": f"re-verification: {r.detail}"}) for r in check.reasons]
    run.executor.fresh_worker()  # nothing carried over from the first timing
    timing = clock.run(run.executor.time, kernel, list(run.task.performance_cases))
    medians = {c.case: c.stats.median_ms for c in timing.cases if c.stats}
    found = {"seeds": seeds, "passed": timing.passed, "medians_ms": medians}
    return found, [r.model_copy(update={"detail": f"re-verification: {r.detail}"}) for r in timing.reasons]
