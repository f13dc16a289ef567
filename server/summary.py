"""history.json, summary.json, best.cu and best-case-N.json: the files a person reads after a run."""

from __future__ import annotations

import hashlib
from collections import Counter

from server.record_files import HISTORY, SUMMARY, history_json, summary_json
from server.records import AttemptRecord, Verdict
from server.run import Candidate, Run, now_iso


def attempt_entry(run: Run, number: int, candidate: Candidate) -> AttemptRecord:
    return AttemptRecord(
        attempt=number, candidate=candidate.id, started=now_iso(), finished=None,
        source_file=f"attempts/{number:03d}.cu", source_sha256=hashlib.sha256(candidate.source.encode()).hexdigest(),
        options=list(candidate.options), launch=candidate.launch.model_dump(mode="json"),
        verdict=None, reasons=[], compile=None, validation=None, timing=None,
        score_ms=None, speedup_vs_baseline=None, speedup_vs_best=None)


def entry_of(run: Run, number: int) -> AttemptRecord:
    return next(e for e in run.history if e.attempt == number)


def best_attempt(run: Run) -> AttemptRecord:
    return entry_of(run, run.best_number)


def set_best(run: Run, number: int) -> None:
    """Make attempt `number` the best: best.cu and one replay request per visible case."""
    entry = entry_of(run, number)
    run.update_summary({"best_attempt": number})
    candidate = run.candidates[entry.candidate]
    run.write_text("best.cu", candidate.source)
    for index, case in enumerate(run.task.visible_cases):
        geometry = candidate.launch.resolve(case)
        run.write_json(f"best-case-{index}.json", {
            "task": run.task.name, "attempt": number, "kernel": "best.cu", "kernel_name": run.task.kernel_name,
            "options": list(candidate.options), "case": case.name, "role": case.role, "dims": case.dims,
            "seed": case.seed, "launch": geometry.model_dump(mode="json"), "median_ms": entry.median_ms(case.name)})


def write_history(run: Run) -> None:
    run.write_json(HISTORY, history_json(run.task.name, run.history))


def write_summary(run: Run, status: str, stop_reason: str | None = None, holdout: dict | None = None,
                  disqualified: list[int] | None = None) -> None:
    best = best_attempt(run)
    baseline = entry_of(run, 0)
    attempts = [e for e in run.history if e.attempt > 0]
    rejections = Counter(code for e in attempts if e.rejected for code in [e.first_reason_code()] if code)
    run.update_summary({
        "task": run.task.name, "run": run.dir.name, "status": status, "updated": now_iso(),
        "stop_reason": stop_reason if stop_reason is not None else run.summary.stop_reason,
        "budget": {"max_attempts": run.settings.max_attempts, "used": run.attempts_used,
                   "left": max(0, run.settings.max_attempts - run.attempts_used)},
        "best_attempt": best.attempt,
        "best": best.latency_view(), "baseline": baseline.latency_view(),
        "speedup_vs_baseline": best.speedup_vs_baseline,
        "attempts": {"recorded": len(attempts), "valid": sum(e.valid for e in attempts),
                     "valid_faster": sum(e.verdict == Verdict.VALID_FASTER for e in attempts),
                     "rejected": sum(e.rejected for e in attempts)},
        "rejections_by_reason": dict(rejections),
        "gpu_seconds": round(run.gpu_seconds_total, 3), "compiles": run.compiles_total, "probes": run.probes_total,
        "environment": run.environment,
    })
    if holdout is not None:
        run.update_summary({"holdout": holdout, "disqualified": disqualified or []})
    # The record this summary names: verify finds it at that seq, so a log cut before it is refused.
    run.update_summary({"chain_head": run.audit.head, "chain_seq": run.audit.count - 1})
    run.write_json(SUMMARY, summary_json(run.summary))
