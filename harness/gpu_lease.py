"""One timing at a time per GPU, across every process of the host: a lease keyed by the GPU's UUID.

Two referee processes timing on one GPU at once (two runs, a run and a `check`, a `replay` or the
bench) each read the other's load as their own. Every timing job therefore holds the GPU's lease:
an exclusive `flock` on a file named after the GPU in a host-wide folder (`/dev/shm/kernel-referee-
gpu-leases`, or the folder `$KERNEL_REFEREE_GPU_LEASES` names). The kernel drops the lock with its
holder's last descriptor, so a killed holder frees the GPU; the file only says who holds it (pid,
what it is, since when), for waiters to tell. Compiles and correctness checks take no lease.

The lease is cooperative: it keeps the referee's own processes apart, not other users of the GPU
(those are read through NVML around each timing and reported as a warning).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

from pydantic import BaseModel

from harness.call_limits import OutOfTime
from sandbox.deadline import Deadline

log = logging.getLogger(__name__)

LEASE_DIR_ENV = "KERNEL_REFEREE_GPU_LEASES"
_FOLDER_NAME = "kernel-referee-gpu-leases"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_MAX_LOCK_WAIT_S = threading.TIMEOUT_MAX


class LeaseHolder(BaseModel):
    """Who holds a GPU's lease, as its file says."""

    pid: int
    what: str
    since: str

    def describe(self) -> str:
        return f"pid {self.pid} ({self.what}) since {self.since}"


class LeaseWait(BaseModel):
    """One wait for a GPU's lease: how long, and whom it waited for (None: a holder that had not said)."""

    gpu: str
    since: str
    waited_s: float
    holders: list[LeaseHolder]


class LeaseWaitAborted(Exception):
    """The wait for a GPU's lease was given up (the call waiting for it was cancelled)."""


def lease_folder() -> Path:
    """The host-wide folder of the leases: $KERNEL_REFEREE_GPU_LEASES, else one in /dev/shm (or the temp folder)."""
    named = os.environ.get(LEASE_DIR_ENV)
    if named:
        return Path(named)
    shm = Path("/dev/shm")
    return (shm if shm.is_dir() else Path(tempfile.gettempdir())) / _FOLDER_NAME


def gpu_key(gpu_uuid: str | None, pci_bus_id: str | None = None) -> str | None:
    """What a GPU's lease is named by: its UUID, else its PCI bus id (both host-wide); None if neither is known."""
    if gpu_uuid:
        return gpu_uuid
    return f"pci-{pci_bus_id}" if pci_bus_id else None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class _Held:
    """This process's hold on one lease file: threads of one process share it (reentrant for one thread)."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    depth: int = 0
    fd: int | None = None


_held: dict[Path, _Held] = {}
_held_guard = threading.Lock()


def _held_for(path: Path) -> _Held:
    with _held_guard:
        return _held.setdefault(path, _Held())


class GpuLease:
    """The lease of one GPU, for one process. `held()` around a timing job; nested holds are free.

    `what` says what this process is ("serve run-003", "replay run-003", "check matmul_f32", "bench"),
    and may change (a run's name is known after the executor starts). While it waits, `listener` (or
    the log) is told what it waits for, at once and every `tell_every_s`; every wait is appended to
    `waits`, which the caller reads and clears. `abort()` gives up the wait under way and every later one
    until `resume()`: a cancelled call's abort may land before its wait begins.
    """

    def __init__(self, gpu: str, what: str, folder: Path | None = None, poll_s: float = 0.05,
                 tell_every_s: float = 5.0):
        self.gpu = gpu
        self.what = what
        self.folder = folder or lease_folder()
        self.path = self.folder / f"{_UNSAFE.sub('_', gpu)}.lock"
        self.poll_s, self.tell_every_s = poll_s, tell_every_s
        self.listener: Callable[[str], None] | None = None
        self.waits: list[LeaseWait] = []
        self._aborted = threading.Event()  # set by abort(), cleared by resume(); a wait reads it first thing

    @contextmanager
    def held(self, deadline: Deadline | None = None) -> Iterator[None]:
        """Hold the lease for the block: wait for another process's hold to end first, telling whom. A wait
        that outlasts `deadline` (a tool call's) ends with OutOfTime."""
        held = _held_for(self.path)
        if not held.lock.acquire(timeout=-1 if deadline is None else min(deadline.remaining(), _MAX_LOCK_WAIT_S)):
            raise OutOfTime(f"the call's {deadline.seconds:g} s ran out waiting for GPU {self.gpu}, "
                            "which another call of this process was timing on")
        try:
            if held.depth == 0:
                held.fd = self._acquire(deadline)
            held.depth += 1
            try:
                yield
            finally:
                held.depth -= 1
                if held.depth == 0:
                    _release(held.fd)
                    held.fd = None
        finally:
            held.lock.release()

    def abort(self) -> None:
        """From another thread: the wait under way, and any wait that begins before `resume()`, ends at once with
        LeaseWaitAborted. A hold is left alone, and a free lease is still taken: only waiting is given up."""
        self._aborted.set()

    def resume(self) -> None:
        """Waits wait again: an earlier call's abort is spent (called before the next call's work begins)."""
        self._aborted.clear()

    def holder(self) -> LeaseHolder | None:
        """Who holds the lease now, as its file says (None: free, or a holder that has not written yet)."""
        try:
            return _read_holder(self.path.read_bytes())
        except OSError:
            return None

    def _acquire(self, deadline: Deadline | None) -> int:
        fd = _open_lease_file(self.folder, self.path)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._wait(fd, deadline)
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"pid": os.getpid(), "what": self.what, "since": _now()}).encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _wait(self, fd: int, deadline: Deadline | None) -> None:
        started, since = time.monotonic(), _now()
        holders: list[LeaseHolder] = []
        told_at = None
        try:
            while True:
                if self._aborted.is_set():  # also an abort that landed before this wait began
                    raise LeaseWaitAborted(f"the wait for GPU {self.gpu} was given up")
                holder = _read_holder(os.pread(fd, 4096, 0))
                if holder is not None and holder not in holders:
                    holders.append(holder)
                    told_at = None  # a new holder is told at once
                if told_at is None or time.monotonic() - told_at >= self.tell_every_s:
                    self._tell(holder, since)
                    told_at = time.monotonic()
                if self._aborted.wait(self.poll_s if deadline is None else deadline.cap(self.poll_s)):
                    continue  # given up at the loop's top
                if deadline is not None and deadline.expired:
                    by = holder.describe() if holder else "another process"
                    raise OutOfTime(f"the call's {deadline.seconds:g} s ran out waiting for GPU {self.gpu}, held by "
                                    f"{by} since before {since}")
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return
                except BlockingIOError:
                    continue
        finally:
            # recorded however it ended: given up, out of the call's time, or the lease taken
            self.waits.append(LeaseWait(gpu=self.gpu, since=since, waited_s=round(time.monotonic() - started, 3),
                                        holders=holders))

    def _tell(self, holder: LeaseHolder | None, since: str) -> None:
        by = holder.describe() if holder else "a process that has not said who it is"
        message = f"waiting for GPU {self.gpu} (since {since}): another timing holds it, {by}"
        if self.listener is not None:
            self.listener(message)
        else:
            log.warning("%s", message)


