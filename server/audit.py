"""The audit store of one run folder: atomic file writes and a hash-chained event log.

`events.jsonl` holds one canonical JSON record per line; each record carries the hash of the one
before it, so editing, removing or reordering a record breaks the chain at that line. A run's log is
also signed (server/keys.py): each record's `sig` is the run key's Ed25519 signature of its hash, so a
chain recomputed after an edit no longer verifies without the private key, and after each append the log
writes its signed head, `events-head.json` (server/log_head.py), so that records cut from its end are seen. Files the
run writes are recorded with their sha256; server/verify.py checks them, `lock.json` and
`summary.json` against the log.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import logging
import os
import secrets
import threading
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any

from server.log_head import HEAD_NAME, KEEPS_HEAD, LastRecord, end_fault, head_bytes, head_holds, read_head
from server.records import EventKind

log = logging.getLogger(__name__)

GENESIS = "0" * 64
LOG_NAME = "events.jsonl"
RECORD_FIELDS = frozenset({"seq", "time", "kind", "data", "prev", "hash"})
SIGNED_FIELDS = RECORD_FIELDS | {"sig"}  # a signed log's records; logs made before signing have none
_HEX = frozenset("0123456789abcdef")


class AuditError(Exception):
    """The audit log or a recorded file does not match what was written."""


# -- hashing and atomic writes ----------------------------------------------------------------

def canonical_json(value: Any) -> bytes:
    """The one byte form of a JSON value that hashes are computed over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode()


def json_safe(value: Any) -> Any:
    """Non-finite floats as the strings "NaN", "Infinity", "-Infinity": strict JSON can hold them.

    Kernel outputs (and so mismatch reports) legitimately contain NaN and Inf.
    """
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def is_sha256(text: object) -> bool:
    return isinstance(text, str) and len(text) == 64 and set(text) <= _HEX


def _write_all(fd: int, data: bytes) -> None:
    # A regular file may accept fewer bytes than asked (disk nearly full); the next write raises.
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_atomic(path: Path, data: bytes) -> str:
    """Replace `path` with `data` so that a crash or a full disk leaves the old file or the new one.

    Returns the sha256 of `data`. On failure the temporary file is removed and the error raised.
    """
    path = Path(path)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    # os.open rather than mkstemp: mkstemp's 0600 mode would outlive the rename.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            log.warning("could not remove temporary file %s", tmp)
        raise
    # Without this the rename itself may be lost in a crash.
    _fsync_dir(path.parent)
    return hashlib.sha256(data).hexdigest()


def write_json_atomic(path: Path, value: Any, *, indent: int | None = 2) -> str:
    """`write_bytes_atomic` of `value` as strict JSON (non-finite floats as strings), newline-ended."""
    text = json.dumps(json_safe(value), indent=indent, ensure_ascii=False, allow_nan=False) + "\n"
    return write_bytes_atomic(path, text.encode())


# -- the log ----------------------------------------------------------------------------------

def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def record_hash(record: dict) -> str:
    """The sha256 of the record without its hash and signature (the signature is of this hash)."""
    return hashlib.sha256(canonical_json({k: v for k, v in record.items() if k not in ("hash", "sig")})).hexdigest()


def _split_tail(f, size: int) -> tuple[bytes | None, bytes]:
    """The last complete line of a file (without its newline) and any torn bytes after it."""
    buf, pos = b"", size
    while pos > 0:
        step = min(1 << 16, pos)
        pos -= step
        f.seek(pos)
        buf = f.read(step) + buf
        last = buf.rfind(b"\n")
        if last != -1 and (pos == 0 or buf.rfind(b"\n", 0, last) != -1):
            break
    last = buf.rfind(b"\n")
    if last == -1:
        return None, buf
    return buf[buf.rfind(b"\n", 0, last) + 1:last], buf[last + 1:]


def inside_run(run_dir: Path, relative: str) -> Path | None:
    """run_dir/relative, or None when `relative` would leave the run folder."""
    pure = PurePosixPath(relative)
    if not relative or pure.is_absolute() or ".." in pure.parts:
        return None
    return run_dir / pure



