"""The free but counted tools: describe, compile, run_cases, validate, time_kernel."""

from __future__ import annotations

import time
from typing import Callable

from harness.call_limits import OutOfTime
from harness.vendor_yardstick import describe_view
from harness.side_by_side import SideBySide, TimingFailed, time_side_by_side
from harness.stats import geometric_mean, geomean_speedup, speedup
from harness.results import CheckReport
from server.device_facts import device_facts
from server.models import (CaseLatency, CaseStatus, CheckAnswer, CompileAnswer, DeviceFacts, Resources, TaskCase,
                           TaskDescription, TimeAnswer)
from server.lease_waits import LeaseWatch
from server.run import Candidate, Progress, Refusal, Run
from server.summary import best_attempt, entry_of


def describe(run: Run) -> TaskDescription:
    """What describe_task answers: the run as the last call that changed it left it. Needs neither the run's
    mutex nor the gate: the answer is an object no one changes once published."""
    return run.published if run.published is not None else publish(run)


def publish(run: Run) -> TaskDescription:
    """Describe the run as it is now, for the read-only calls: called with the run's mutex held, or before the
    first call."""
    run.published = _described_now(run)
    return run.published


def _described_now(run: Run) -> TaskDescription:
    task, baseline, best = run.task, entry_of(run, 0), best_attempt(run)
    cases = [TaskCase(name=c.name, role=c.role, dims=c.dims, baseline_median_ms=baseline.median_ms(c.name))
             for c in task.visible_cases]
    params = [{"name": p.name, "kind": p.kind, "dtype": p.dtype, "shape": list(p.shape), "value": p.value}
              for p in task.params]
    return TaskDescription(
        name=task.name, description=task.description, kernel_name=task.kernel_name, signature=task.signature,
        parameters=params, cases=cases,
        tolerances={k: v.model_dump() for k, v in task.tolerances.items()},
        launch_default=task.launch.model_dump(mode="json"), device=run.environment,
        baseline_score_ms=baseline.score_ms, best_attempt=best.attempt, best_score_ms=best.score_ms,
        budget=run.budget(), vendor=describe_view(run.summary.vendor), device_facts=device_facts(run.environment),
        profiling=run.settings.profile)


def device(run: Run) -> DeviceFacts:
    """What referee://device answers: the device's facts as describe_task gives them."""
    return describe(run).device_facts


def compile_candidate(run: Run, make_candidate: Callable[[], Candidate]) -> CompileAnswer:
    candidate = make_candidate()  # charged to the compile rate limit before anything is written (Run.candidate)
    _, compiled = run.kernel(candidate)
    return compile_answer(run, candidate, compiled)


def compile_answer(run: Run, candidate: Candidate, compiled) -> CompileAnswer:
    """compile_kernel's answer for a candidate and its compile result (server/early_compiles.py's too)."""
    r = compiled.resources
    resources = None if r is None else Resources(registers=r.registers, spill_bytes=r.spill_store_bytes + r.spill_load_bytes,
                                                 shared_bytes=r.shared_bytes, stack_bytes=r.stack_bytes)
    return CompileAnswer(candidate=candidate.id, ok=compiled.ok, arch=compiled.arch, log=compiled.log,
                         log_resource=f"referee://compile-logs/{candidate.id}", resources=resources,
                         compile_ms=compiled.compile_ms, cache_hit=compiled.cache_hit, mix=compiled.mix,
                         rejected=run.arithmetic_refusal(candidate, compiled))


def compiled_kernel(run: Run, tool: str, candidate: Candidate):
    """The candidate's kernel. One that does not compile still costs the probe: the compile was done, and the
    probe is logged so that a resumed run counts it too."""
    kernel, compiled = run.kernel(candidate)
    if kernel is None and compiled.ok:  # on units the task forbids: not run, the probe counted
        refusal = run.arithmetic_refusal(candidate, compiled)
        run.probe_done(tool, 0.0, {"candidate": candidate.id, "compiled": True, "rejected": refusal.code.value})
        raise Refusal(f"candidate {candidate.id} is rejected before it runs ({refusal.code.value}; the probe is "
                      f"counted: {run.budget().probes_left_in_window} left in this window): {refusal.detail}")
    if kernel is None:
        run.probe_done(tool, 0.0, {"candidate": candidate.id, "compiled": False})
        raise Refusal(f"candidate {candidate.id} does not compile (the probe is counted: "
                      f"{run.budget().probes_left_in_window} left in this window):\n{compiled.log}")
    return kernel


def _statuses(report: CheckReport) -> list[CaseStatus]:
    return [CaseStatus(case=c.case, passed=c.passed, outputs=c.outputs, reasons=c.reasons, warnings=c.warnings)
            for c in report.cases]


