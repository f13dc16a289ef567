"""Device memory a case needs, checked against the GPU before a run or a check begins.

A timing job holds every rotation set's inputs and outputs with their guard bands, plus snapshots
of the re-checked outputs, at once; the reference's single-set jobs fit long before that. A case
that cannot fit is refused up front, by name, instead of failing every attempt with an
out-of-memory error in the middle of a run.
"""

from __future__ import annotations

from harness.settings import TimingSettings
from harness.jobs import Layout
from harness.worker_side.buffers import guarded_bytes
from harness.task_model import Case, Task

# Left for the CUDA context, the module, local memory and the allocator's rounding.
CONTEXT_RESERVE_BYTES = 1 << 30


def timing_bytes(layout: Layout, settings: TimingSettings) -> int:
    """Device bytes of one timing job: every set's guarded buffers, snapshots and launch counters."""
    per_set = sum(guarded_bytes(a.nbytes) for a in layout.arrays)
    output_bytes = sum(a.nbytes for a in layout.outputs)
    counters = 8 * (2 * settings.iterations + settings.checked_launches * len(layout.outputs))
    return settings.rotation_sets * per_set + settings.checked_launches * output_bytes + counters


def case_bytes(task: Task, case: Case, settings: TimingSettings) -> int:
    layout = Layout.for_case(task, case.dims)
    if case.role == "performance":
        return timing_bytes(layout, settings)
    return sum(guarded_bytes(a.nbytes) for a in layout.arrays)  # a check: one set, reused per poison


def usable_bytes(device: dict) -> int | None:
    """What a job may count on: the device's memory less the L2 flush buffer and the context's share."""
    if "total_memory_bytes" not in device:
        return None
    return int(device["total_memory_bytes"]) - 2 * int(device.get("l2_bytes", 0)) - CONTEXT_RESERVE_BYTES


def shortfalls(task: Task, settings: TimingSettings, device: dict) -> list[str]:
    """One sentence per case that cannot fit on this device; empty when every case fits."""
    usable = usable_bytes(device)
    if usable is None:
        return []  # a device that does not say its size is not refused on a guess
    problems = []
    for case in task.cases:
        needed = case_bytes(task, case, settings)
        if needed > usable:
            what = (f"{settings.rotation_sets} input sets and {settings.checked_launches} output snapshots for timing"
                    if case.role == "performance" else "its buffers")
            problems.append(f"case {case.name} needs {needed / 2**30:.1f} GiB of device memory ({what}); "
                            f"this GPU offers {usable / 2**30:.1f} GiB to a job")
    return problems