class AuditLog:
    """events.jsonl: one JSON object per line, each holding the hash of the previous one and, where the log
    has a `signer` (the run's key, server/keys.py), the signature of its own hash; a signed log's end is
    `events-head.json` (server/log_head.py), written after each append and checked, and repaired where a kill
    left it one record behind, when the log is opened."""

    def __init__(self, path: Path, signer: Any = None):
        self.path = Path(path)
        self.signer = signer
        self.run_dir = self.path.parent
        self._lock = threading.Lock()
        self._broken: str | None = None
        self._seq, self._head = -1, GENESIS
        self._signed = False  # whether the log's last record is signed: then every new one must be
        self._prev = GENESIS  # the last record's prev
        self._head_behind = False  # the head names the record before the last (its write failed): written first
        created = not self.path.exists()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            if created:
                _fsync_dir(self.run_dir)
            torn = self._load_tail()
            if signer is not None:
                self._check_head()
            if torn:
                self._repair(torn)
        except BaseException:
            os.close(self._fd)
            raise

    def _load_tail(self) -> bytes:
        """Learn the last seq and hash; returns the bytes of a torn last line, if any."""
        with open(self.path, "rb") as f:
            line, torn = _split_tail(f, os.fstat(f.fileno()).st_size)
        if line is None:
            return torn
        try:
            last = json.loads(line)
            seq, head = last["seq"], last["hash"]
        except (ValueError, TypeError, KeyError) as e:
            raise AuditError(f"{self.path.name}: the last record is unreadable ({e})") from e
        if not isinstance(seq, int) or isinstance(seq, bool) or not is_sha256(head):
            raise AuditError(f"{self.path.name}: the last record has no valid seq and hash")
        self._seq, self._head = seq, head
        self._prev = last["prev"] if is_sha256(last.get("prev")) else GENESIS
        self._signed = "sig" in last
        return torn

    def _check_head(self) -> None:
        """The log's end against its signed head: a cut or a rewritten head is refused, a head a kill left one
        record behind is written again; a signed log made before heads were kept gets one."""
        head, why = read_head(self.run_dir)
        if why:
            raise AuditError(why)
        if head is None:
            if self._seq > 0 and KEEPS_HEAD in self._first_record().get("data", {}):
                raise AuditError(f"{HEAD_NAME} is missing, though the run's first record says it keeps one "
                                 "(removed: the log's end is not pinned)")
            if self._seq >= 0:
                self._write_head()
            return
        if not head_holds(head, self.signer.public_hex):
            raise AuditError(f"{HEAD_NAME}: its signature does not verify (written without the run's key)")
        behind, fault = end_fault(head, LastRecord(self._seq, self._head, self._prev), self.path.name)
        if fault:
            raise AuditError(fault)
        if behind:
            log.warning("%s: its head was one record behind (a kill between an append and the head's write); "
                        "written again", self.path)
            self._write_head()

    def _first_record(self) -> dict:
        with open(self.path, "rb") as f:
            try:
                first = json.loads(f.readline())
            except ValueError:
                return {}
        return first if isinstance(first, dict) else {}

    def _write_head(self) -> None:
        """Write the head for the last record, atomically; until it is written, `_head_behind` holds."""
        self._head_behind = True
        write_bytes_atomic(self.path.with_name(HEAD_NAME), head_bytes(self._seq, self._head, self.signer))
        self._head_behind = False

    def _repair(self, torn: bytes) -> None:
        """Set a torn last line aside, cut it off, and say so in the log."""
        n = 1
        while self.path.with_name(f"{self.path.name}.torn-{n}").exists():
            n += 1
        aside = self.path.with_name(f"{self.path.name}.torn-{n}")
        # Saved before the cut, so a crash in between loses nothing; reopening repeats the repair.
        digest = write_bytes_atomic(aside, torn)
        os.ftruncate(self._fd, os.fstat(self._fd).st_size - len(torn))
        os.fsync(self._fd)
        log.warning("%s: torn last line (%d bytes) moved to %s", self.path, len(torn), aside.name)
        self.append(EventKind.LOG_REPAIRED, {"path": aside.name, "sha256": digest, "bytes": len(torn)})

    def append(self, kind: EventKind, data: dict) -> dict:
        """Append one record, durably, then the signed head naming it; on failure the log is left as it was and
        the error raised. A head that cannot be written after its record is left one behind (which verify
        accepts) and written before the next record, whose append fails, log unchanged, if it cannot.

        `kind` is written as its string: the log's own tests append kinds of their own."""
        with self._lock:
            if self._fd < 0:
                raise AuditError(f"{self.path.name} is closed")
            if self._broken:
                raise AuditError(f"{self.path.name} is in an unknown state ({self._broken}); reopen it")
            if self._signed and self.signer is None:
                raise AuditError(f"{self.path.name} is signed: a record added without the run's key would not "
                                 "verify")
            if self._head_behind:
                self._write_head()  # never two records past the head
            # A normalized copy: what is returned is exactly what reading the line back gives.
            record = {"seq": self._seq + 1, "time": _now(), "kind": str(kind),
                      "data": json.loads(canonical_json(json_safe(data))), "prev": self._head}
            record["hash"] = record_hash(record)
            if self.signer is not None:
                record["sig"] = self.signer.sign(record["hash"])
            self._write_line(canonical_json(record) + b"\n")
            self._seq, self._head, self._prev = record["seq"], record["hash"], record["prev"]
            self._signed = "sig" in record
            if self.signer is not None:
                try:
                    self._write_head()
                except OSError as e:  # the record is in the log: the head lags it by one until the next append
                    log.error("%s: its head could not be written: %s", self.path, e)
            return record

    def _write_line(self, line: bytes) -> None:
        size = os.fstat(self._fd).st_size
        try:
            # One write on an O_APPEND fd: a crash leaves a prefix of the line, never a mix.
            written = os.write(self._fd, line)
            if written != len(line):
                raise OSError(errno.EIO, f"short write to {self.path.name} ({written} of {len(line)} bytes)")
            os.fsync(self._fd)
        except BaseException as e:
            try:
                os.ftruncate(self._fd, size)
            except OSError as cut:
                self._broken = f"could not undo a failed append: {cut}"
            log.error("%s: append failed: %s", self.path, e)
            raise

    def record_file(self, path: Path, sha256: str, *, kind: EventKind = EventKind.FILE_WRITTEN) -> dict:
        """Record that the run wrote `path` (absolute, or relative to the run folder) with this hash."""
        if not is_sha256(sha256):
            raise ValueError(f"not a sha256 hex digest: {sha256!r}")
        path = Path(path)
        if path.is_absolute():
            path = path.resolve().relative_to(self.run_dir.resolve())
        if inside_run(self.run_dir, path.as_posix()) is None:
            raise ValueError(f"{path} is not inside the run folder")
        return self.append(kind, {"path": path.as_posix(), "sha256": sha256})

    @property
    def head(self) -> str:
        """Hash of the last record; GENESIS while the log is empty."""
        return self._head

    @property
    def count(self) -> int:
        return self._seq + 1

    def moved_to(self, run_dir: Path) -> None:
        """Its folder was renamed (a new run moved into place, server/lifecycle.py): the open file moved with it."""
        with self._lock:
            self.run_dir = Path(run_dir)
            self.path = self.run_dir / self.path.name

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
