"""The per-call tamper check of a run's locked files (the task copy and the expected outputs).

Hashing every locked file on every call costs about 0.1 s for matmul_f32's 111 MB of expected
outputs. Instead each file's stat identity (device, inode, size, mtime and ctime, in nanoseconds) is
kept from the last time its content was hashed and found to match lock.json; a call stats every
file and hashes again only those whose identity changed, and any file added or gone. The kernel
sets a file's ctime to the current time on every change of its content or metadata, and no system
call sets it back (os.utime sets mtime and atime only), so a change made through the file system
changes the identity. What stat cannot see (a change written to the block device beneath the file
system, or made after the system clock was set back) is caught by the full check: every file hashed,
before every record_attempt and finish, and when a run is resumed. docs/security.md states this.

A file's identity is trusted only once its ctime is RACY_MARGIN_S older than the check that
hashed it: a change within the same tick of the file system's clock would leave ctime as it was
(git's "racily clean" entries), so a file changed that recently is hashed again on every call.
"""

from __future__ import annotations

import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from server.audit import sha256_file

FOLDERS = ("task", "expected")
RACY_MARGIN_S = 2.0


@dataclass(frozen=True)
class Identity:
    """What stat says about a file: any change of content or metadata changes ctime_ns."""
    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st) -> "Identity":
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class LockedFiles:
    """lock.json's file hashes, checked against the run folder; safe to call from several threads."""

    def __init__(self, run_dir: Path, locked: dict[str, str]):
        self.run_dir = Path(run_dir)
        self.locked = dict(locked)
        self._trusted: dict[str, Identity] = {}  # identity of a file when last hashed to its locked value
        self._lock = threading.Lock()
        self.hashed = 0  # files hashed by this checker so far (the bench and the tests read it)

    def problems(self, *, full: bool = False) -> list[str]:
        """Locked files that changed, vanished or appeared since the run began; `full` hashes every file."""
        with self._lock:
            started_ns = time.time_ns()
            present = self._stat_all()
            changed = [f"{name} changed" for name in self.locked
                       if name in present and not self._matches(name, present[name], full, started_ns)]
            missing = [f"{name} missing" for name in self.locked if name not in present]
            added = [f"{name} added" for name in present if name not in self.locked]
            return changed + missing + added

    def _stat_all(self) -> dict[str, Identity]:
        """Every regular file under the locked folders (symbolic links followed, as hashing does)."""
        found = {}
        for folder in FOLDERS:
            for path in sorted((self.run_dir / folder).rglob("*")):
                try:
                    st = path.stat()
                except OSError:  # gone between the listing and the stat, or a dangling link
                    continue
                if stat.S_ISREG(st.st_mode):
                    found[path.relative_to(self.run_dir).as_posix()] = Identity.of(st)
        return found

    def _matches(self, name: str, identity: Identity, full: bool, started_ns: int) -> bool:
        if not full and self._trusted.get(name) == identity:
            return True
        self._trusted.pop(name, None)
        self.hashed += 1
        try:
            same = sha256_file(self.run_dir / name) == self.locked[name]
        except OSError:
            return False
        # Trusted only if the file was last changed well before this check began, and is still as stat saw it.
        if same and identity.ctime_ns < started_ns - int(RACY_MARGIN_S * 1e9) and self._still(name, identity):
            self._trusted[name] = identity
        return same

    def _still(self, name: str, identity: Identity) -> bool:
        try:
            return Identity.of((self.run_dir / name).stat()) == identity
        except OSError:
            return False
