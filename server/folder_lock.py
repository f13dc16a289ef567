"""One process at a time writes a run folder: an exclusive OS lock on RUN/.serving.lock.

A server holds it for its whole life (server/lifecycle.py takes it before anything is written, `Run.close`
drops it); `kernel-referee replay` and `kernel-referee report` hold it while they run and write. Two
servers of one run would each get a probe window, overwrite each other's history.json and fork the audit
chain. The lock is an `flock` on the file, which the kernel drops with the holder's last descriptor: a
killed server's file never blocks anyone (a holder that ends normally removes it). The file only says
who holds the folder (pid, what, command, since), for the refusal's message.

Not the tamper lock: `lock.json` (server/lock.py) is what a run is locked *to* (hashes of its files).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from server.run import RunError

LOCK_NAME = ".serving.lock"
EXIT_HELD = 4  # the exit status of a command refused because another process holds the run folder
_VERBS = {"serve": "served", "replay": "replayed", "report": "reported on"}


class FolderHeld(RunError):
    """Another process holds the run folder."""

    def __init__(self, run_dir: Path, holder: dict | None):
        self.run_dir, self.holder = run_dir, holder or {}
        pid, what = self.holder.get("pid"), str(self.holder.get("what", ""))
        verb = _VERBS.get(what.split(" ")[0], "used")
        super().__init__(f"{run_dir.name} is being {verb} by pid {pid}" if pid else
                         f"{run_dir.name} is held by another process (it has not said which)")


class FolderLock:
    """The held lock of one run folder; `release()` (or the process's end) gives it back."""

    def __init__(self, run_dir: Path, fd: int):
        self.run_dir, self._fd = run_dir, fd

    @classmethod
    def take(cls, run_dir: Path, what: str) -> "FolderLock":
        """Hold `run_dir` now, or raise FolderHeld naming its holder; never waits."""
        run_dir = Path(run_dir)
        path = run_dir / LOCK_NAME
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(os.pread(fd, 4096, 0))
                os.close(fd)
                raise FolderHeld(run_dir, holder) from None
            except BaseException:
                os.close(fd)
                raise
            if _same_file(fd, path):
                break
            os.close(fd)  # locked a file its last holder removed on release: lock the one at the path now
        stamp = {"pid": os.getpid(), "what": what, "command": " ".join(sys.argv)[:1000],
                 "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(stamp).encode() + b"\n", 0)
        except BaseException:  # a full disk: the lock let go, not held for ever by a lost descriptor
            os.close(fd)
            raise
        return cls(run_dir, fd)

    def release(self) -> None:
        """Remove the file (while still holding it, so no one locks a file about to vanish) and drop the lock."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            (self.run_dir / LOCK_NAME).unlink(missing_ok=True)
        except OSError:
            pass  # a read-only folder: the file stays, and a lock on it is what counts
        finally:
            os.close(fd)

    def __enter__(self) -> "FolderLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _holder(raw: bytes) -> dict | None:
    try:
        holder = json.loads(raw.decode())
    except ValueError:
        return None
    return holder if isinstance(holder, dict) else None
