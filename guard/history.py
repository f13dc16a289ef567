"""An approval's history: one typed record per guard run, appended to STORE/history/NAME.jsonl, and the
compact diff each run shows against the last accepted one.

A record holds when the run was made, the environment's fingerprint, whether the run was accepted (the
approval's own measurement, or a run made the new baseline with --accept), and per case the verdict, the
ratio to the baseline and its change since the accepted ratio (each with its interval) and the latency.
History is not part of the signed approval: it is the team's log, kept in git beside it; a line that does
not parse is reported, never silently skipped.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from guard.fingerprint import Fingerprint
from guard.store import history_path
from guard.verdict import CaseVerdict, Interval, describe

SCHEMA_VERSION = 1


class HistoryError(Exception):
    """A history file holds a line that is not a history record."""


class CaseEntry(BaseModel):
    """One case of one guard run, as history keeps it."""

    model_config = ConfigDict(frozen=True)

    case: str
    verdict: str
    reason: str | None = None
    threshold: float
    change: Interval | None = None
    ratio: Interval | None = None
    latency_ms: float | None = None
    latency_change: Interval | None = None
    rounds: int = 0
    # per kernel ("baseline", "candidate"): the rounds whose yardstick timing was taken past its launches' shape
    shape_waived: dict[str, int] = {}

    @classmethod
    def of(cls, verdict: CaseVerdict, waived: dict[str, dict[str, list[str]]] | None = None) -> CaseEntry:
        taken = {label: len(per_case[verdict.case]) for label, per_case in (waived or {}).items()
                 if per_case.get(verdict.case)}
        return cls(case=verdict.case, verdict=verdict.verdict.value,
                   reason=verdict.reason.value if verdict.reason else None, threshold=verdict.threshold,
                   change=verdict.change, ratio=verdict.ratio, latency_ms=verdict.latency_ms,
                   latency_change=verdict.latency_change, rounds=verdict.rounds, shape_waived=taken)


class HistoryRecord(BaseModel):
    """One guard run of one approval."""

    model_config = ConfigDict(frozen=True)

    schema_version: int = SCHEMA_VERSION
    time: str  # ISO 8601, UTC
    approval: str
    fingerprint: Fingerprint
    environment_changes: list[str] = []  # against the approval's fingerprint
    accepted: bool = False  # this run's ratios are the baseline later runs are held to
    exit_status: int | None = None
    cases: list[CaseEntry]

    def case(self, name: str) -> CaseEntry | None:
        return next((c for c in self.cases if c.case == name), None)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def record_of(approval: str, verdicts: list[CaseVerdict], fingerprint: Fingerprint, *, accepted: bool = False,
              exit_status: int | None = None, time: str | None = None,
              shape_waived: dict[str, dict[str, list[str]]] | None = None) -> HistoryRecord:
    """`shape_waived`: per kernel and case, the reasons of the yardstick timings taken past their shape."""
    changes = sorted({c for v in verdicts for c in v.environment_changes})
    return HistoryRecord(time=time or now_iso(), approval=approval, fingerprint=fingerprint,
                         environment_changes=changes, accepted=accepted, exit_status=exit_status,
                         cases=[CaseEntry.of(v, shape_waived) for v in verdicts])


def append(store: Path, record: HistoryRecord) -> Path:
    """Append one line and flush it to disk: a run that ends (or dies) after this call is on record."""
    path = history_path(store, record.approval)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = record.model_dump_json() + "\n"
    with open(path, "a", encoding="utf-8") as out:
        out.write(line)
        out.flush()
        os.fsync(out.fileno())
    return path


def read(store: Path, approval: str) -> list[HistoryRecord]:
    """Every record, oldest first; an empty list where the approval has no history yet."""
    path = history_path(store, approval)
    if not path.exists():
        return []
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(HistoryRecord.model_validate(json.loads(line)))
        except (json.JSONDecodeError, ValidationError) as error:
            raise HistoryError(f"{path}:{number}: not a history record ({str(error).splitlines()[0]})") from error
    return records


class DiffLine(BaseModel):
    """One case's change since the last accepted run."""

    model_config = ConfigDict(frozen=True)

    approval: str
    case: str
    verdict: str
    change: Interval | None
    threshold: float
    since: str  # the accepted run's time, or "approval" when no guard run has been accepted since
    previous: Interval | None = None  # the same case's change at the previous guard run
    environment_changes: list[str] = []
    text: str


def last_accepted(records: list[HistoryRecord]) -> HistoryRecord | None:
    return next((r for r in reversed(records) if r.accepted), None)


def compact_diff(approval: str, verdicts: list[CaseVerdict], earlier: list[HistoryRecord]) -> list[DiffLine]:
    """Per case, this run's change since the last accepted run (the approval's ratio, or the ratio a run made
    the baseline with --accept: the verdict's `change` is against it), and the previous run's beside it."""
    accepted = last_accepted(earlier)
    since = accepted.time if accepted else "approval"
    previous_run = earlier[-1] if earlier else None
    lines = []
    for v in verdicts:
        before = previous_run.case(v.case) if previous_run else None
        if v.change is None:  # incorrect, or too few rounds: the verdict's own words say why
            text = f"{v.case}: {v.message}"
        else:
            text = f"{v.case}: {v.verdict.value}, {describe(v.change, v.threshold)} since {since}"
        if before is not None and before.change is not None:
            text += f"; previous run {(before.change.estimate - 1.0) * 100.0:+.1f}%"
        if v.reason is not None:
            text += f"; reason: {v.reason.value}"
        if v.environment_changes:
            text += "; environment: " + ", ".join(v.environment_changes)
        lines.append(DiffLine(approval=approval, case=v.case, verdict=v.verdict.value, change=v.change,
                              threshold=v.threshold, since=since, previous=before.change if before else None,
                              environment_changes=v.environment_changes, text=text))
    return lines
