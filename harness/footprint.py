"""What a task needs of the machine, computed from the task alone and checked before a run or a check begins:
device memory per case, host memory across the parent and the GPU workers, and the run folder's disk.

A timing job holds every rotation set's inputs and outputs with their guard bands, plus snapshots
of the re-checked outputs, at once; the reference's single-set jobs fit long before that. A case
that cannot fit is refused up front, by name, with its need and the limit, instead of failing every
attempt with an out-of-memory error in the middle of a run (or the machine swapping, or the disk
filling). Nothing here allocates what it counts.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path

from harness.call_limits import CALL_DEADLINE_S
from harness.drawn_inputs import case_draws
from harness.job_deadlines import time_shortfalls
from harness.settings import TimingSettings
from harness.jobs import Layout
from harness.worker_side.buffers import KEPT_SHARE, guarded_bytes
from harness.worker_side.resident import RESIDENT_MAX_BYTES
from harness.task_model import Case, Task
from sandbox.pool import REGION_BYTES

# Left for the CUDA context, the module, local memory and the allocator's rounding.
CONTEXT_RESERVE_BYTES = 1 << 30
# A run folder's files besides the expected outputs and the task copy: the log, attempts, CUBINs, compile logs,
# the report.
RUN_FILES_ALLOWANCE_BYTES = 64 << 20
NPY_HEADER_BYTES = 128
TREE_FILE_BYTES = 65  # a sha256-tree's hex digest and its newline
MEMINFO = Path("/proc/meminfo")
GPU_WORKERS = 2  # the reference's and the candidates' (harness/gpu_workers.py)


class DoesNotFit(Exception):
    """A case needs more than this machine has; the message names each such case, its need and the limit."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


# -- device memory ------------------------------------------------------------------------------

def timing_bytes(layout: Layout, settings: TimingSettings) -> int:
    """Device bytes of one timing job: every set's guarded buffers, snapshots and launch counters (two per timed
    launch, in the evidence context, and one launch's in a scratch: harness/worker_side/timed_loop.py)."""
    per_set = sum(guarded_bytes(a.nbytes) for a in layout.arrays)
    output_bytes = sum(a.nbytes for a in layout.outputs)
    counters = 16 * (settings.iterations + 1)
    return settings.rotation_sets * per_set + settings.audits_per_job(output_bytes) * output_bytes + counters


def case_bytes(task: Task, case: Case, settings: TimingSettings) -> int:
    layout = Layout.for_case(task, case.dims)
    # A check: one set, reused per poison; judged on the device, plus the first run's copy of the outputs.
    check = sum(guarded_bytes(a.nbytes) for a in layout.arrays)
    if outputs_on_device(task, case, settings):
        check += sum(a.nbytes for a in layout.outputs)
    if case.role == "performance":
        return max(timing_bytes(layout, settings), check)
    return check


def usable_bytes(device: dict) -> int | None:
    """What a job may count on: the device's memory less the L2 flush buffer and the context's share."""
    if "total_memory_bytes" not in device:
        return None
    return int(device["total_memory_bytes"]) - 2 * int(device.get("l2_bytes", 0)) - CONTEXT_RESERVE_BYTES


def shortfalls(task: Task, settings: TimingSettings, device: dict) -> list[str]:
    """One sentence per case that cannot fit on this device, or cannot be checked or timed within a tool call
    (harness/job_deadlines.py); empty when every case fits."""
    return memory_shortfalls(task, settings, device) + time_shortfalls(
        task, settings, device, CALL_DEADLINE_S, lambda case: outputs_on_device(task, case, settings),
        lambda case: case_draws(task, case, settings.draw_inputs_from_bytes) is not None)


def outputs_on_device(task: Task, case: Case, settings: TimingSettings) -> bool:
    """Whether a case's outputs are judged on the device (harness/device_checks.py) and stay there."""
    threshold = settings.device_judging_from_bytes
    return threshold is not None and CaseArrays.of(task, case).outputs >= threshold


def reference_bytes(task: Task, case: Case, settings: TimingSettings, total_memory: int) -> int:
    """What the reference's worker holds while a case judged on the device is timed beside it: the outputs it
    keeps (each input set's expected outputs and the audited launches', at most its cap, harness/worker_side/
    device_judging.py) and its job on the audited launches' inputs (one set of guarded arrays)."""
    layout = Layout.for_case(task, case.dims)
    outputs = sum(a.nbytes for a in layout.outputs)
    kept = min((settings.rotation_sets + settings.audits_per_job(outputs)) * outputs, max(int(KEPT_SHARE * total_memory),
                                                                                   outputs))
    return kept + sum(guarded_bytes(a.nbytes) for a in layout.arrays)