def held(lease: GpuLease | None, deadline: Deadline | None = None):
    """`lease.held(deadline)`, or nothing where there is no lease (the GPU could not be named)."""
    return lease.held(deadline) if lease is not None else _nothing()


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _open_lease_file(folder: Path, path: Path) -> int:
    # The folder is shared by every user of the host: made writable by all (sticky, as /tmp), and the file is
    # never followed through a link someone else left there.
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        try:
            folder.chmod(0o1777)
        except OSError:
            pass
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        os.fchmod(fd, 0o666)
    except OSError:
        pass  # another user's file: it is only locked and rewritten, its mode stays theirs
    return fd


def _release(fd: int | None) -> None:
    if fd is None:
        return
    try:
        os.ftruncate(fd, 0)  # the file never names a process that no longer holds the lease
    finally:
        os.close(fd)  # closing drops the lock


def _read_holder(raw: bytes) -> LeaseHolder | None:
    try:
        return LeaseHolder.model_validate_json(raw.rstrip(b"\0"))
    except ValueError:
        return None


class ServingClaim:
    """A serving run's claim on its GPU, held for the life of the server (not only around timings): the mark
    by which a server started without `--gpu` finds a GPU that no other run serves on (harness/placement.py).

    An exclusive `flock` on `<GPU>.serving.lock` beside the leases; the kernel drops it with the process. A
    run placed on a GPU another run holds (asked for by `--gpu`, or every GPU taken) shares it without a claim.
    """

    def __init__(self, gpu: str, what: str, folder: Path | None = None):
        self.gpu, self.what = gpu, what
        self.folder = folder or lease_folder()
        self.path = self.folder / f"{_UNSAFE.sub('_', gpu)}.serving.lock"
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_take(self) -> bool:
        """Take the claim if no other process holds it; True if this process holds it now."""
        if self._fd is not None:
            return True
        fd = _open_lease_file(self.folder, self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "what": self.what, "since": _now()}).encode(), 0)
        self._fd = fd
        return True

    def is_taken(self) -> bool:
        """Whether another process holds the claim now (this process's own hold does not count)."""
        if self._fd is not None:
            return False
        if not self.try_take():
            return True
        self.release()
        return False

    def release(self) -> None:
        fd, self._fd = self._fd, None
        _release(fd)
