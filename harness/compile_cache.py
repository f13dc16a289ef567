"""The parent's cache of successful compiles: an LRU in memory, optionally mirrored to a folder."""

from __future__ import annotations

import os
import re
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

from harness.worker_side.compile_policy import CompileResult


_KEY = re.compile(r"[0-9a-f]{64}")


class CompileCache:
    """Thread-safe LRU of successful compiles, optionally mirrored to a folder.

    The folder holds <key>.cubin and <key>.json; the json is written last,
    so its presence marks a complete entry.
    """

    def __init__(self, max_entries: int = 256, folder: str | os.PathLike | None = None) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self.folder = Path(folder) if folder is not None else None
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
        self._entries: OrderedDict[str, CompileResult] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def get(self, key: str) -> CompileResult | None:
        """The stored result for `key` (memory first, then the folder), or None."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        found = self._load(key)
        if found is not None:
            self._remember(found)
        return found

    def absorb(self, other: "CompileCache") -> None:
        """Keep every entry `other` holds here too (a run's compiles made before its executor was placed)."""
        with other._lock:
            entries = list(other._entries.values())
        for result in entries:
            self.put(result)

    def put(self, result: CompileResult) -> None:
        self._remember(result)
        if self.folder is not None and _KEY.fullmatch(result.key):
            self._store(result)

    def _remember(self, result: CompileResult) -> None:
        with self._lock:
            self._entries[result.key] = result
            self._entries.move_to_end(result.key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def _load(self, key: str) -> CompileResult | None:
        if self.folder is None or not _KEY.fullmatch(key):
            return None
        try:
            text = (self.folder / f"{key}.json").read_text(encoding="utf-8")
            cubin = (self.folder / f"{key}.cubin").read_bytes()
            result = CompileResult.model_validate_json(text)
        except (OSError, ValueError):
            # A missing or damaged entry is just a miss; it is rewritten later.
            return None
        if result.key != key or not cubin:
            return None
        return result.model_copy(update={"cubin": cubin})

    def _store(self, result: CompileResult) -> None:
        assert self.folder is not None
        _write_atomic(self.folder / f"{result.key}.cubin", result.cubin)
        _write_atomic(self.folder / f"{result.key}.json", result.model_dump_json().encode())


def _write_atomic(path: Path, data: bytes) -> None:
    # Readers in other threads or processes must never see a partial file.
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