def check_cases(run: Run, tool: str, make_candidate: Callable[[], Candidate],
                case_names: list[str] | None, progress: Progress | None = None) -> CheckAnswer:
    """run_cases (chosen visible cases) and validate (all visible cases): the correctness protocol."""
    run.charge_probe()
    cases = run.cases_named(case_names)
    candidate = make_candidate()
    kernel = compiled_kernel(run, tool, candidate)
    started = time.perf_counter()
    report = None
    try:
        if progress:
            progress(0, 1, f"checking {len(cases)} visible case(s)")
        report = run.executor.check(kernel, cases)
    except OutOfTime as out:
        raise Refusal(_out_of_time(tool, out)) from None
    finally:
        run.probe_done(tool, time.perf_counter() - started,
                       {"candidate": candidate.id, "passed": report.passed if report else None})
    if progress:
        codes = sorted({r.code.value for r in report.reasons})
        progress(1, 1, f"{len(report.cases)} case(s) checked: " + ("passed" if report.passed else ", ".join(codes)))
    return CheckAnswer(candidate=candidate.id, passed=report.passed, cases=_statuses(report), budget=run.budget())


def _out_of_time(tool: str, out: OutOfTime) -> str:
    return f"{tool} stopped: {out}. The probe is counted."


def time_candidate(run: Run, make_candidate: Callable[[], Candidate], case_names: list[str] | None,
                   progress: Progress | None) -> TimeAnswer:
    """Validate first (a wrong kernel is never timed), then time it beside the best and the baseline."""
    run.charge_probe()
    cases = run.cases_named(case_names, performance_only=True)
    candidate = make_candidate()
    kernel = compiled_kernel(run, "time_kernel", candidate)
    watch = LeaseWatch(run.executor, progress)  # a wait for another process's timing is told and recorded
    progress = watch.report
    started = time.perf_counter()
    try:
        if progress:
            progress(0, 3, "validating on the visible cases")
        require_valid(run, kernel, candidate, "timed")
        if progress:
            progress(1, 3, "timing beside the best and the baseline")
        # One round: a probe is a quick look; an attempt times settings.timing_rounds rounds the same way.
        measured = time_side_by_side(run.executor.time, _side_by_side(run, kernel), cases, rounds=1)
    except OutOfTime as out:
        raise Refusal(_out_of_time("time_kernel", out)) from None
    except TimingFailed as failed:
        if failed.label != "candidate":
            raise RuntimeError(str(failed)) from None
        details = "; ".join(f"{r.code.value}: {r.detail}" for r in failed.reasons[:3])
        raise Refusal(f"timing rejected candidate {candidate.id}: {details}") from None
    finally:
        run.probe_done("time_kernel", time.perf_counter() - started - watch.waited_s(),
                       {"candidate": candidate.id, **watch.record()})
    if progress:
        progress(3, 3, "timed")
    return _time_answer(run, candidate, measured)


def _side_by_side(run: Run, kernel) -> dict:
    kernels = {"candidate": kernel, "baseline": run.kernel(run.candidates[entry_of(run, 0).candidate])[0]}
    best = best_attempt(run)
    if best.attempt != 0:
        kernels["best"] = run.kernel(run.candidates[best.candidate])[0]
    return kernels


def _time_answer(run: Run, candidate: Candidate, measured: SideBySide) -> TimeAnswer:
    stats = measured.stats()
    best = stats.get("best", stats["baseline"])
    rows = []
    for case in measured.cases["candidate"].values():
        mine = stats["candidate"][case.case]
        rows.append(CaseLatency(case=case.case, stats=mine, achieved_gbps=case.achieved_gbps,
                                achieved_tflops=case.achieved_tflops, roofline_ms=case.roofline_ms,
                                roofline_fraction=case.roofline_fraction,
                                baseline_median_ms=stats["baseline"][case.case].median_ms,
                                speedup_vs_baseline=speedup(stats["baseline"][case.case], mine),
                                speedup_vs_best=speedup(best[case.case], mine),
                                inputs=case.inputs, audited_launches=case.audited_launches,
                                audit_escape_bound=measured.audit_escape_bound("candidate", case.case)))
    names = [r.case for r in rows]
    return TimeAnswer(
        candidate=candidate.id, cases=rows, score_ms=geometric_mean([stats["candidate"][n].median_ms for n in names]),
        speedup_vs_baseline=geomean_speedup([(stats["baseline"][n], stats["candidate"][n]) for n in names]),
        speedup_vs_best=geomean_speedup([(best[n], stats["candidate"][n]) for n in names]), budget=run.budget())


def require_valid(run: Run, kernel, candidate: Candidate, what: str) -> None:
    """Validation on the visible cases before a candidate is timed or profiled: a wrong kernel is refused."""
    check = run.executor.check(kernel, list(run.task.visible_cases))
    if not check.passed:
        details = "; ".join(f"{r.code.value} [{r.case}]: {r.detail}" for r in check.reasons[:3])
        raise Refusal(f"not {what}: candidate {candidate.id} fails validation ({details}). Fix it first; "
                      "validate or run_cases show the mismatches.")