def memory_shortfalls(task: Task, settings: TimingSettings, device: dict) -> list[str]:
    usable = usable_bytes(device)
    if usable is None:
        return []  # a device that does not say its size is not refused on a guess
    problems = []
    both = usable - 2 * int(device.get("l2_bytes", 0)) - CONTEXT_RESERVE_BYTES  # a second context and flush buffer
    for case in task.cases:
        if case.role != "performance" or not outputs_on_device(task, case, settings):
            continue
        candidate = case_bytes(task, case, settings)
        reference = reference_bytes(task, case, settings, int(device["total_memory_bytes"]))
        if candidate <= usable and candidate + reference > both:
            problems.append(f"case {case.name} needs {(candidate + reference) / 2**30:.1f} GiB of device memory across "
                            f"both GPU workers (the candidate's timing {candidate / 2**30:.1f} GiB, the reference's kept "
                            f"outputs and audit job {reference / 2**30:.1f} GiB); this GPU offers {both / 2**30:.1f} "
                            "GiB to the two")
    for case in task.cases:
        needed = case_bytes(task, case, settings)
        if needed > usable:
            audits = settings.audits_per_job(CaseArrays.of(task, case).outputs)
            what = (f"{settings.rotation_sets} input sets and {audits} output snapshots for timing"
                    if case.role == "performance" else "its buffers")
            problems.append(f"case {case.name} needs {needed / 2**30:.1f} GiB of device memory ({what}); "
                            f"this GPU offers {usable / 2**30:.1f} GiB to a job")
    return problems


# -- host memory --------------------------------------------------------------------------------

@dataclass(frozen=True)
class CaseArrays:
    """A case's array bytes: inputs, outputs, and the elements of both (the oracle works in float64)."""

    inputs: int
    outputs: int
    elements: int

    @classmethod
    def of(cls, task: Task, case: Case) -> "CaseArrays":
        shapes = task.shapes(case.dims)
        nbytes = task.nbytes(case.dims)
        return cls(inputs=sum(nbytes[p.name] for p in task.input_params),
                   outputs=sum(nbytes[p.name] for p in task.output_params),
                   elements=sum(math.prod(shapes[p.name]) for p in task.array_params))


def oracle_bytes(arrays: CaseArrays) -> int:
    """The oracle on one case: the inputs as made, its own copy of them, every array in float64, the result
    rounded to the output dtype. Its own temporaries are the task's business and are not counted."""
    return 2 * arrays.inputs + 8 * arrays.elements + arrays.outputs


def host_need(task: Task, case: Case, settings: TimingSettings, serving: bool) -> tuple[int, int]:
    """(what the run keeps of this case from start to end, the peak of its work on top of that) in host bytes.

    Kept: the inputs and expected outputs of each fixed input set (every rotation set in a served run, the case's
    own in a check), and in a served run its secret inputs made ahead of an attempt. Peak while it is worked on,
    the largest of: a check on secret inputs in the parent (the inputs, the reference's and the candidate's
    outputs under two poisons), a timing's audited outputs (the candidate's and the reference's for the same
    launches), the oracle; plus each GPU worker's host copies of the inputs and of the outputs it reads back, and
    the shared regions (one per direction and worker) holding the largest message, at most REGION_BYTES each.
    """
    a = CaseArrays.of(task, case)
    # A large case's inputs are drawn on the device and its outputs judged there: neither is held on the host.
    inputs = 0 if case_draws(task, case, settings.draw_inputs_from_bytes) is not None else a.inputs
    outputs = 0 if outputs_on_device(task, case, settings) else a.outputs
    sets = settings.rotation_sets if serving else 1
    # Fresh-input timings' audited outputs are judged on the device (device_audits): none is read back.
    audited = 0 if settings.device_audits and settings.fresh_inputs else settings.audits_per_job(a.outputs)
    kept = sets * (inputs + outputs) + (inputs if serving and case.role != "holdout" else 0)
    read_back = audited * outputs + (0 if settings.fresh_inputs else settings.rotation_sets * outputs)
    parent = max(inputs + 4 * outputs,
                 (audited * outputs if settings.fresh_inputs else 0) + read_back,
                 oracle_bytes(a) if task.oracle_file and inputs else 0)
    workers = GPU_WORKERS * (inputs + max(2 * outputs, read_back))
    regions = GPU_WORKERS * (min(REGION_BYTES, inputs) + min(REGION_BYTES, max(2 * outputs, read_back)))
    return kept, parent + workers + regions


