"""What the run's resources show beyond a file as it is: the audit log in pages, and the history without its
raw timing samples (history.json keeps up to 400 a case, more than an agent reads at once)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from server.record_files import EVENTS, HISTORY

EVENTS_URI = "referee://events.jsonl"
HISTORY_URI = "referee://history.json"
EVENTS_PER_PAGE = 200
MAX_PAGE_BYTES = 256 * 1024


class NoSuchPage(ValueError):
    """A cursor that names no record of the log."""


def events_page(run_dir: Path, cursor: str | None) -> dict[str, Any]:
    """Records `cursor`, `cursor`+1, ... of events.jsonl (a cursor is a record's line number, from 0), at most
    EVENTS_PER_PAGE of them or MAX_PAGE_BYTES, each as written; `next` is the URI of the following page, or None
    at the end. A last line still being written (no newline yet) is left for a later read."""
    try:
        start = int(cursor or 0)
    except ValueError:
        raise NoSuchPage(f"the cursor is a record's line number (0, 200, ...), not {cursor[:40]!r}") from None
    data = (Path(run_dir) / EVENTS).read_bytes()
    lines = data.split(b"\n")[:-1]  # what follows the last newline is not a whole record yet
    if not 0 <= start <= len(lines):
        raise NoSuchPage(f"cursor {start} is past the log's {len(lines)} records")
    page, size = [], 0
    for line in lines[start:start + EVENTS_PER_PAGE]:
        if page and size + len(line) > MAX_PAGE_BYTES:
            break
        page.append(line.decode("utf-8", errors="replace"))
        size += len(line)
    end = start + len(page)
    return {"from": start, "count": len(page), "total": len(lines),
            "next": f"{EVENTS_URI}?cursor={end}" if end < len(lines) else None,
            "records": page,
            "note": "each record as written (a line of events.jsonl); `kernel-referee verify RUN` checks the chain"}


def compact_history(run_dir: Path) -> dict[str, Any]:
    """history.json without the raw timing samples and compiler logs, and the validation as pass/fail per case;
    `full` names the resource that has everything."""
    history = json.loads((Path(run_dir) / HISTORY).read_text())
    return {"full": HISTORY_URI, "task": history.get("task"),
            "attempts": [_compact_attempt(a) for a in history.get("attempts", [])]}


def _compact_attempt(attempt: dict) -> dict:
    compact = _without_samples(attempt)
    if isinstance(compact.get("compile"), dict):
        compact["compile"] = {k: v for k, v in compact["compile"].items() if k not in ("log", "mix")}
    if isinstance(compact.get("validation"), dict):
        compact["validation"] = {part: _passed(result) for part, result in compact["validation"].items()}
    return compact


def _without_samples(value: Any) -> Any:
    """`value` without any list of samples (`samples_ms`, `event_samples_ms`), wherever it sits."""
    if isinstance(value, dict):
        return {k: _without_samples(v) for k, v in value.items() if not k.endswith("samples_ms")}
    if isinstance(value, list):
        return [_without_samples(v) for v in value]
    return value


def _passed(result: Any) -> Any:
    if not isinstance(result, dict):
        return result
    cases = result.get("cases")
    per_case = {c.get("case"): c.get("passed") for c in cases if isinstance(c, dict)} if isinstance(cases, list) else None
    return {"passed": result.get("passed"), **({"cases": per_case} if per_case is not None else {})}
