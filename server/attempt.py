"""Official attempts: the baseline (attempt 0), record_attempt, interrupted attempts, finish.

An attempt claims its slot (attempts/NNN.cu, written atomically) before any GPU work, so the budget
is counted exactly once even if the server dies mid-attempt; a resumed run records such a slot as
rejected ("interrupted").
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Callable

from harness.call_limits import OutOfTime
from harness.vendor_yardstick import vendor_summary
from harness.peaks import roofline_fraction
from harness.side_by_side import SideBySide, TimingFailed, time_side_by_side
from harness.stats import geomean_speedup, geometric_mean, speedup, summarize
from harness.results import Reason, ReasonCode
from server import probes, suspicion
from server.audit import sha256_file
from server.call import part
from server.mix_reading import ArithmeticGate, NotTimed, compile_summary, kernel_ahead
from server.models import AttemptAnswer, CaseLatency, FinishAnswer
from server.holdout import holdout_verdict
from server.lease_waits import LeaseWatch
from server.records import AttemptRecord, EventKind, Verdict
from server.run import Candidate, Progress, Refusal, Run, now_iso
from server.summary import attempt_entry, best_attempt, set_best, write_history, write_summary

log = logging.getLogger(__name__)


def record_baseline(run: Run, progress: Progress | None) -> None:
    watch = LeaseWatch(run.executor, progress)
    progress = watch.report
    baseline = run.register_candidate(run.task.source("initial"), (), run.task.own_launch("initial"))
    run.claim_slot(0, baseline.source)
    run.audit.append(EventKind.ATTEMPT_STARTED, {"attempt": 0, "candidate": baseline.id})
    entry, gpu_seconds = _evaluate(run, 0, baseline, {"baseline": None}, fresh=False, progress=progress)
    if entry.rejected:
        raise RuntimeError("the task's baseline initial.cu fails the protocol: "
                           + "; ".join(str(r.detail) for r in entry.reasons)[:2000])
    entry.verdict = Verdict.BASELINE
    gpu_seconds += _record_vendor(run, entry, progress) - watch.waited_s()
    run.add_entry(entry)
    run.add_gpu_seconds(gpu_seconds)
    run.audit.append(EventKind.BASELINE_DONE, {"gpu_seconds": round(gpu_seconds, 6), "score_ms": entry.score_ms,
                                               **watch.record()})
    set_best(run, 0)
    write_history(run)
    write_summary(run, status="running")


def _record_vendor(run: Run, entry: AttemptRecord, progress: Progress | None) -> float:
    """The task's vendor call (cuBLAS), timed once beside the baseline: a yardstick ("vs cuBLAS"), never a
    verdict. The full report goes into the baseline's history entry, the per-case view into summary["vendor"]."""
    _say(progress, 3.8, 4, "timing the vendor library beside the baseline")
    report = run.executor.time_vendor(list(run.task.performance_cases))
    if report is None:
        return 0.0
    for note in report.notes:
        log.warning("%s", note)
    baseline_ms = entry.medians()
    entry.vendor = report.model_dump(mode="json")
    run.update_summary({"vendor": vendor_summary(report, baseline_ms)})
    return report.gpu_seconds


def record_attempt(run: Run, candidate: Candidate, rationale: str, usage: dict | None,
                   progress: Progress | None) -> AttemptAnswer:
    left = run.settings.max_attempts - run.attempts_used
    if left <= 0:
        raise Refusal("the attempt budget is spent; the run is finished. Read referee://summary.json.")
    best = best_attempt(run)
    number = max(run.claimed_attempts()) + 1
    watch = LeaseWatch(run.executor, progress)  # a wait for another process's timing is told and recorded
    progress = watch.report
    run.claim_slot(number, candidate.source)
    try:
        # From the claim until history.json holds the attempt, a failure records it as rejected (interrupted).
        run.audit.append(EventKind.ATTEMPT_STARTED, {"attempt": number, "candidate": candidate.id, "rationale": rationale,
                                             "usage": usage})
        run.open_attempt_window()
        probes.publish(run)  # describe_task, answered meanwhile, counts this attempt as spent
        references = ({"best": best, "baseline": run.history[0]} if best.attempt != 0
                      else {"baseline": run.history[0]})
        entry, gpu_seconds = _evaluate(run, number, candidate, references, fresh=True, progress=progress)
        gpu_seconds -= watch.waited_s()
        entry.update(rationale=rationale, usage=usage, parent=best.attempt)
        if not entry.rejected:
            entry.verdict = Verdict.VALID_FASTER if entry.speedup_vs_best.beyond_noise else Verdict.VALID_NOT_FASTER
        run.add_entry(entry)
        run.add_gpu_seconds(gpu_seconds)
        run.audit.append(EventKind.ATTEMPT_DONE, {"attempt": number, "verdict": entry.verdict,
                                                  "gpu_seconds": round(gpu_seconds, 6), **watch.record()})
        if entry.verdict == Verdict.VALID_FASTER:
            set_best(run, number)
        write_history(run)
    except Exception as exc:
        _interrupted(run, number, best.attempt, exc)
        raise
    holdout = None
    if run.attempts_used >= run.settings.max_attempts:
        holdout = finish(run, "budget exhausted", part(progress, 3.5, 4, 4)).holdout
    else:
        write_summary(run, status="running")
    _say(progress, 4, 4, f"attempt {number}: {entry.verdict}")
    return AttemptAnswer(attempt=number, candidate=candidate.id, verdict=entry.verdict,
                         reasons=[Reason.model_validate(r.to_json()) for r in entry.reasons], cases=_latencies(entry),
                         score_ms=entry.score_ms, speedup_vs_baseline=_answer(entry.speedup_vs_baseline),
                         speedup_vs_best=_answer(entry.speedup_vs_best), best_attempt=run.best_number,
                         budget=run.budget(), holdout=holdout, mix=entry.compile.mix if entry.compile else None)


