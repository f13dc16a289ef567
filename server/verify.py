"""Checking a run folder against its audit log (`kernel-referee verify`): the hash chain, the records'
signatures (server/verify_signed.py), every recorded file, lock.json's files, summary.json's chain head, the
log's end (against its signed head, server/log_head.py), and every file of the folder accounted for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from server.log_head import read_head
from server.record_files import SUMMARY, read_summary
from server.audit import (GENESIS, LOG_NAME, RECORD_FIELDS, SIGNED_FIELDS, canonical_json, inside_run, is_sha256,
                          record_hash, sha256_file)
from server.verify_signed import (derived_problems, end_problems, head_problems, signature_problems,
                                  unaccounted_files)


TORN = "torn (no trailing newline; reopening the log repairs it)"


class VerifyReport(BaseModel):
    ok: bool
    records: int
    head: str | None
    problems: list[str]
    first_broken_line: int | None
    fingerprint: str | None = None  # of the key that signed the log; None: unsigned (made before signing)
    end_pinned: bool = False  # a signed head names where the log ends; False: unsigned, or made before heads

    @property
    def signed(self) -> bool:
        return self.fingerprint is not None


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _parse_line(raw: bytes) -> tuple[dict | None, str | None]:
    """The record on one line, or why there is none."""
    try:
        record = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except ValueError:
        return None, "not JSON"
    if not isinstance(record, dict) or set(record) not in (RECORD_FIELDS, SIGNED_FIELDS):
        return None, "not an audit record (wrong fields)"
    types_ok = (isinstance(record["seq"], int) and not isinstance(record["seq"], bool)
                and isinstance(record["time"], str) and isinstance(record["kind"], str)
                and isinstance(record["data"], dict) and is_sha256(record["prev"])
                and is_sha256(record["hash"]) and isinstance(record.get("sig", ""), str))
    return (record, None) if types_ok else (None, "not an audit record (wrong field types)")


def _link_problem(n: int, record: dict, raw: bytes, before: dict | None) -> str | None:
    """What is wrong with line n's own contents or its link to line n-1 (None: line n-1 is unreadable)."""
    if record_hash(record) != record["hash"]:
        return "hash does not match its contents (record edited)"
    # Catches edits that parse to the same value, e.g. 1e+20 rewritten as 1e020.
    if canonical_json(record) != raw:
        return "not in canonical form (record edited)"
    if n == 1:
        if record["prev"] != GENESIS or record["seq"] != 0:
            return "does not start the chain (records removed before it)"
        return None
    if before is None:
        return None
    if record["prev"] != before["hash"]:
        return f"prev does not match line {n - 1}'s hash (record removed or reordered)"
    if record["seq"] != before["seq"] + 1:
        return f"seq is {record['seq']}, expected {before['seq'] + 1} (record removed or reordered)"
    return None


def _read_chain(path: Path) -> tuple[VerifyReport, list[tuple[int, dict]]]:
    """The chain's report and every record that parsed, with its 1-based line number."""
    name = path.name
    if not path.exists():
        return VerifyReport(ok=False, records=0, head=None, problems=[f"{name}: missing"],
                            first_broken_line=None), []
    raw = path.read_bytes()
    if not raw:
        return VerifyReport(ok=False, records=0, head=None, problems=[f"{name}: empty"],
                            first_broken_line=None), []
    lines = raw.split(b"\n")
    torn = lines.pop()
    problems: list[tuple[int, str]] = []
    parsed: list[tuple[int, dict]] = []
    before: dict | None = None
    for n, line in enumerate(lines, start=1):
        record, why = _parse_line(line)
        if record is not None:
            why = _link_problem(n, record, line, before)
            parsed.append((n, record))
        if why:
            problems.append((n, why))
        before = record
    if torn:
        problems.append((len(lines) + 1, TORN))
    head = parsed[-1][1]["hash"] if parsed and parsed[-1][0] == len(lines) else None
    return VerifyReport(ok=not problems, records=len(parsed), head=head,
                        problems=[f"{name} line {n}: {why}" for n, why in problems],
                        first_broken_line=problems[0][0] if problems else None), parsed


def verify_chain(path: Path, *, expected_head: str | None = None) -> VerifyReport:
    """Recompute every hash and link of the log at `path`.

    A log cut cleanly at a line boundary is a valid shorter chain; pass `expected_head` (a head
    kept elsewhere) to catch that too.
    """
    report, _ = _read_chain(Path(path))
    if expected_head is not None and report.head != expected_head:
        report.problems.append(f"{Path(path).name}: head is {report.head}, expected {expected_head} "
                               "(records removed from the end)")
        report.ok = False
    return report


def chain_break(path: Path) -> str | None:
    """The log's first broken record ("events.jsonl line 5: ..."), or None where the chain holds. A torn last
    line is no break: a server killed mid-write leaves one, and reopening the log sets it aside."""
    report, _ = _read_chain(Path(path))
    return next((p for p in report.problems if not p.endswith(TORN)), None)


def signature_break(run_dir: Path) -> str | None:
    """The first problem of the log's signatures against its key ("events.jsonl line 5: signature does not
    verify ..."), or None where they hold or the log was made before signing."""
    _, parsed = _read_chain(Path(run_dir) / LOG_NAME)
    lock, _ = _read_json(Path(run_dir) / "lock.json")
    _, problems = signature_problems(parsed, lock if isinstance(lock, dict) else None, None)
    return problems[0] if problems else None


