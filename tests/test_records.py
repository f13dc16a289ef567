"""server/records.py: run folders read and written back byte for byte, old folders tolerated."""

from __future__ import annotations

import json
import shutil

import pytest

from server.audit import json_safe
from server.record_files import iter_events, read_history, read_summary
from server.records import AttemptRecord, EventKind, HistoryFile, SummaryFile, Verdict
from tests.report_support import FIXTURE_RUNS

RUNS = sorted(p for p in FIXTURE_RUNS.glob("*") if (p / "history.json").is_file())


def _as_written(value: dict) -> bytes:
    """What server/audit.py's write_json_atomic writes for a JSON value."""
    return (json.dumps(json_safe(value), indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode()


@pytest.mark.parametrize("run_dir", RUNS, ids=lambda p: p.name)
def test_a_recorded_run_reads_and_writes_back_byte_for_byte(run_dir):
    assert _as_written(read_history(run_dir).to_json()) == (run_dir / "history.json").read_bytes()
    assert _as_written(read_summary(run_dir).to_json()) == (run_dir / "summary.json").read_bytes()
    kinds = [record.kind for record in iter_events(run_dir)]
    assert kinds and all(isinstance(kind, EventKind) for kind in kinds)


@pytest.mark.parametrize("run_dir", RUNS, ids=lambda p: p.name)
def test_records_are_typed(run_dir):
    history = read_history(run_dir)
    baseline = history.attempt(0)
    assert baseline.verdict is Verdict.BASELINE
    case = next(iter(baseline.timing))
    assert baseline.median_ms(case) == baseline.timing[case].stats.median_ms > 0
    assert read_summary(run_dir).best_number in {a.attempt for a in history.attempts}


def test_an_old_entry_without_optional_keys_reads_and_keeps_its_keys():
    old = {"attempt": 3, "candidate": "c1", "verdict": "valid-faster", "score_ms": 1, "timing": {"a": {"stats": {}}}}
    entry = AttemptRecord.model_validate(old)
    assert entry.rationale is None and entry.reasons == [] and entry.median_ms("a") is None
    assert entry.median_ms("missing") is None and not entry.has("rationale")
    assert entry.to_json() == old and list(entry.to_json()) == list(old)  # nothing added, an int stays an int


def test_unknown_keys_are_kept_where_they_were():
    data = {"attempt": 1, "from_the_future": {"x": [1, 2]}, "verdict": "rejected", "reasons": [
        {"code": "mismatch", "case": "a", "detail": "d", "note": "extra"}]}
    entry = AttemptRecord.model_validate(data)
    assert entry.rejected and entry.to_json() == data and list(entry.to_json()) == list(data)
    assert list(entry.to_json()["reasons"][0]) == ["code", "case", "detail", "note"]


def test_an_unknown_verdict_or_reason_code_is_kept_as_its_string_never_refused():
    entry = AttemptRecord.model_validate({"attempt": 2, "verdict": "suspicious",
                                          "reasons": [{"code": "new_code", "detail": ""}]})
    assert entry.verdict == "suspicious" and not isinstance(entry.verdict, Verdict)
    assert not entry.valid and not entry.rejected and entry.first_reason_code() == "new_code"
    assert entry.to_json()["verdict"] == "suspicious"


def test_keys_are_written_in_the_order_they_were_first_set_none_included():
    entry = AttemptRecord(attempt=1, candidate=None, source_file="attempts/001.cu", verdict=Verdict.REJECTED)
    entry.parent = 0
    entry.candidate = "c2"  # already set: keeps its place
    assert list(entry.to_json()) == ["attempt", "candidate", "source_file", "verdict", "parent"]
    assert entry.to_json()["verdict"] == "rejected"
    summary = SummaryFile()
    summary.update(chain_head="h", best_attempt=0, stop_reason=None)
    assert summary.to_json() == {"chain_head": "h", "best_attempt": 0, "stop_reason": None}


def test_history_file_keeps_its_attempts_in_order(tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(RUNS[0], run_dir)
    history = read_history(run_dir)
    again = HistoryFile.model_validate(history.to_json())
    assert [a.attempt for a in again.attempts] == [a.attempt for a in history.attempts]