def _evaluate(run: Run, number: int, candidate: Candidate, references: dict, *, fresh: bool,
              progress: Progress | None) -> tuple[AttemptRecord, float]:
    """Compile, check (visible and, for attempts, fresh secret inputs), then time side by side. A call whose
    deadline runs out meanwhile gets its verdict: rejected, timeout (the worker that ran past it was killed)."""
    clock = GpuWaitStopwatch()
    entry = attempt_entry(run, number, candidate)
    try:
        return _judged(run, entry, candidate, references, clock, fresh=fresh, progress=progress), clock.seconds
    except OutOfTime as out:
        return _reject(entry, [Reason(code=ReasonCode.TIMEOUT, detail=str(out))]), clock.seconds


def _judged(run: Run, entry: AttemptRecord, candidate: Candidate, references: dict, clock: GpuWaitStopwatch, *,
            fresh: bool, progress: Progress | None) -> AttemptRecord:
    number = entry.attempt
    visible = list(run.task.visible_cases)
    seeds = {case.name: secrets.randbits(31) for case in visible} if fresh else {}
    if fresh:
        run.executor.prepare(visible, seeds)  # the secret inputs are made while the kernel compiles and is checked
    kernel, compiled, reading = kernel_ahead(run, candidate)
    entry.compile = compile_summary(compiled)
    gate = ArithmeticGate(run, entry, candidate, compiled, reading)
    try:
        checked = _checked(run, entry, kernel, visible, seeds, clock, progress) if kernel is not None else None
    except BaseException:
        gate.settle()  # the checks ran out of time: the attempt still records its instructions
        raise
    if checked is not None or reading is None:  # rejected by its checks, or nothing left to read: judged now
        if (refused := gate.refusal()) is not None:
            return _reject(entry, refused)
        if checked is not None:
            return checked
    try:
        _say(progress, 3, 4, "timing side by side with the best and the baseline")
        timing, timing_reasons = _interleaved(run, kernel, references, clock, gate.before_first,
                                              judged=number > 0)
    except NotTimed as refused:  # its mix, read while the references were timed, forbids it: never timed
        return _reject(entry, refused.reasons)
    except Exception:  # a reference's timing failed or ran out of time: the attempt still records its instructions,
        if (refused := gate.refusal()) is not None:  # and a kernel that could not have been timed says why
            return _reject(entry, refused)
        raise
    except BaseException:
        gate.settle()
        raise
    if timing_reasons:
        return _reject(entry, timing_reasons)
    _fill_timing(run, entry, timing)
    impossible = suspicion.beyond_physical_limit(run, entry) if number > 0 else []
    if impossible:  # refused, not re-verified: re-timing an impossible result proves nothing
        run.audit.append(EventKind.BEYOND_PHYSICAL_LIMIT, {"attempt": number, "cases": [r.case for r in impossible]})
        return _reject(entry, impossible)
    suspicious = suspicion.flags(run, entry) if number > 0 else []
    if suspicious:
        _say(progress, 3.5, 4, "re-verifying a result that looks too good")
        entry.flags = suspicious
        entry.reverification, recheck_reasons = suspicion.reverify(run, entry, kernel, clock)
        run.audit.append(EventKind.FLAGGED, {"attempt": number, "flags": suspicious, "reverified": not recheck_reasons})
        if recheck_reasons:
            return _reject(entry, recheck_reasons)
    return entry


