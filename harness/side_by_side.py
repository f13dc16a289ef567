"""The interleaved protocol: kernels timed side by side in alternating blocks, samples merged per case.

record_attempt, time_kernel, replay and the benchmarks all time this way, so a speedup the agent reads
from a probe and one recorded for an attempt come from the same code.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from harness.audit_bound import escape_bound
from harness.settings import CompiledKernel
from harness.stats import LatencyStats, summarize
from harness.task_model import Case
from harness.results import CaseTiming, Reason, TimingReport
from harness.timing_shape import shape_waived, shape_waivers


class TimingFailed(Exception):
    """One of the kernels timed side by side failed its own timing."""

    def __init__(self, label: str, reasons: list[Reason]):
        super().__init__(f"the {label} failed its own timing: {reasons}")
        self.label, self.reasons = label, reasons


@dataclass
class SideBySide:
    """What the rounds gathered, per kernel label and case name."""

    samples: dict[str, dict[str, list[float]]]
    event_samples: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    cases: dict[str, dict[str, CaseTiming]] = field(default_factory=dict)  # each case's last CaseTiming
    audited: dict[str, dict[str, int]] = field(default_factory=dict)
    # [timed launches, audited launches] of every fresh-input job, per kernel label and case
    audit_jobs: dict[str, dict[str, list[list[int]]]] = field(default_factory=dict)
    # per kernel label and case: the shape reasons of the yardstick timings taken as measured (shape_waived)
    waived: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    def stats(self) -> dict[str, dict[str, LatencyStats]]:
        """The statistics of the merged samples, per label and case."""
        return {label: {case: summarize(values) for case, values in per_case.items()}
                for label, per_case in self.samples.items()}

    def audit_escape_bound(self, label: str, case: str) -> float:
        """The chance, at most, that a kernel wrong on more than half of the case's timed launches passed every
        audit of these rounds (harness/audit_bound.py); 1 where nothing was audited."""
        return escape_bound(self.audit_jobs.get(label, {}).get(case, []))


def time_side_by_side(time: Callable[[CompiledKernel, list[Case]], TimingReport], kernels: dict[str, CompiledKernel],
                      cases: list[Case], rounds: int, before_first: Callable[[str], None] | None = None,
                      judged: Collection[str] = ("candidate",)) -> SideBySide:
    """Each kernel in turn (in `kernels`' order), `rounds` times, samples merged per case; raises
    TimingFailed for the first kernel whose timing fails. `before_first(label)` is called before each kernel's
    first timing (what it raises ends the rounds). The kernels not `judged` are yardsticks: their launches' shape
    is not held against them (harness/timing_shape.py's shape_waived)."""
    timed = SideBySide(samples={label: {c.name: [] for c in cases} for label in kernels},
                       audited={label: {c.name: 0 for c in cases} for label in kernels})
    clocks: set[str] = set()
    for round_index in range(rounds):
        for label, kernel in kernels.items():
            if round_index == 0 and before_first is not None:
                before_first(label)
            report = time(kernel, cases)
            if label not in judged and (waivers := shape_waivers(report)):
                for case, reasons in waivers.items():
                    timed.waived.setdefault(label, {}).setdefault(case, []).extend(reasons)
                report = shape_waived(report)
            if not report.passed:
                raise TimingFailed(label, report.reasons)
            for case in report.cases:
                timed.samples[label][case.case] += case.samples_ms
                timed.event_samples.setdefault(label, {}).setdefault(case.case, []).extend(case.event_samples_ms or [])
                timed.cases.setdefault(label, {})[case.case] = case
                timed.audited[label][case.case] += case.audited_launches
                timed.audit_jobs.setdefault(label, {}).setdefault(case.case, []).extend(case.audit_jobs)
                clocks.add(case.clock)
    if len(clocks) > 1:  # samples of two clocks are not comparable
        raise RuntimeError(f"the timings side by side read different clocks: {sorted(clocks)}")
    return timed
