"""What `verify` checks beyond the hash chain: the records' signatures against the run's key, the log's end
against summary.json and the run's finish, and every file of the run folder against what the log accounts for.

A hash chain alone can be recomputed by anyone who edits a record; the signatures cannot without the run's
private key (server/keys.py). A log cut at a line boundary is a valid shorter chain; summary.json names the
record it was written after (chain_seq, chain_head) and a finished run's log holds its finish, so a cut before
either is refused; the log's signed head (events-head.json, server/log_head.py) names its last record, so a cut
of any record it pins is refused too. The derived files are held to derived.json (server/signed_log.py).
"""

from __future__ import annotations

import re
from pathlib import Path

from server import keys
from server.audit import LOG_NAME
from server.folder_lock import LOCK_NAME
from server.log_head import HEAD_NAME, KEEPS_HEAD, Head, LastRecord, end_fault, head_holds, read_head
from server.records import EventKind
from server.signed_log import MANIFEST, derived_difference, is_derived

Parsed = list[tuple[int, dict]]
# A write_bytes_atomic temporary left by a process killed mid-write: nothing reads it.
_ATOMIC_TEMP = re.compile(r"^\.[^/]+\.[0-9a-f]{12}\.tmp$")
_CLAIM = re.compile(r"^attempts/[0-9]{3}\.claim$")  # removed when the run is resumed (server/attempt.py)


def _anchor_of(record: dict) -> dict | None:
    anchor = record["data"].get("signing_key") if record.get("kind") == EventKind.RUN_CREATED else None
    return anchor if isinstance(anchor, dict) else None


def _anchor_problems(anchor: dict | None, lock: dict | None, expected: str | None) -> list[str]:
    if anchor is None or not isinstance(anchor.get("public_key"), str):
        return [f"{LOG_NAME} line 1: signed records but no signing key in the run's first record"]
    try:
        fingerprint = keys.fingerprint_of(anchor["public_key"])
    except ValueError:
        return [f"{LOG_NAME} line 1: the signing key is not hex"]
    problems = []
    if anchor.get("fingerprint") != fingerprint:
        problems.append(f"{LOG_NAME} line 1: the key's fingerprint is not its public key's")
    if lock is not None and lock.get("signing_key") != anchor:
        problems.append("lock.json: its signing key is not the one the log's first record names")
    if expected is not None and expected.lower() not in (fingerprint, anchor["public_key"]):
        problems.append(f"signing key {fingerprint} is not the expected {expected} (the log was signed by "
                        "another key: made again, or another run)")
    return problems


def signature_problems(parsed: Parsed, lock: dict | None, expected: str | None) -> tuple[str | None, list[str]]:
    """(the signing key's fingerprint, problems); (None, ...) for a log made before signing."""
    signed = [n for n, record in parsed if "sig" in record]
    lock_anchor = lock.get("signing_key") if isinstance(lock, dict) else None
    if not signed:
        problems = []
        if lock_anchor is not None or (parsed and _anchor_of(parsed[0][1]) is not None):
            problems.append(f"{LOG_NAME}: no record is signed, yet the run has a signing key (signatures removed)")
        if expected is not None:
            problems.append(f"{LOG_NAME}: unsigned (made before signing): nothing to check against {expected}")
        return None, problems
    first = parsed[0][1] if parsed and parsed[0][0] == 1 else None
    anchor = _anchor_of(first) if first is not None else None
    problems = _anchor_problems(anchor, lock if isinstance(lock, dict) else None, expected)
    if problems and anchor is None:
        return None, problems
    holds = keys.public_checker(anchor["public_key"])
    for n, record in parsed:
        if "sig" not in record:
            problems.append(f"{LOG_NAME} line {n}: unsigned record in a signed log (added without the key)")
        elif not holds(record["hash"], record["sig"]):
            problems.append(f"{LOG_NAME} line {n}: signature does not verify (record rewritten or chain recomputed)")
    return anchor["fingerprint"], problems


