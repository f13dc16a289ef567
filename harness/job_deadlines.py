"""How long a case's jobs may run, from the case's bytes and flops and the device's own peaks, and which cases
cannot be worked within a tool call at all.

A job's least time is what crosses the host (inputs made, hashed and sent to a worker; outputs read back,
hashed and compared) at the slowest rate measured for it, plus its launches at the case's roofline (its
bytes and flops at the device's theoretical peaks). A check job's deadline allows each of its two launches
ROOFLINE_SLACK times the roofline (a naive but honest kernel is far from it), a timing job's its least time;
both doubled, never below the settings' floors (10 s for a check, 45 s for a timing): small cases keep the
deadlines they had, large ones get what their size needs. Every job still ends by its tool call's deadline
(harness/call_limits.py), so a case whose check or timing could not be done within a call's window even at
the roofline and the host's best rate is refused when the run or check starts (time_shortfalls), with its
estimate and the window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.peaks import theoretical_peaks
from harness.settings import TimingSettings
from harness.task_model import Case, Task

# Arrays through the host, bytes per second: the pipe and shared region between the parent and a GPU worker,
# with hashing and comparison, measured at 0.14-0.35 GB/s on the H200 machine. Deadlines allow the slowest
# rate; a case is refused only if even the fastest could not fit a call.
HOST_BYTES_PER_S = 0.14e9
HOST_BYTES_PER_S_AT_BEST = 0.35e9
ROOFLINE_SLACK = 100
DEADLINE_MARGIN = 2.0


@dataclass(frozen=True)
class CaseWork:
    """What one check job and one timing job of a case cost: bytes through the host, and launches."""

    check_host_bytes: int
    time_host_bytes: int
    roofline_s: float  # one launch at the device's peaks
    time_launches: int

    def check_s(self, host_rate: float = HOST_BYTES_PER_S) -> float:
        """A check at `host_rate` with launches at the roofline: the reference's job and the candidate's."""
        return 2 * (self.check_host_bytes / host_rate + 2 * self.roofline_s)

    def time_s(self, host_rate: float = HOST_BYTES_PER_S) -> float:
        """A timing job at `host_rate` with launches at the roofline."""
        return self.time_host_bytes / host_rate + self.time_launches * self.roofline_s


def case_work(task: Task, case: Case, settings: TimingSettings, device: dict | None,
              outputs_on_device: bool = False, inputs_drawn: bool = False) -> CaseWork:
    """`outputs_on_device`: the case's outputs are judged where they lie (harness/device_checks.py) and do not
    cross to the host; `inputs_drawn`: its inputs are drawn on the device (harness/drawn_inputs.py) and are not
    sent."""
    nbytes = task.nbytes(case.dims)
    inputs = sum(nbytes[p.name] for p in task.input_params)
    outputs = sum(nbytes[p.name] for p in task.output_params)
    sent = 0 if inputs_drawn else inputs
    back = 0 if outputs_on_device else 2 * outputs  # two runs, two poisons
    audited = 0 if outputs_on_device else settings.checked_launches * outputs
    sets = 1 if settings.fresh_inputs else settings.rotation_sets
    return CaseWork(check_host_bytes=sent + back,
                    time_host_bytes=sets * sent + 2 * audited,  # the candidate's and the reference's
                    roofline_s=_roofline_s(task, case, inputs + outputs, device),
                    time_launches=settings.warmups + settings.max_iterations + settings.checked_launches)


def _roofline_s(task: Task, case: Case, array_bytes: int, device: dict | None) -> float:
    peaks = theoretical_peaks(device or {})
    moved = task.bytes_moved(case.dims)
    moved = float(array_bytes) if moved is None else moved
    flops = task.flops(case.dims) or 0.0
    memory, compute = peaks.get("memory_gbps"), peaks.get("tensor_bf16_tflops" if task.cost.compute == "tensor_bf16"
                                                          else "fp32_tflops")
    memory_s = moved / (memory * 1e9) if memory else 0.0
    compute_s = flops / (compute * 1e12) if compute else 0.0
    return max(memory_s, compute_s)


def run_deadline_s(work: CaseWork, settings: TimingSettings) -> float:
    """One check job's (the reference's or the candidate's)."""
    least = work.check_host_bytes / HOST_BYTES_PER_S + 2 * ROOFLINE_SLACK * work.roofline_s
    return max(settings.run_deadline_s, math.ceil(DEADLINE_MARGIN * least))


def time_deadline_s(work: CaseWork, settings: TimingSettings) -> float:
    return max(settings.time_deadline_s, math.ceil(DEADLINE_MARGIN * work.time_s()))


def time_shortfalls(task: Task, settings: TimingSettings, device: dict | None, window_s: float,
                    outputs_on_device=lambda case: False, inputs_drawn=lambda case: False) -> list[str]:
    """One sentence per case whose check or timing would need more than a tool call's `window_s`, even with
    launches at the roofline."""
    problems = []
    for case in task.cases:
        work = case_work(task, case, settings, device, outputs_on_device(case), inputs_drawn(case))
        needs = [("checking it", work.check_s(HOST_BYTES_PER_S_AT_BEST), work.check_host_bytes)]
        if case.role == "performance":
            needs.append(("timing it", work.time_s(HOST_BYTES_PER_S_AT_BEST), work.time_host_bytes))
        for what, seconds, host_bytes in needs:
            if seconds > window_s:
                problems.append(f"case {case.name}: {what} needs at least {seconds:.0f} s ({host_bytes / 1e9:.1f} GB "
                                f"through the host at {HOST_BYTES_PER_S_AT_BEST / 1e9:g} GB/s, and its launches at the "
                                f"roofline), beyond the {window_s:g} s a tool call has")
    return problems
