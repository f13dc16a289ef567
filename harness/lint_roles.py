"""Stand-ins judged on the task as a whole: a stand-in that passes every case of a role (every correctness
case, every performance case, every holdout case) is a way through that role, an error; one that passes
some cases and fails another is refused by the task already, a warning naming the case (a legitimate edge
case, such as a softmax over rows of one element, is one).

Each role is judged apart: a kernel may branch on a case's dimensions, so performance cases whose outputs a
stand-in writes measure nothing, whatever the correctness cases hold, and a holdout a stand-in passes
catches nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.lint_findings import Finding, error, warning
from harness.lint_standins import Passed
from harness.task_model import Case, Param, Task

ROLES = ("correctness", "performance", "holdout")

WHY = {"zero-output": "a kernel that writes nothing passes; choose inputs whose outputs are not (near) zero",
       "constant-output": "the output is (near) constant",
       "equals-input": "the output equals an input",
       "one-hot-output": "every output is one-hot along an axis: the inputs' spread saturates the operation; "
                         "narrow the inputs' range",
       "saturated-output": "the operation is saturated (the output is the sign or a step of an input); narrow "
                           "the inputs' range",
       "seed-insensitive": "the output does not depend on the inputs' values"}


@dataclass(frozen=True)
class CaseOutcome:
    """The stand-ins that pass each output of one case (by output name)."""

    case: Case
    passed: dict[str, list[Passed]]


def _tolerance(task: Task, param: Param) -> str:
    tol = task.tolerances[param.name]
    return f"tolerance.{param.name} rtol {tol.rtol:g}, atol {tol.atol:g}"


def refusal(atols: list[float | None]) -> str:
    """Which atol would refuse a stand-in that passes several cases: under the largest, it fails one."""
    known = [a for a in atols if a is not None]
    if not known:
        return "no atol would refuse it"
    return f"an atol under {max(known):.3g} (the rtol kept) would refuse it"


def _common(outcomes: list[CaseOutcome], name: str) -> list[str]:
    """The labels of the stand-ins passing output `name` on every case, in the first case's order."""
    first = [p.stand_in.label for p in outcomes[0].passed.get(name, [])]
    return [label for label in first
            if all(any(p.stand_in.label == label for p in o.passed.get(name, [])) for o in outcomes[1:])]


def _whole_role(task: Task, param: Param, role: str, outcomes: list[CaseOutcome], label: str) -> Finding:
    held = [next(p for p in o.passed[param.name] if p.stand_in.label == label) for o in outcomes]
    check = held[0].stand_in.check
    names = ", ".join(o.case.name for o in outcomes)
    every = f"the {role} case {names}" if len(outcomes) == 1 else f"every {role} case ({names})"
    return error(check, f"stand-in '{label}' passes {every} ({_tolerance(task, param)}; "
                        f"{refusal([p.refusing_atol for p in held])}): {WHY[check]}")


def _edge_case(task: Task, param: Param, role: str, outcome: CaseOutcome, failing: CaseOutcome) -> Finding:
    passed = outcome.passed[param.name][0]
    return warning(passed.stand_in.check,
                   f"case {outcome.case.name}: stand-in '{passed.stand_in.label}' passes it "
                   f"({_tolerance(task, param)}) but fails {role} case {failing.case.name}: the task as a whole "
                   "refuses it (an edge case such as a dimension of 1 is one)")


def role_findings(task: Task, outcomes: list[CaseOutcome]) -> tuple[list[Finding], set[str]]:
    """The findings of every role, and the outputs some stand-in passes on every correctness case."""
    found: list[Finding] = []
    degenerate: set[str] = set()
    for role in ROLES:
        of_role = [o for o in outcomes if o.case.role == role]
        if not of_role:
            continue
        for param in task.output_params:
            common = _common(of_role, param.name)
            if common:
                found.append(_whole_role(task, param, role, of_role, common[0]))
                degenerate |= {param.name} if role == "correctness" else set()
                continue
            for outcome in of_role:
                if outcome.passed.get(param.name):
                    label = outcome.passed[param.name][0].stand_in.label
                    failing = next(o for o in of_role
                                   if not any(p.stand_in.label == label for p in o.passed.get(param.name, [])))
                    found.append(_edge_case(task, param, role, outcome, failing))
    return found, degenerate
