"""What signing the audit log costs, per record, on a CPU: Ed25519 over the record's canonical bytes against
Ed25519 over its 32-byte hash (the head at that record: it covers the record and, through prev, every one
before, so either signature pins the whole chain). Signing and checking, for a small record (a tool call)
and a large one (an attempt's record with per-case detail), next to the sha256 and fsync the log already
pays per record. server/audit.py signs the hash: the numbers below are why.

    python bench/log_signing.py [--records 2000] [--json OUT]
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

from server.audit import canonical_json  # noqa: E402

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
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    result = measure(args.records)
    print(f"per record, {args.records} records; an fsync of the log costs {result['fsync_us']:.0f} us")
    print(f"{'record':>7} {'bytes':>7} {'sha256':>8} {'sign rec':>9} {'sign hash':>10} {'check rec':>10} "
          f"{'check hash':>11}  (us)")
    for name, row in result["by_size"].items():
        print(f"{name:>7} {row['record_bytes']:>7} {row['sha256_us']:>8.1f} {row['sign_record_us']:>9.1f} "
              f"{row['sign_hash_us']:>10.1f} {row['check_record_us']:>10.1f} {row['check_hash_us']:>11.1f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
