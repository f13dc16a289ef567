"""What `kernel-referee lint` finds in a task: one line each, an error (the task is refused) or a warning."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Finding:
    """One problem of a task, said in one line. `check` names the rule (docs/task-format.md, "Lint")."""

    severity: Severity
    check: str
    message: str

    def line(self) -> str:
        return f"{self.severity}: {self.check}: {self.message}"


def error(check: str, message: str) -> Finding:
    return Finding("error", check, message)


def warning(check: str, message: str) -> Finding:
    return Finding("warning", check, message)


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "error"]
