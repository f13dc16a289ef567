"""A guard run's results in the forms CI reads: the typed report and its JSON file, and GitHub Actions
annotations on stdout (JUnit XML: guard/outputs_junit.py; the HTML page: guard/outputs_html.py).

Every form is made from one `GuardReport`, so they cannot disagree.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from pydantic import BaseModel, ConfigDict

from guard.fingerprint import Fingerprint
from guard.history import DiffLine
from guard.verdict import CaseVerdict, Verdict, exit_status
from harness.gpu_lease import LeaseWait


class ApprovalResult(BaseModel):
    """One approval's guard step: its verdicts, its compact diff and where it ran."""

    model_config = ConfigDict(frozen=True)

    approval: str
    verdicts: list[CaseVerdict]
    diff: list[DiffLine] = []
    environment_changes: list[str] = []  # against the approval's fingerprint
    fingerprint: Fingerprint | None = None  # the machine the step ran on
    node: str | None = None  # the fleet's node, when fanned out
    seconds: float | None = None
    lease_waits: list[LeaseWait] = []  # the step's waits for the GPU's lease, naming who held it
    # per kernel and case, the shape reasons of the yardstick timings taken as measured (one per round)
    shape_waived: dict[str, dict[str, list[str]]] = {}
    trend_svg: str | None = None  # the trend picture's files, relative to the report's folder
    trend_png: str | None = None


class GuardReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    time: str
    store: str
    results: list[ApprovalResult]

    @property
    def verdicts(self) -> list[CaseVerdict]:
        return [v for r in self.results for v in r.verdicts]

    @property
    def exit_status(self) -> int:
        return exit_status(self.verdicts)

    def counts(self) -> dict[str, int]:
        found = {kind.value: 0 for kind in Verdict}
        for v in self.verdicts:
            found[v.verdict.value] += 1
        return found


def diff_text(result: ApprovalResult, verdict: CaseVerdict) -> str:
    """The case's compact diff line, or the verdict's own message where the diff was not made."""
    line = next((d for d in result.diff if d.case == verdict.case), None)
    return line.text if line else f"{verdict.case}: {verdict.message}"


def write_json(report: GuardReport, path: Path) -> Path:
    document = report.model_dump(mode="json")
    document["exit_status"] = report.exit_status
    document["counts"] = report.counts()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


# GitHub's workflow commands: a message escapes %, CR and LF; a property also : and , (actions/toolkit).
def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


ANNOTATION = {Verdict.REGRESSED: "error", Verdict.INCORRECT: "error", Verdict.INCONCLUSIVE: "warning"}


def annotations(report: GuardReport) -> list[str]:
    """One ::error line per regressed or incorrect case, one ::warning per inconclusive one."""
    lines = []
    for result in report.results:
        for verdict in result.verdicts:
            level = ANNOTATION.get(verdict.verdict)
            if level is None:
                continue
            title = f"guard {verdict.verdict.value}: {result.approval} / {verdict.case}"
            lines.append(f"::{level} title={_escape_property(title)}::{_escape_data(diff_text(result, verdict))}")
    return lines


def print_annotations(report: GuardReport, out: TextIO, environ: Mapping[str, str] | None = None) -> int:
    """Write the annotations when running under GitHub Actions (GITHUB_ACTIONS=true); the count written."""
    environ = os.environ if environ is None else environ
    if environ.get("GITHUB_ACTIONS", "").lower() != "true":
        return 0
    lines = annotations(report)
    for line in lines:
        out.write(line + "\n")
    return len(lines)
