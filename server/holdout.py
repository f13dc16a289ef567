"""At the end of a run the best must also pass the holdout cases, which the agent never saw."""

from __future__ import annotations

from server.run import Progress, Run


def check_holdout(run: Run, number: int) -> dict:
    entry = next(e for e in run.history if e["attempt"] == number)
    kernel, _ = run.kernel(run.candidates[entry["candidate"]])
    cases = list(run.task.holdout_cases)
    report = run.executor.check(kernel, cases)
    result = {"attempt": number, "passed": report.passed, "cases": [c.name for c in cases],
              "reasons": [r.model_dump(mode="json") for r in report.reasons]}
    if report.passed and run.task.oracle_file is not None:
        oracle = run.executor.check(kernel, cases, None, True)
        result["oracle_passed"] = oracle.passed
        result["passed"] = oracle.passed
        result["reasons"] += [r.model_dump(mode="json") for r in oracle.reasons]
    return result


def holdout_verdict(run: Run, progress: Progress | None) -> tuple[dict, list[int], int]:
    """(holdout result of the final best, disqualified attempts, final best attempt number)."""
    best = run.summary.get("best_attempt", 0)
    valid = [e for e in run.history if e["verdict"] in ("valid-faster", "valid-not-faster") and e["attempt"] != best]
    ranked = [best] + [e["attempt"] for e in sorted(valid, key=lambda e: e["score_ms"])]
    if 0 not in ranked:
        ranked.append(0)
    disqualified: list[int] = []
    for index, number in enumerate(ranked):
        if progress:
            progress(index, len(ranked), f"holdout cases for attempt {number}")
        result = check_holdout(run, number)
        if result["passed"]:
            result["disqualified"] = disqualified
            return result, disqualified, number
        disqualified.append(number)
        run.audit.append("disqualified", {"attempt": number, "reasons": result["reasons"]})
    return {"attempt": None, "passed": False, "cases": [c.name for c in run.task.holdout_cases],
            "reasons": [], "note": "no attempt, the baseline included, passes the holdout cases"}, disqualified, 0
