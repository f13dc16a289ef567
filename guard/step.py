"""One approval's guard step, measured and decided: what `guard` runs for each approval on this host, and what
each Ray task runs on its node (guard/fleet.py).

The approval's correctness first (guard/measure.py): a kernel that fails a check is incorrect on every case
and is not timed. Then, per performance case, the verdict's repeat loop (guard/verdict.py
`decide_with_repeats`) asks for rounds: the first `min_rounds` time every case together, and a case still
inconclusive after them gets rounds of its own, so a noisy case costs only its own extra timing. Last, the
kernel's medians over every round against the device's physical limits (a kernel beyond them is incorrect,
as a run would refuse it). The result names this node and its fingerprint beside the approval's.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from pydantic import BaseModel

from guard.accepted import accepted_fields
from guard.fingerprint import Fingerprint, capture
from guard.measure import GuardStep, MakeExecutor, StepCost, TimingRefused, subject_of
from guard.store import LoadedApproval
from guard.verdict import (DEFAULT_THRESHOLD, CaseInput, CaseVerdict, Correctness, TimingRound, Verdict,
                           VerdictSettings, decide, decide_with_repeats)
from harness.gpu_lease import LeaseWait
from harness.stats import LatencyStats, summarize
from server.decision import CheckResult

Say = Callable[[str], None]
# Fingerprint fields that say which referee measured, not on what: a latency in milliseconds is still compared
# across them (the ratio always is).
_SOFTWARE_OF_THE_REFEREE = frozenset({"referee_version", "referee_source_sha256"})


class StepResult(BaseModel):
    """One approval guarded on one node: every case's verdict, the checks, the environment and the step's cost."""

    approval: str
    node: str  # the host that measured it
    fingerprint: Fingerprint  # this node's
    environment_changes: list[str] = []  # what differs from the approval's fingerprint
    checks: list[CheckResult] = []
    verdicts: list[CaseVerdict] = []
    cost: StepCost = StepCost()
    lease_waits: list[LeaseWait] = []
    # Every round's samples summarised, per kernel ("candidate", "baseline") and case: what --accept signs
    latencies: dict[str, dict[str, LatencyStats]] = {}
    # per kernel and case, the shape reasons of the yardstick timings taken as measured (harness/timing_shape.py)
    shape_waived: dict[str, dict[str, list[str]]] = {}

    @property
    def passed(self) -> bool:
        return bool(self.verdicts) and all(v.verdict in (Verdict.PASS, Verdict.IMPROVED) for v in self.verdicts)


def guard_approval(loaded: LoadedApproval, make_executor: MakeExecutor, settings: VerdictSettings | None = None,
                   say: Say | None = None) -> StepResult:
    """Measure and decide one verified approval on this host's GPU."""
    settings = settings or VerdictSettings()
    say = say or (lambda message: None)
    approval = loaded.approval
    with GuardStep(subject_of(loaded), make_executor, say) as step:
        checks = step.checks()
        now = capture(step.environment)
        changes = approval.fingerprint.differences(now)
        comparable = not [d for d in changes if d.field not in _SOFTWARE_OF_THE_REFEREE]
        inputs = [_case_input(loaded, case, now, [str(d) for d in changes], comparable)
                  for case in step.performance_cases]
        correctness = _correctness(checks)
        try:
            verdicts = _decide_cases(step, inputs, correctness, settings, say)
            limits = step.physical_limit_checks() if correctness.correct else []
        except TimingRefused as refused:
            limits = [CheckResult(name=f"timing of the {refused.label}", kind="replay", passed=False,
                                  reasons=[f"{r.code.value} [{r.case}]: {r.detail}" for r in refused.reasons])]
            verdicts = []
        if limits:
            checks += limits
            verdicts = [decide(case, [], _correctness(checks), settings) for case in inputs]
    return StepResult(approval=loaded.name, node=socket.gethostname(), fingerprint=now,
                          environment_changes=[str(d) for d in changes], checks=checks, verdicts=verdicts,
                          cost=step.cost, lease_waits=step.lease_waits, shape_waived=step.waived,
                          latencies={label: {case: summarize(samples) for case, samples in per_case.items() if samples}
                                     for label, per_case in step.stats.items()})


def _case_input(loaded: LoadedApproval, case: str, now: Fingerprint, changes: list[str], comparable: bool) -> CaseInput:
    """What the approval accepted for this case: the kernel's latency over its baseline's with its interval
    (guard/accepted.py: measured in rounds at approval, else the run's), the accepted latency where this
    environment is the approval's (the referee's own version aside), and the clock it ran at."""
    approval = loaded.approval
    accepted = approval.case(case)
    if accepted is None:
        raise ValueError(f"the approval {loaded.name} records no latency for the performance case {case}")
    fields = accepted_fields(accepted)
    if not fields:
        raise ValueError(f"the approval {loaded.name} records no baseline latency for the case {case}")
    fingerprint = approval.fingerprint
    clock = fingerprint.application_sm_clock_mhz or fingerprint.max_sm_clock_mhz or (
        fingerprint.sm_clock_khz // 1000 if fingerprint.sm_clock_khz else None)
    return CaseInput(approval=loaded.name, case=case, **fields,
                     accepted_latency_ms=accepted.kernel.median_ms if comparable else None,
                     approval_sm_clock_mhz=clock, threshold=approval.regression_threshold or DEFAULT_THRESHOLD,
                     environment_changes=changes)


def _correctness(checks: list[CheckResult]) -> Correctness:
    """Every check must pass; the failing ones' reason codes (harness/results.py) and names say why not."""
    failed = [c for c in checks if not c.passed]
    codes = list(dict.fromkeys(r.split(":", 1)[0].split(" ", 1)[0] for c in failed for r in c.reasons))
    names = ", ".join(c.name for c in failed[:3]) + (f" and {len(failed) - 3} more" if len(failed) > 3 else "")
    return Correctness(correct=not failed, reasons=codes, detail=f"failed: {names}" if failed else "")


def _decide_cases(step: GuardStep, inputs: list[CaseInput], correctness: Correctness, settings: VerdictSettings,
                  say: Say) -> list[CaseVerdict]:
    """Each case through the repeat loop. Its first rounds come from rounds shared by every case; past them, a
    case still inconclusive is timed alone."""
    if not correctness.correct:
        return [decide_with_repeats(case, correctness, _never, settings) for case in inputs]
    shared: dict[str, list[TimingRound]] = {case.case: [] for case in inputs}
    for number in range(min(settings.min_rounds, settings.max_rounds)):
        say(f"{inputs[0].approval if inputs else ''}: round {number + 1} beside the baseline")
        for name, timed in step.round().items():
            shared.setdefault(name, []).append(timed)
    verdicts = []
    for case in inputs:
        queue = shared[case.case]

        def next_round(case: CaseInput = case, queue: list[TimingRound] = queue) -> TimingRound:
            if queue:
                return queue.pop(0)
            say(f"{case.approval} {case.case}: inconclusive so far, one more round")
            return step.round([case.case])[case.case]

        verdicts.append(decide_with_repeats(case, correctness, next_round, settings))
    return verdicts


def _never() -> TimingRound:
    raise AssertionError("an incorrect kernel is not timed")
