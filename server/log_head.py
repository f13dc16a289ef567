"""Where a signed audit log ends: `events-head.json`, the last record's seq and hash signed with the run's key.

A log cut at a line boundary is a valid shorter chain whose every signature still holds; summary.json pins only
the record it was written after, so the calls, probes and compiles after it could be cut unseen (and, the compile
rate limit being rebuilt from the log on resume, its minute handed out again). After each append the log writes
its head atomically (server/audit.py), and `verify` holds the log's end to it. The head's signature is over a
digest of its own (`head_digest`), so no record's signature can stand in for a head naming an earlier record.

The head is written after the record, never before: a process killed between the two leaves a head one record
behind, which `verify` accepts when that last record is chained and signed (only the run's key makes one), and
reopening the log writes the head again. What that leaves: the one record a kill left unpinned can be cut unseen
until the run is resumed. A head written first, naming the record about to be appended, would lead the log after
a kill, and a cut of the last record looks exactly like that: every run's last record could be cut unseen.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import NamedTuple

from server import keys

HEAD_NAME = "events-head.json"
KEEPS_HEAD = "log_head"  # in the run's first record: the run keeps a head, so a missing one was removed
_DOMAIN = b"kernel-referee audit log head\0"
_HEX = frozenset("0123456789abcdef")


class Head(NamedTuple):
    seq: int
    hash: str
    sig: str


class LastRecord(NamedTuple):
    """What the head is held to: the log's last record's seq, hash and prev (the hash of the one before)."""
    seq: int
    hash: str
    prev: str


def head_digest(seq: int, record_hash: str) -> str:
    """What a head's signature signs: not a record's hash, so a record's signature is no head's."""
    return hashlib.sha256(_DOMAIN + seq.to_bytes(8, "big") + bytes.fromhex(record_hash)).hexdigest()


def head_bytes(seq: int, record_hash: str, signer) -> bytes:
    head = {"seq": seq, "hash": record_hash, "sig": signer.sign(head_digest(seq, record_hash))}
    return (json.dumps(head, sort_keys=True) + "\n").encode()


def read_head(run_dir: Path) -> tuple[Head | None, str | None]:
    """(the head, None), (None, None) where there is none, or (None, why it is no head)."""
    try:
        value = json.loads((Path(run_dir) / HEAD_NAME).read_bytes())
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as e:
        return None, f"{HEAD_NAME}: unreadable ({e})"
    ok = (isinstance(value, dict) and set(value) == {"seq", "hash", "sig"} and type(value["seq"]) is int
          and 0 <= value["seq"] < 1 << 64 and isinstance(value["hash"], str) and len(value["hash"]) == 64
          and set(value["hash"]) <= _HEX and isinstance(value["sig"], str))
    return (Head(**value), None) if ok else (None, f"{HEAD_NAME}: not a log head (rewritten)")


def head_holds(head: Head, public_hex: str) -> bool:
    return keys.public_checker(public_hex)(head_digest(head.seq, head.hash), head.sig)


def end_fault(head: Head, last: LastRecord, log_name: str) -> tuple[bool, str | None]:
    """(whether the head lags the log by one record, why the log's end is not the head's: None where it is)."""
    if head.seq == last.seq and head.hash == last.hash:
        return False, None
    if head.seq == last.seq - 1 and head.hash == last.prev:
        return True, None  # killed between the append and the head's write
    if head.seq > last.seq:
        missing = head.seq - last.seq
        return False, (f"{log_name} ends at record {last.seq}, but its signed head ({HEAD_NAME}) is record "
                       f"{head.seq}: {missing} record{'s' if missing > 1 else ''} missing from the end (cut)")
    if head.seq >= last.seq - 1:
        named = last.hash if head.seq == last.seq else last.prev
        return False, (f"{HEAD_NAME}: names record {head.seq} with hash {head.hash[:16]}..., but {log_name}'s "
                       f"record {head.seq} is {named[:16]}... (the log's end rewritten)")
    return False, (f"{log_name} holds {last.seq - head.seq} records after its signed head ({HEAD_NAME}, record "
                   f"{head.seq}); a head lags at most one record (a kill between an append and the head's write)")
