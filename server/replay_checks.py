"""A recorded kernel's correctness, judged afresh: the checks `replay` and the regression guard both make.

The kernel on its recorded requests (best-case-N.json) or every visible case, the holdout cases against
the reference's outputs and against the float64 oracle, and fresh random values against the oracle:
each case a CheckResult (server/decision.py), a case the check never reached a failed one.
"""

from __future__ import annotations

import secrets
from typing import Callable

from harness.arithmetic import arithmetic_reason
from harness.drawn_inputs import oracle_cases, oracle_split
from harness.results import CheckReport
from harness.settings import CompiledKernel, TimingSettings
from harness.task_model import Case, LaunchSpec, Task
from harness.worker_side.sass_mix import InstructionMix
from server.decision import CheckResult
from server.executor import Executor
from server.records import NO_INDEPENDENT_ORACLE
from server.replay_record import Subject

Say = Callable[[str], None]


def compile_subject(executor: Executor, subject: Subject,
                    task: Task | None = None) -> tuple[CompiledKernel | None, CheckResult | None]:
    """The subject compiled here, or a failed "compile" check saying why it does not compile; with its `task`, a
    failed "arithmetic" check where it compiles onto units the task does not allow."""
    compiled = executor.compile(subject.source, subject.options)
    if compiled.ok:
        refused = arithmetic_check(task, subject, compiled.mix) if task is not None else None
        if refused is not None:
            return None, refused
        return CompiledKernel(f"attempt-{subject.attempt}", compiled.cubin, compiled.lowered_name, subject.launch), None
    return None, CheckResult(name=f"compile attempt {subject.attempt} ({subject.source_file})", kind="compile",
                             passed=False, reasons=[f"it does not compile here: {compiled.log}"[:1000]])


def arithmetic_check(task: Task, subject: Subject, mix: InstructionMix | None) -> CheckResult | None:
    """A failed "arithmetic" check where the kernel, compiled here, computes on units its task does not allow
    (harness/arithmetic.py), as a run refuses it; None where it keeps to them. The task's own initial kernel, as
    written, is exempt, as in the run (server/run.py `arithmetic_refusal`)."""
    if subject.source == task.source("initial") and not subject.options:
        return None
    reason = arithmetic_reason(task.arithmetic, mix)
    if reason is None:
        return None
    return CheckResult(name=f"arithmetic attempt {subject.attempt} ({subject.source_file})", kind="arithmetic",
                       passed=False, reasons=[f"{reason.code.value}: {reason.detail}"])


def correctness_checks(executor: Executor, task: Task, kernel: CompiledKernel, requests: list[tuple[str, dict]],
                       timing: TimingSettings, say: Say | None = None) -> list[CheckResult]:
    """Every correctness check of a replay, in order: recorded requests, holdout, holdout-oracle, fresh-oracle."""
    say = say or (lambda message: None)
    checks = recorded_checks(executor, task, kernel, requests)
    has_oracle = task.oracle_file is not None
    say("the holdout cases, against the reference outputs " + (
        "and the float64 oracle" if has_oracle else f"only ({NO_INDEPENDENT_ORACLE})"))
    by_oracle, skipped = oracle_split(task, list(task.holdout_cases), timing)
    if has_oracle and skipped:
        say(f"the float64 oracle skips {', '.join(skipped)}: too large for the host (checked against the "
            "reference's outputs only)")
    checks += holdout_checks(executor, task, kernel, by_oracle)
    say("fresh random values against the float64 oracle" if has_oracle else
        f"no fresh random values ({NO_INDEPENDENT_ORACLE} to check them against)")
    return checks + fresh_checks(executor, task, kernel, timing)


def check_results(kind: str, against: str, cases: list[Case], report: CheckReport, seeds: dict[str, int] | None = None,
                  label: Callable[[Case], str] | None = None) -> list[CheckResult]:
    """One CheckResult per case asked for; a case the check never reached (after a fault) fails."""
    label = label or (lambda case: f"{kind} {case.name}")
    by_case = {c.case: c for c in report.cases}
    results = []
    for case in cases:
        got = by_case.get(case.name)
        common = dict(name=label(case), kind=kind, case=case.name, against=against,
                      seed=(seeds or {}).get(case.name, case.seed))
        if got is None:
            results.append(CheckResult(**common, passed=False, reasons=[
                "not run: an earlier case ended the check (a fault, a timeout or a crash)"]))
        else:
            results.append(CheckResult(**common, passed=got.passed, detail=got.model_dump(mode="json"),
                                       reasons=[f"{r.code.value}: {r.detail}" for r in got.reasons]))
    return results


def recorded_checks(executor: Executor, task: Task, kernel: CompiledKernel,
                    requests: list[tuple[str, dict]]) -> list[CheckResult]:
    """The kernel on each recorded request as written (its resolved launch); without requests, on every visible
    case with its own launch."""
    if not requests:
        cases = list(task.visible_cases)
        return check_results("replay", "reference", cases, executor.check(kernel, cases))
    results = []
    for name, request in requests:
        case = task.case(request["case"])
        exact = CompiledKernel(kernel.label, kernel.cubin, kernel.symbol, LaunchSpec.model_validate(request["launch"]))
        results += check_results("replay", "reference", [case], executor.check(exact, [case]),
                                 label=lambda c, name=name: f"replay {name} ({c.name})")
    return results


def no_oracle(kind: str) -> CheckResult:
    return CheckResult(name=kind, kind=kind, against="oracle", passed=False,
                       reasons=[f"{NO_INDEPENDENT_ORACLE}: the task declares no float64 oracle (task.toml "
                                "`oracle`), so nothing independent checks the kernel"])


def holdout_checks(executor: Executor, task: Task, kernel: CompiledKernel, by_oracle: list[Case]) -> list[CheckResult]:
    """Every holdout case against the reference's outputs; those the host's oracle takes against it too."""
    cases = list(task.holdout_cases)
    if not cases:
        return []  # the decision names the missing holdout checks
    results = check_results("holdout", "reference", cases, executor.check(kernel, cases))
    if task.oracle_file is None:
        return results + [no_oracle("holdout-oracle")]
    if not by_oracle:
        return results  # the decision names the missing holdout-oracle check
    return results + check_results("holdout-oracle", "oracle", by_oracle, executor.check(kernel, by_oracle, None, True))


def fresh_checks(executor: Executor, task: Task, kernel: CompiledKernel, settings: TimingSettings) -> list[CheckResult]:
    """New seeds, drawn now, on every case's shape (visible and holdout) the host's oracle takes."""
    if task.oracle_file is None:
        return [no_oracle("fresh-oracle")]
    cases = oracle_cases(task, list(task.visible_cases) + list(task.holdout_cases), settings)
    seeds = {case.name: secrets.randbits(31) for case in cases}
    return check_results("fresh-oracle", "oracle", cases, executor.check(kernel, cases, seeds, True), seeds)
