"""What bounds one tool call's work on the GPU: the call's deadline, which every job it sends inherits
(what is left of it), and per case how long one launch of a candidate may run before the worker
stops waiting and the kernel is rejected as too slow (docs/timing.md, "Every call answers in time")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from harness.jobs import Layout
from harness.task_model import Task
from sandbox.deadline import Deadline

# No tool call outlives this much wall time, whatever the kernel: the TypeScript SDK, and so the MCP
# Inspector and many clients, give up on a request after 60 s. Every job a call sends to a worker
# inherits what is left of it (sandbox/deadline.py); a case whose work cannot fit it is refused up front
# (harness/job_deadlines.py).
CALL_DEADLINE_S = 55.0

# A candidate's launch is too slow past this many times the baseline's launch on the same case, and
# at least MIN_LAUNCH_LIMIT_S: far beyond any honest kernel worth timing, well inside a call's deadline.
TOO_SLOW_FACTOR = 20.0
MIN_LAUNCH_LIMIT_S = 1.0


class OutOfTime(Exception):
    """The call's deadline passed while a job ran (its worker was killed) or before the next one could start."""


@dataclass(frozen=True)
class CallLimits:
    """One call's deadline, and by case name the launch limit of the candidate's jobs (none: no limit) and
    the baseline's launch time it comes from."""

    deadline: Deadline
    launch_s: Mapping[str, float] = field(default_factory=dict)
    baseline_ms: Mapping[str, float] = field(default_factory=dict)

    def too_slow_note(self, case: str | None) -> str:
        """Why the limit of `case` is what it is, for a too_slow reason."""
        basis = "" if case not in self.baseline_ms else (
            f"; the limit is {TOO_SLOW_FACTOR:g} times the baseline's launch ({self.baseline_ms[case]:.3f} ms) "
            f"and at least {MIN_LAUNCH_LIMIT_S:g} s")
        return basis + "; the worker was killed with its kernel"


def launch_limit_s(baseline_ms: float) -> float:
    return max(MIN_LAUNCH_LIMIT_S, TOO_SLOW_FACTOR * baseline_ms / 1000.0)


def call_limits(task: Task, deadline: Deadline, baseline_median_ms: Mapping[str, float]) -> CallLimits:
    """The limits of a call from the baseline's median launch per performance case. A case the baseline was
    not timed on (correctness, holdout) gets the baseline's time scaled by the case's work (flops, else bytes,
    else its arrays' size), from the performance case that gives the longest; no timing, no launch limits."""
    timed = {name: ms for name, ms in baseline_median_ms.items() if ms and ms > 0}
    measured = [(ms, _work(task, task.case(name).dims)) for name, ms in timed.items()
                if name in {c.name for c in task.cases}]
    baseline: dict[str, float] = {}
    for case in task.cases:
        if case.name in timed:
            baseline[case.name] = timed[case.name]
        elif measured:
            work = _work(task, case.dims)
            baseline[case.name] = max((ms * work / per for ms, per in measured if per > 0), default=0.0)
    return CallLimits(deadline, {name: launch_limit_s(ms) for name, ms in baseline.items()}, baseline)


def _work(task: Task, dims: Mapping[str, int]) -> float:
    for amount in (task.flops(dims), task.bytes_moved(dims)):
        if amount is not None and amount > 0:
            return amount
    return float(sum(spec.nbytes for spec in Layout.for_case(task, dims).arrays))