def end_problems(parsed: Parsed, summary) -> list[str]:
    """The log's end against summary.json (the record it names) and against the run's finish."""
    by_seq = {record["seq"]: record for _, record in parsed}
    problems = []
    if summary is not None and summary.has("chain_seq") and summary.chain_seq is not None:
        named = by_seq.get(summary.chain_seq)
        if named is None or named["hash"] != summary.chain_head:
            problems.append(f"summary.json: names record {summary.chain_seq} ({summary.chain_head}), which "
                            f"{LOG_NAME} does not hold (records removed from the end)")
    finishes = [n for n, record in parsed if record["kind"] == EventKind.FINISHED]
    says_finished = summary is not None and summary.has("status") and summary.status == "finished"
    if says_finished and not finishes:
        problems.append(f"{LOG_NAME}: summary.json says the run finished, but the log holds no finish "
                        "(records removed from the end)")
    if finishes and summary is not None and not says_finished:
        problems.append(f"summary.json: the log holds the run's finish, but summary.json says {summary.status!r}")
    return problems


def head_problems(run_dir: Path, parsed: Parsed, public_hex: str,
                  read: tuple[Head | None, str | None] | None = None) -> tuple[bool, list[str]]:
    """(whether the log's end is pinned by a signed head, the problems of its end against that head). A signed run
    made before heads were kept has none (False, no problem); one whose first record says it keeps one must.
    `read`: the head as read before the log was (read_head), where appends may go on meanwhile."""
    if not parsed:
        return False, []
    head, why = read if read is not None else read_head(run_dir)
    if why:
        return True, [why]
    first, last = parsed[0][1], parsed[-1][1]
    if head is None:
        if KEEPS_HEAD not in first["data"]:
            return False, []
        if last["seq"] == 0:  # killed between the run's first record and its first head
            return True, []
        return True, [f"{HEAD_NAME}: missing, though the run's first record says it keeps one (removed: where the "
                      f"log ends is unknown, {LOG_NAME} holds records 0 to {last['seq']})"]
    if not head_holds(head, public_hex):
        return True, [f"{HEAD_NAME}: its signature does not verify (written without the run's key)"]
    _, fault = end_fault(head, LastRecord(last["seq"], last["hash"], last["prev"]), LOG_NAME)
    return True, [fault] if fault else []


def derived_problems(run_dir: Path, public_hex: str) -> list[str]:
    """The derived files (report, heatmaps, replays) against derived.json, whose signature must be the run key's."""
    difference = derived_difference(run_dir, public_hex)
    if not difference.listed:
        return [f"{name}: not listed in a signed {MANIFEST} (none there)" for name in difference.unlisted]
    if not difference.signed:
        return [f"{MANIFEST}: its signature does not verify (the list of report files was rewritten)"]
    return ([f"{name}: removed (listed in {MANIFEST})" for name in difference.removed]
            + [f"{name}: sha256 differs from {MANIFEST}" for name in difference.differing]
            + [f"{name}: not listed in {MANIFEST}" for name in difference.unlisted])


def unaccounted_files(run_dir: Path, accounted: set[str]) -> list[str]:
    """Files of the run folder that no record, no lock entry and no rule accounts for (an added file)."""
    allowed = accounted | {LOG_NAME, HEAD_NAME, LOCK_NAME, keys.KEY_FILE, MANIFEST}
    problems = []
    for path in sorted(Path(run_dir).rglob("*")):
        if path.is_dir() and not path.is_symlink():
            continue
        relative = path.relative_to(run_dir).as_posix()
        # Derived files are held to their own record (derived_problems).
        if relative in allowed or _CLAIM.match(relative) or _ATOMIC_TEMP.match(path.name) or is_derived(relative):
            continue
        problems.append(f"{relative}: added (no record of the log, nor lock.json, accounts for it)")
    return problems