def _checked(run: Run, entry: AttemptRecord, kernel, visible: list, seeds: dict, clock,
             progress: Progress | None) -> AttemptRecord | None:
    """The checks on the visible cases, then (`seeds`: an attempt's) on fresh inputs from secret seeds: the entry
    rejected with their reasons, or None where they passed."""
    fresh = bool(seeds)
    _say(progress, 1, 4, "checking the visible cases")
    check = clock.run(run.executor.check, kernel, visible)
    entry.validation = {"visible": check.model_dump(mode="json")}
    if (note := run.executor.judging_note()) is not None:  # why cases meant for the GPU were judged on the host
        entry.validation["judged_on_host_because"] = note
    reasons = list(check.reasons)
    if check.passed and fresh:
        _say(progress, 2, 4, "checking fresh inputs from secret seeds")
        fresh_check = clock.run(run.executor.check, kernel, visible, seeds)
        entry.validation = {**entry.validation, "fresh": {"seeds": seeds, **fresh_check.model_dump(mode="json")}}
        reasons += [r.model_copy(update={"detail": f"fresh inputs: {r.detail}"}) for r in fresh_check.reasons]
    if reasons or not check.passed:
        return _reject(entry, reasons)
    return None


def _interleaved(run: Run, kernel, references: dict, clock, before_first: Callable[[str], None] | None = None,
                 judged: bool = True) -> tuple[SideBySide | None, list[Reason]]:
    """Samples of each reference attempt and the candidate, in alternating blocks (the references first in each
    round: a new compile's instruction mix is read while they are timed), merged per case. The references' launches
    are not judged for their shape, nor the candidate's where it is the task's own kernel (not `judged`)."""
    kernels = {}
    for label, entry in references.items():
        if entry is not None:
            kernels[label] = run.kernel(run.candidates[entry.candidate])[0]
    kernels["candidate"] = kernel
    timed = lambda k, cases: clock.run(run.executor.time, k, cases)  # noqa: E731
    try:
        return time_side_by_side(timed, kernels, list(run.task.performance_cases), run.settings.timing_rounds,
                                 before_first, judged=("candidate",) if judged else ()), []
    except TimingFailed as failed:
        if failed.label == "candidate":
            return None, failed.reasons
        raise RuntimeError(str(failed)) from None


def _fill_timing(run: Run, entry: AttemptRecord, timing: SideBySide) -> None:
    """Statistics of the merged samples; speedups against the best and the baseline measured beside it."""
    stats = timing.stats()
    cases = [c.name for c in run.task.performance_cases]
    mine, baseline = stats["candidate"], stats.get("baseline")
    best = stats.get("best", baseline)
    entry.score_ms = geometric_mean([mine[c].median_ms for c in cases])
    rows = {}
    for name in cases:
        measured = timing.cases["candidate"][name]
        row = {"stats": _dump(mine[name]), "samples_ms": timing.samples["candidate"][name],
               "achieved_gbps": measured.achieved_gbps, "achieved_tflops": measured.achieved_tflops,
               "roofline_ms": measured.roofline_ms,
               "roofline_fraction": roofline_fraction(measured.roofline_ms, mine[name].median_ms),
               "clock": measured.clock, "event_median_ms": _median(timing.event_samples.get("candidate", {}).get(name)),
               # fresh: every timed launch drew new inputs from a secret key; audited: launches compared in full
               "inputs": measured.inputs, "audited_launches": timing.audited.get("candidate", {}).get(name),
               # the chance, at most, that a kernel wrong on more than half of these launches passed every audit
               "audit_escape_bound": timing.audit_escape_bound("candidate", name)}
        if baseline is not None:
            row.update(baseline_stats=_dump(baseline[name]), best_stats=_dump(best[name]),
                       speedup_vs_baseline=_dump(speedup(baseline[name], mine[name])),
                       speedup_vs_best=_dump(speedup(best[name], mine[name])))
        waived = {label: notes for label, per_case in timing.waived.items() if (notes := per_case.get(name))}
        if waived:
            row["shape_waived"] = waived
        rows[name] = row
    entry.timing = rows
    if baseline is not None:
        entry.speedup_vs_baseline = _dump(geomean_speedup([(baseline[c], mine[c]) for c in cases]))
        entry.speedup_vs_best = _dump(geomean_speedup([(best[c], mine[c]) for c in cases]))


def _median(samples: list[float] | None) -> float | None:
    return summarize(samples).median_ms if samples else None


def _dump(model) -> dict:
    return model.model_dump(mode="json")


def _answer(record) -> dict | None:
    return record.to_json() if record is not None else None


