"""Reading the run folder's record files into server/records.py's models, and their JSON for writing.

Writing goes through the run (server/run.py's write_json), which records each write in the audit log;
these helpers only make the JSON values and read the files back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from server.records import AttemptRecord, EventRecord, HistoryFile, SummaryFile

HISTORY = "history.json"
SUMMARY = "summary.json"
EVENTS = "events.jsonl"


def read_history(run_dir: Path) -> HistoryFile:
    """history.json of a run folder (FileNotFoundError when it has none)."""
    return HistoryFile.model_validate(json.loads((Path(run_dir) / HISTORY).read_bytes()))


def read_summary(run_dir: Path) -> SummaryFile:
    """summary.json of a run folder (FileNotFoundError when it has none)."""
    return SummaryFile.model_validate(json.loads((Path(run_dir) / SUMMARY).read_bytes()))


def history_json(task: str, attempts: list[AttemptRecord]) -> dict:
    """What history.json holds: the task's name and every attempt, as written."""
    return HistoryFile(task=task, attempts=attempts).to_json()


def summary_json(summary: SummaryFile) -> dict:
    return summary.to_json()


def iter_events(run_dir: Path, *, skip_unreadable: bool = False) -> Iterator[EventRecord]:
    """The records of events.jsonl, in order. With skip_unreadable a line that is not a JSON object (a torn or
    edited one: `verify` reports those) is passed over; without, it raises ValueError."""
    text = (Path(run_dir) / EVENTS).read_text(encoding="utf-8", errors="replace" if skip_unreadable else "strict")
    for line in text.splitlines():
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
            yield EventRecord.model_validate(record)
        except ValueError:
            if not skip_unreadable:
                raise