def end_break(run_dir: Path) -> str | None:
    """Why the log's end is not the one its signed head names ("events.jsonl ends at record 9, but its signed head
    ... is record 12: 3 records missing from the end (cut)"), or None where it is, the head lags one record (a kill
    between an append and the head's write: reopening the log writes it again), or the log is unsigned."""
    _, parsed = _read_chain(Path(run_dir) / LOG_NAME)
    # The key the first record names; signature_break holds the records to it (not checked twice here).
    anchor = parsed[0][1]["data"].get("signing_key") if parsed and "sig" in parsed[0][1] else None
    if not isinstance(anchor, dict) or not isinstance(anchor.get("public_key"), str):
        return None
    _, problems = head_problems(Path(run_dir), parsed, anchor["public_key"])
    return problems[0] if problems else None


def _file_state(run_dir: Path, relative: str, sha256: str) -> str | None:
    """None when run_dir/relative holds exactly `sha256`, else "outside", "missing" or "differs"."""
    target = inside_run(run_dir, relative)
    if target is None:
        return "outside"
    if not target.is_file():
        return "missing"
    return None if sha256_file(target) == sha256 else "differs"


def _recorded_files(run_dir: Path, parsed: list[tuple[int, dict]]) -> tuple[list[str], set[str]]:
    """Problems of the files the log records (each against its last recorded write), and their paths."""
    last: dict[str, tuple[int, str]] = {}
    for n, record in parsed:
        data = record["data"]
        if isinstance(data.get("path"), str) and isinstance(data.get("sha256"), str):
            last[data["path"]] = (n, data["sha256"])
    says = {"outside": "path leaves the run folder", "missing": "missing",
            "differs": "sha256 differs from the last recorded write"}
    problems = []
    for relative, (n, sha256) in last.items():
        state = _file_state(run_dir, relative, sha256)
        if state:
            problems.append(f"{relative}: {says[state]} ({LOG_NAME} line {n})")
    return problems, set(last)


def _read_json(path: Path) -> tuple[Any, str | None]:
    try:
        return json.loads(path.read_bytes()), None
    except (OSError, ValueError) as e:
        return None, f"{path.name}: unreadable ({e})"


def _lock_problems(run_dir: Path) -> tuple[list[str], dict | None]:
    """Problems of lock.json's files, and lock.json itself (None: none, or unreadable)."""
    path = run_dir / "lock.json"
    if not path.exists():
        return [], None
    lock, why = _read_json(path)
    if why:
        return [why], None
    files = lock.get("files") if isinstance(lock, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        return ["lock.json: no 'files' mapping of path to sha256"], None
    says = {"outside": "path leaves the run folder (lock.json)", "missing": "missing (listed in lock.json)",
            "differs": "differs from lock.json"}
    states = ((relative, _file_state(run_dir, relative, sha256)) for relative, sha256 in files.items())
    return [f"{relative}: {says[state]}" for relative, state in states if state], lock


def _summary_problems(run_dir: Path, hashes: set[str]) -> tuple[list[str], Any]:
    """Problems of summary.json's chain_head, and summary.json (None: none, or unreadable)."""
    path = run_dir / SUMMARY
    if not path.exists():
        return [], None
    try:
        summary = read_summary(run_dir)
    except (OSError, ValueError) as e:
        return [f"{path.name}: unreadable ({e})"], None
    if summary.has("chain_head") and summary.chain_head not in hashes:
        return [f"summary.json: chain_head {summary.chain_head} is not a record of {LOG_NAME}"], summary
    return [], summary


def verify_run(run_dir: Path, *, public_key: str | None = None, derived: bool = True) -> VerifyReport:
    """The chain and its signatures (against `public_key`, a fingerprint held outside, where given), every
    recorded file, lock.json's files, summary.json's chain_head, the log's end, and no file unaccounted for.
    `derived` False leaves the report files out (`kernel-referee report`, which writes them again, checks the rest).
    A log made before signing is checked as it was then: ok, with no fingerprint."""
    run_dir = Path(run_dir)
    # The head before the log: a record appended meanwhile (a read-only call is logged without the run's mutex)
    # then leaves the head one behind, which holds, rather than one past the log read, which is a cut.
    head = read_head(run_dir)
    report, parsed = _read_chain(run_dir / LOG_NAME)
    problems = list(report.problems)
    recorded_problems, recorded = _recorded_files(run_dir, parsed)
    lock_problems, lock = _lock_problems(run_dir)
    summary_problems, summary = _summary_problems(run_dir, {record["hash"] for _, record in parsed})
    fingerprint, signing_problems = signature_problems(parsed, lock, public_key)
    problems += signing_problems + recorded_problems + lock_problems + summary_problems
    problems += end_problems(parsed, summary)
    pinned = False
    if fingerprint is not None:  # a run made before signing has no head and did not list its report files
        public_hex = parsed[0][1]["data"]["signing_key"]["public_key"]
        pinned, end = head_problems(run_dir, parsed, public_hex, head)
        problems += end
        anchor = lock.get("signing_key") if lock is not None else None
        problems += derived_problems(run_dir, anchor["public_key"]) if derived and isinstance(anchor, dict) else []
    problems += unaccounted_files(run_dir, recorded | (set(lock["files"]) if lock is not None else set()))
    return report.model_copy(update={"ok": not problems, "problems": problems, "fingerprint": fingerprint,
                                      "end_pinned": pinned})