def _latencies(entry: AttemptRecord) -> list[CaseLatency]:
    return [CaseLatency(case=name, stats=t.stats.to_json(), achieved_gbps=t.achieved_gbps,
                        achieved_tflops=t.achieved_tflops, roofline_ms=t.roofline_ms,
                        roofline_fraction=t.roofline_fraction, baseline_median_ms=t.baseline_median_ms,
                        speedup_vs_baseline=_answer(t.speedup_vs_baseline), speedup_vs_best=_answer(t.speedup_vs_best),
                        inputs=t.inputs, audited_launches=t.audited_launches,
                        audit_escape_bound=t.audit_escape_bound)
            for name, t in (entry.timing or {}).items()]


def _reject(entry: AttemptRecord, reasons: list[Reason]) -> AttemptRecord:
    entry.verdict = Verdict.REJECTED
    entry.reasons = [r.model_dump(mode="json") for r in reasons]
    entry.finished = now_iso()
    return entry


def _say(progress: Progress | None, done: float, total: float, message: str) -> None:
    if progress:
        progress(done, total, message)


class GpuWaitStopwatch:
    """Wall time spent waiting on the GPU side: the run's GPU time."""

    def __init__(self):
        self.seconds = 0.0

    def run(self, fn, *args):
        started = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds += time.perf_counter() - started


def _interrupted(run: Run, number: int, best_before: int, exc: Exception) -> None:
    """The slot stays counted: forget what the failed attempt changed and record it as rejected now (best effort:
    if that fails too, as on a disk that is still full, the next resume records it)."""
    run.forget_attempt(number, best_before)
    try:
        settle_interrupted(run, f"failed inside the referee ({type(exc).__name__}: {exc})"[:1000])
    except Exception:  # noqa: BLE001 - the original error is the one to report
        log.warning("attempt %d could not be recorded as interrupted yet", number, exc_info=True)
    try:
        set_best(run, best_before)  # best.cu and best-case-N.json back to the best that stands
    except Exception:  # noqa: BLE001 - as above; the next new best or finish rewrites them
        log.warning("best.cu could not be restored yet", exc_info=True)


def settle_interrupted(run: Run, why: str = "the server stopped during this attempt") -> None:
    """A claimed slot with no history entry: the server stopped (or failed) during it. It stays counted."""
    for claim in (run.dir / "attempts").glob("[0-9][0-9][0-9].claim"):
        claim.unlink()  # left by a server stopped while claiming: the slot file alone says whether it counts
    recorded = {entry.attempt for entry in run.history}
    for number in sorted(run.claimed_attempts() - recorded - {0}):
        entry = AttemptRecord(attempt=number, candidate=None, source_file=f"attempts/{number:03d}.cu",
                              started=None, finished=now_iso(), verdict=Verdict.REJECTED,
                              reasons=[Reason(code=ReasonCode.WORKER_CRASHED, detail=(
                                  f"interrupted: {why}; the attempt stays counted")).model_dump(mode="json")])
        run.add_entry(entry)
        run.audit.append(EventKind.ATTEMPT_INTERRUPTED, {"attempt": number, **_slot_file(run, number)})
    if len(run.history) != len(recorded):
        write_history(run)
        if run.attempts_used >= run.settings.max_attempts and not run.finished:
            finish(run, "budget exhausted", None)
        else:
            write_summary(run, status=run.summary.status or "running")


def _slot_file(run: Run, number: int) -> dict:
    """The slot file of an interrupted attempt, where the server stopped before logging its write: recorded
    now with its hash, so `verify` accounts for it (a file no record names is refused as added)."""
    relative = f"attempts/{number:03d}.cu"
    path = run.dir / relative
    return {"path": relative, "sha256": sha256_file(path)} if path.is_file() else {}


def finish(run: Run, reason: str, progress: Progress | None) -> FinishAnswer:
    """End the run: the best must pass the holdout cases, or the next valid attempt that does. Its report is
    written by the caller once the call has answered (server/app.py)."""
    holdout, disqualified, final = holdout_verdict(run, progress)
    set_best(run, final)
    write_history(run)  # it may hold an attempt whose record a full disk kept from history.json
    run.audit.append(EventKind.FINISHED, {"reason": reason, "best_attempt": final, "disqualified": disqualified})
    run.report_due = True  # before the summary says finished: whoever sees the run finished sees its report due
    write_summary(run, status="finished", stop_reason=reason, holdout=holdout, disqualified=disqualified)
    _say(progress, 1, 1, f"run finished; the best is attempt {final}")
    return FinishAnswer(stop_reason=reason, best_attempt=final, disqualified=disqualified, holdout=holdout,
                        signing_key_fingerprint=run.key.fingerprint if run.key is not None else None)
