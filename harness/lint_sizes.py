"""Lint's checks of a task's sizes: performance cases too small to time, cases too large for the machine.

Lint runs on the CPU, so the device's figures are those recorded on the project's H200 (RECORDED_H200) unless
a caller passes a device's own. A performance case is too small when even a kernel at the device's roofline
would take under TOO_SMALL_FACTOR launch floors: the speedups of such a case measure the launch, not the
kernel. A case is too large when the inputs and expected outputs the referee keeps in host memory (every
input set of every case) exceed this machine's memory, or, for the device, when harness/footprint.py says the
case cannot fit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from harness.footprint import host_shortfalls, shortfalls
from harness.lint_findings import Finding, error, warning
from harness.peaks import DevicePeaks, roofline_ms
from harness.settings import TimingSettings
from harness.task_model import Case, Task


@dataclass(frozen=True)
class DeviceFigures:
    """What the size checks need of a device, and where the figures come from (said in every message)."""

    source: str
    peaks: DevicePeaks
    launch_floor_ms: float      # an empty kernel on the referee's kernel clock
    device: dict                # total_memory_bytes and l2_bytes, as a worker's hello gives them


# The project's H200 (tests/fixtures/runs/h200-matmul-f32-small/lock.json: peaks measured 2026-12-03; the
# empty kernel on the kernel clock, README "Timing" and docs/timing.md: 2.3 us).
RECORDED_H200 = DeviceFigures(
    source="the recorded H200 figures (no device is read by lint)",
    peaks=DevicePeaks(memory_gbps=4274.7, fp32_tflops=51.31, tensor_bf16_tflops=799.2, source="recorded"),
    launch_floor_ms=0.0023,
    device={"total_memory_bytes": 150_109_880_320, "l2_bytes": 62_914_560},
)
TOO_SMALL_FACTOR = 10


def _bytes_of(task: Task, case: Case) -> tuple[float, str]:
    """The bytes a launch must move: the task's cost.bytes, else every array read or written once."""
    declared = task.bytes_moved(case.dims)
    if declared is not None:
        return declared, "cost.bytes"
    return float(sum(task.nbytes(case.dims).values())), "its arrays' bytes (no cost.bytes)"


def too_small(task: Task, figures: DeviceFigures) -> list[Finding]:
    found = []
    floor_us = figures.launch_floor_ms * 1e3
    peak = figures.peaks.compute_tflops(task.cost.compute)
    for case in task.performance_cases:
        moved, bytes_from = _bytes_of(task, case)
        bound_ms = roofline_ms(figures.peaks, moved, task.flops(case.dims), task.cost.compute)
        if bound_ms is None or bound_ms >= TOO_SMALL_FACTOR * figures.launch_floor_ms:
            continue
        compute = f", {peak:g} TFLOP/s {task.cost.compute}" if peak and task.flops(case.dims) else ""
        found.append(warning("too-small", f"case {case.name}: a kernel at the roofline would take {bound_ms * 1e3:.1f} "
                             f"us ({bytes_from} and cost.flops at {figures.peaks.memory_gbps:g} GB/s{compute}, "
                             f"{figures.source}), under {TOO_SMALL_FACTOR}x the launch floor of {floor_us:g} us: "
                             "the floor would be over a tenth of its time; make the case larger"))
    return found


def host_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def too_large(task: Task, settings: TimingSettings, host_memory: int | None,
              figures: DeviceFigures | None) -> list[Finding]:
    """Host memory against `host_memory` (an error, with harness/footprint.py's estimate of a run); device memory against `figures` (a warning: the real
    device is checked again when a run or a check starts). `figures` None: no device check."""
    found = [error("too-large", problem) for problem in host_shortfalls(task, settings, host_memory, serving=True)]
    if figures is not None:
        for problem in shortfalls(task, settings, figures.device):
            found.append(warning("too-large", f"{problem} ({figures.source})"))
    return found
