"""Case verdicts and guard reports made by hand, for the tests of history and outputs."""

from __future__ import annotations

from guard.fingerprint import Fingerprint
from guard.history import compact_diff
from guard.outputs import ApprovalResult, GuardReport
from guard.verdict import CaseVerdict, Inconclusive, Interval, Verdict

H100 = Fingerprint(gpu="NVIDIA H100 80GB HBM3", gpu_uuid="GPU-1", driver="580.1", driver_cuda_version="13.0")
H100_NEW_DRIVER = H100.model_copy(update={"driver": "590.2"})


def case_verdict(case: str, verdict: Verdict, change: float | None = 1.0, *, approval: str = "demo",
                 reason: Inconclusive | None = None, environment_changes: list[str] | None = None,
                 message: str | None = None) -> CaseVerdict:
    interval = None if change is None else Interval(estimate=change, low=change - 0.004, high=change + 0.004,
                                                    confidence=0.99)
    return CaseVerdict(approval=approval, case=case, verdict=verdict, reason=reason, threshold=0.015,
                       change=interval, ratio=interval and interval.model_copy(update={"estimate": 0.5 * change}),
                       latency_ms=0.05, rounds=12, rounds_kept=12, environment_changes=environment_changes or [],
                       message=message or f"{verdict.value}: made by hand")


def report_of(*results: tuple[str, list[CaseVerdict]]) -> GuardReport:
    return GuardReport(time="2026-12-06T02:00:00+00:00", store="store", results=[
        ApprovalResult(approval=name, verdicts=verdicts, diff=compact_diff(name, verdicts, []), fingerprint=H100,
                       environment_changes=sorted({c for v in verdicts for c in v.environment_changes}),
                       seconds=3.0)
        for name, verdicts in results])