def resident_bytes(task: Task, settings: TimingSettings, serving: bool) -> int:
    """Host copies of the inputs each GPU worker keeps on its device between jobs (harness/worker_side/
    resident.py): every input set sent to it, at most its cap."""
    sets = settings.rotation_sets + 1 if serving else 1  # and the secret inputs of the check under way
    sent = sum(CaseArrays.of(task, case).inputs for case in task.cases
               if case_draws(task, case, settings.draw_inputs_from_bytes) is None)
    return GPU_WORKERS * min(RESIDENT_MAX_BYTES, sets * sent)


def host_shortfalls(task: Task, settings: TimingSettings, available: int | None, serving: bool) -> list[str]:
    """One sentence per case that makes the run exceed `available` host bytes (None: not refused on a guess)."""
    if available is None:
        return []
    needs = {case.name: host_need(task, case, settings, serving) for case in task.cases}
    total = (sum(kept for kept, _ in needs.values()) + max(peak for _, peak in needs.values())
             + resident_bytes(task, settings, serving))
    if total <= available:
        return []
    own = {name: kept + peak for name, (kept, peak) in needs.items()}
    named = [name for name, need in own.items() if need > available] or [max(own, key=own.get)]
    what = ("its inputs and expected outputs of every input set, and its arrays in the parent, the two GPU workers "
            "and their shared regions" if serving else "its inputs and outputs in the parent, the two GPU workers "
            "and their shared regions")
    return [f"case {name} needs {_size(own[name])} of host memory ({what}; the whole run {_size(total)}); "
            f"this machine has {_size(available)} available" for name in named]


def oracle_shortfalls(task: Task, cases: list[Case], available: int | None) -> list[str]:
    """One sentence per case whose oracle run on this machine would exceed `available` host bytes."""
    if available is None or task.oracle_file is None:
        return []
    problems = []
    for case in cases:
        need = oracle_bytes(CaseArrays.of(task, case))
        if need > available:
            problems.append(f"case {case.name} needs {_size(need)} of host memory for the oracle (its inputs, a copy, "
                            f"every array in float64); this machine has {_size(available)} available")
    return problems


def available_memory_bytes(meminfo: Path = MEMINFO) -> int | None:
    """MemAvailable from /proc/meminfo: what can be allocated without swapping; None where it cannot be read."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


# -- disk ---------------------------------------------------------------------------------------

def run_disk_bytes(task: Task, settings: TimingSettings, keep_all: bool = False) -> dict[str, int]:
    """Bytes each case's expected outputs take in a run folder (every rotation set, as .npy files, or as their
    sha256-trees for a case judged on the device, unless `keep_all`: serve --keep-expected)."""
    outputs = len(task.output_params)
    return {case.name: settings.rotation_sets * outputs * TREE_FILE_BYTES
            if not keep_all and outputs_on_device(task, case, settings)
            else settings.rotation_sets * (CaseArrays.of(task, case).outputs + outputs * NPY_HEADER_BYTES)
            for case in task.cases}


def disk_shortfalls(task: Task, settings: TimingSettings, results: Path, free: int | None,
                    keep_all: bool = False) -> list[str]:
    """A sentence naming the largest case when a new run's folder would not fit the `free` bytes under `results`."""
    if free is None:
        return []
    expected = run_disk_bytes(task, settings, keep_all)
    task_copy = sum(path.stat().st_size for path in task.files() if path.is_file())
    total = sum(expected.values()) + task_copy + RUN_FILES_ALLOWANCE_BYTES
    if total <= free:
        return []
    largest = max(expected, key=expected.get)
    return [f"case {largest} needs {_size(expected[largest])} of disk for its expected outputs "
            f"({settings.rotation_sets} input sets; the whole run folder {_size(total)}); {results} has "
            f"{_size(free)} free"]


def machine_shortfalls(task: Task, settings: TimingSettings, results: Path, keep_all: bool = False) -> list[str]:
    """What a new run under `results` would need beyond this machine's available memory and free disk."""
    return (host_shortfalls(task, settings, available_memory_bytes(), serving=True)
            + disk_shortfalls(task, settings, results, free_disk_bytes(results), keep_all))


def free_disk_bytes(folder: Path) -> int | None:
    """Free bytes on the file system that holds `folder` (or its nearest existing parent)."""
    folder = Path(folder).absolute()
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


def _size(nbytes: int) -> str:
    if nbytes < 2**30:
        return f"{nbytes / 2**20:.1f} MiB"
    return f"{nbytes / 2**30:.{1 if nbytes >= 10 * 2**30 else 2}f} GiB"
