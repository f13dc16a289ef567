"""At the end of a run the best must also pass the holdout cases, which the agent never saw, against the
reference's outputs and the task's float64 oracle; the result records whether there was an oracle
(`oracle_used`), so that every report can say "no independent oracle" where there was none."""

from __future__ import annotations

import logging

from harness.call_limits import OutOfTime
from harness.drawn_inputs import oracle_split
from harness.oracle import OracleError
from harness.settings import ReferenceFailed
from server.records import EventKind
from server.run import Progress, Run

log = logging.getLogger(__name__)


def check_holdout(run: Run, number: int) -> dict:
    """The attempt on the holdout cases. Whatever goes wrong there is the attempt's failure: an
    error must not keep a run from finishing (nor a cheat from being disqualified)."""
    cases = list(run.task.holdout_cases)
    try:
        return _check(run, number, cases)
    except OutOfTime as out:  # the call's deadline: not checked in time is not checked
        return {"attempt": number, "passed": False, "cases": [c.name for c in cases],
                "reasons": [{"code": "timeout", "case": None, "detail": f"the holdout check did not finish: {out}"}]}
    except Exception as exc:  # noqa: BLE001 - reported as the attempt's holdout failure, and logged
        # The task's reference or oracle failing is said in one line; anything else comes with its traceback.
        log.warning("holdout check of attempt %d failed: %s", number, exc,
                    exc_info=not isinstance(exc, (ReferenceFailed, OracleError)))
        return {"attempt": number, "passed": False, "cases": [c.name for c in cases],
                "oracle_used": run.task.oracle_file is not None, "reasons": [{"code": "launch_error", "case": None,
                             "detail": f"the holdout check could not run it: {type(exc).__name__}: {exc}"[:1000]}]}


def _check(run: Run, number: int, cases) -> dict:
    entry = next(e for e in run.history if e.attempt == number)
    kernel, _ = run.kernel(run.candidates[entry.candidate])
    if kernel is None:
        raise RuntimeError("it no longer compiles")
    report = run.executor.check(kernel, cases)
    result = {"attempt": number, "passed": report.passed, "cases": [c.name for c in cases],
              "reasons": [r.model_dump(mode="json") for r in report.reasons],
              "oracle_used": run.task.oracle_file is not None}
    by_oracle, skipped = oracle_split(run.task, cases, run.settings.timing)
    if skipped:
        result["oracle_skipped"] = skipped  # too large for the host's oracle
    if report.passed and run.task.oracle_file is not None and by_oracle:
        oracle = run.executor.check(kernel, by_oracle, None, True)
        result["oracle_passed"] = oracle.passed
        result["passed"] = oracle.passed
        result["reasons"] += [r.model_dump(mode="json") for r in oracle.reasons]
    return result


def holdout_verdict(run: Run, progress: Progress | None) -> tuple[dict, list[int], int]:
    """(holdout result of the final best, disqualified attempts, final best attempt number)."""
    best = run.best_number
    # The baseline competes by its score too: a slower valid attempt never replaces it.
    valid = [e for e in run.history if e.valid and e.attempt != best]
    ranked = [best] + [e.attempt for e in sorted(valid, key=lambda e: e.score_ms)]
    disqualified: list[int] = []
    for index, number in enumerate(ranked):
        if progress:
            progress(index, len(ranked), f"holdout cases for attempt {number}")
        result = check_holdout(run, number)
        if result["passed"]:
            result["disqualified"] = disqualified
            return result, disqualified, number
        disqualified.append(number)
        run.audit.append(EventKind.DISQUALIFIED, {"attempt": number, "reasons": result["reasons"]})
    return {"attempt": None, "passed": False, "cases": [c.name for c in run.task.holdout_cases],
            "reasons": [], "oracle_used": run.task.oracle_file is not None, "note": "no attempt, the baseline included, passes the holdout cases"}, disqualified, 0
