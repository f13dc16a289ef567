"""What a run is locked to: the task copy, the expected outputs, the referee's source, the environment.

lock.json is written once when a run starts. Before every tool call the task copy and the expected
outputs are checked against it (server/locked_files.py); any difference is tampering and the call is refused.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import harness
import sandbox
import server
from server.audit import sha256_file
from server.locked_files import LockedFiles

# What the verdicts depend on: a resumed run must be judged by the same code.
_LOCKED_PACKAGES = (harness, sandbox, server)


def hash_files(root: Path, folders: tuple[str, ...]) -> dict[str, str]:
    """sha256 of every file under root/folder, keyed by its path relative to root."""
    hashes = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*")):
            if path.is_file():
                hashes[path.relative_to(root).as_posix()] = sha256_file(path)
    return hashes


def referee_source() -> dict[str, str]:
    """sha256 of every Python module of the referee itself, keyed by package-relative path."""
    hashes = {}
    for package in _LOCKED_PACKAGES:
        base = Path(package.__file__).parent
        for path in sorted(base.rglob("*.py")):
            hashes[f"{package.__name__}/{path.relative_to(base).as_posix()}"] = sha256_file(path)
    return hashes


def digest(hashes: dict[str, str]) -> str:
    text = "\n".join(f"{name} {value}" for name, value in sorted(hashes.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def make_lock(run_dir: Path, environment: dict, signing_key: dict | None = None) -> dict:
    """lock.json's contents; `signing_key` is the run key's public half (server/keys.py RunKey.anchor)."""
    files = hash_files(run_dir, ("task", "expected"))
    source = referee_source()
    lock = {"files": files, "files_sha256": digest(files), "referee_source": source,
            "referee_source_sha256": digest(source), "environment": environment}
    if signing_key is not None:
        lock["signing_key"] = signing_key
    return lock


def read_lock(run_dir: Path) -> dict:
    return json.loads((run_dir / "lock.json").read_text())


def locked_source(lock: dict) -> dict[str, str] | None:
    """The referee's source hashes a lock holds; runs locked before the key was renamed call it "harness"."""
    source = lock.get("referee_source", lock.get("harness"))
    return source if isinstance(source, dict) else None


def tampered_files(run_dir: Path, lock: dict) -> list[str]:
    """Locked files that changed, vanished or appeared since the run began: every file hashed."""
    return LockedFiles(run_dir, lock["files"]).problems(full=True)


def referee_changes(lock: dict) -> list[str]:
    now = referee_source()
    locked = locked_source(lock) or {}
    return sorted({name for name in set(now) | set(locked) if now.get(name) != locked.get(name)})


def environment_changes(lock: dict, environment: dict) -> list[str]:
    """Facts that differ from the locked environment; the GPU itself must not differ (its model, and its UUID
    where both name one: runs locked before the UUID was recorded, or where it could not be read, say nothing)."""
    keys = ("gpu", "gpu_uuid", "gpu_index", "compute_capability", "driver_cuda_version", "nvrtc", "cuda_bindings",
            "sm_clock_khz")
    before = lock["environment"]
    return [f"{key}: {before.get(key)} -> {environment.get(key)}" for key in keys
            if before.get(key) != environment.get(key)
            and (key not in _NAMED_LATER or None not in (before.get(key), environment.get(key)))]


# Facts a run's lock did not always hold, nor every machine tell: unknown on either side, they are not a change.
_NAMED_LATER = ("gpu_uuid", "gpu_index")


def locked_gpu_uuid(run_dir: Path) -> str | None:
    """The UUID of the GPU a run began on, as its lock names it (None: an old run, or no lock)."""
    try:
        value = read_lock(run_dir).get("environment", {}).get("gpu_uuid")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None
