"""What signing the audit log costs, per record, on a CPU: Ed25519 over the record's canonical bytes against
Ed25519 over its 32-byte hash (the head at that record: it covers the record and, through prev, every one
before, so either signature pins the whole chain). Signing and checking, for a small record (a tool call)
and a large one (an attempt's record with per-case detail), next to the sha256 and fsync the log already
pays per record. server/audit.py signs the hash: the numbers below are why. Then what pinning the log's end
costs per append (server/log_head.py): a whole signed append (record, its fsync) without the head and with it
(its own signature, an atomic write: a temporary file fsynced, renamed, the folder fsynced), and, for comparison,
the head overwritten in place with a single fsync (no rename: not atomic against a power loss).

    python bench/log_signing.py [--records 2000] [--appends 300] [--dir FOLDER] [--json OUT]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from server import keys  # noqa: E402
from server.audit import AuditLog, canonical_json  # noqa: E402
from server.log_head import head_bytes  # noqa: E402

SMALL = {"tool": "describe_task", "arguments": {}}
LARGE = {"attempt": 3, "cases": [{"name": f"case-{i}", "median_ms": 0.1234 + i, "samples_ms": [0.12 + j * 1e-4
                                                                                               for j in range(200)]}
                                 for i in range(8)]}


def _per_record_us(action, items: list) -> float:
    """The median over five passes of the mean time of `action` on each item, in microseconds."""
    passes = []
    for _ in range(5):
        start = time.perf_counter()
        for item in items:
            action(item)
        passes.append((time.perf_counter() - start) / len(items) * 1e6)
    return statistics.median(passes)


def _fsync_us(records: int) -> float:
    with tempfile.TemporaryDirectory() as folder:
        fd = os.open(Path(folder) / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            def append(line: bytes) -> None:
                os.write(fd, line)
                os.fsync(fd)
            return _per_record_us(append, [b"x" * 200 + b"\n"] * min(records, 200))
        finally:
            os.close(fd)


class _NoHead(AuditLog):
    """A signed log as it was before its end was pinned: the record and its fsync, no head."""

    def _write_head(self) -> None:
        self._head_behind = False


def _append_us(log_class, key, folder: Path, appends: int) -> float:
    with tempfile.TemporaryDirectory(dir=folder) as run_dir:
        with log_class(Path(run_dir) / "events.jsonl", signer=key) as log:
            return _per_record_us(lambda _: log.append("call", SMALL), list(range(appends)))


def _head_in_place_us(key, folder: Path, appends: int) -> float:
    with tempfile.TemporaryDirectory(dir=folder) as run_dir:
        fd = os.open(Path(run_dir) / "events-head.json", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            def overwrite(seq: int) -> None:
                os.pwrite(fd, head_bytes(seq, "ab" * 32, key).ljust(200), 0)
                os.fsync(fd)
            return _per_record_us(overwrite, list(range(appends)))
        finally:
            os.close(fd)


def measure_head(appends: int, folder: Path | None) -> dict:
    """Per append, in microseconds: a signed append without the head and with it, and the head in place."""
    folder = folder or Path(tempfile.gettempdir())
    with tempfile.TemporaryDirectory() as key_home:
        key = keys.create_key(Path(key_home), None)
    without = _append_us(_NoHead, key, folder, appends)
    with_head = _append_us(AuditLog, key, folder, appends)
    return {"appends": appends, "append_without_head_us": without, "append_with_head_us": with_head,
            "head_added_us": with_head - without, "head_in_place_us": _head_in_place_us(key, folder, appends)}


def measure(records: int) -> dict:
    key = Ed25519PrivateKey.generate()
    public = key.public_key()
    rows = {}
    for name, data in (("small", SMALL), ("large", LARGE)):
        body = canonical_json({"seq": 1, "kind": "call", "data": data, "prev": "0" * 64})
        hashes = [hashlib.sha256(body + str(i).encode()).digest() for i in range(records)]
        bodies = [body + str(i).encode() for i in range(records)]
        by_record = [key.sign(b) for b in bodies]
        by_hash = [key.sign(h) for h in hashes]
        rows[name] = {
            "record_bytes": len(body),
            "sha256_us": _per_record_us(lambda b: hashlib.sha256(b).digest(), bodies),
            "sign_record_us": _per_record_us(key.sign, bodies),
            "sign_hash_us": _per_record_us(key.sign, hashes),
            "check_record_us": _per_record_us(lambda i: public.verify(by_record[i], bodies[i]), list(range(records))),
            "check_hash_us": _per_record_us(lambda i: public.verify(by_hash[i], hashes[i]), list(range(records))),
        }
    return {"records": records, "fsync_us": _fsync_us(records), "by_size": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--appends", type=int, default=300)
    parser.add_argument("--dir", type=Path, help="where the appends are written (default: the temporary folder)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    result = measure(args.records)
    result["head"] = measure_head(args.appends, args.dir)
    print(f"per record, {args.records} records; an fsync of the log costs {result['fsync_us']:.0f} us")
    print(f"{'record':>7} {'bytes':>7} {'sha256':>8} {'sign rec':>9} {'sign hash':>10} {'check rec':>10} "
          f"{'check hash':>11}  (us)")
    for name, row in result["by_size"].items():
        print(f"{name:>7} {row['record_bytes']:>7} {row['sha256_us']:>8.1f} {row['sign_record_us']:>9.1f} "
              f"{row['sign_hash_us']:>10.1f} {row['check_record_us']:>10.1f} {row['check_hash_us']:>11.1f}")
    head = result["head"]
    print(f"per signed append, {head['appends']} appends: {head['append_without_head_us']:.0f} us without the head, "
          f"{head['append_with_head_us']:.0f} us with it (+{head['head_added_us']:.0f} us); the head overwritten "
          f"in place with one fsync instead: {head['head_in_place_us']:.0f} us")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
