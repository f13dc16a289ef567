"""The server's side of the GPU lease (harness/gpu_lease.py): whose timing a run's lease names, and what a
call that waited for another process's timing says (in its progress) and records (in its audit record).

A wait is wall time of the call (it counts against the call's time) but not GPU time of the run: the
GPU seconds a probe window or the cost sheet counts leave it out.
"""

from __future__ import annotations

import logging
from typing import Any

from harness.gpu_lease import GpuLease
from server.run import Progress

log = logging.getLogger(__name__)


def lease_of(executor: Any) -> GpuLease | None:
    """The executor's GPU lease, once it started (None: no lease, or a GPU that could not be named)."""
    return getattr(executor, "gpu_lease", None)


def name_lease(executor: Any, run_name: str) -> None:
    """The lease says which run it is held for ("serve run-003"), as a waiting process reads it."""
    lease = lease_of(executor)
    if lease is not None and not lease.what.endswith(f" {run_name}"):
        lease.what = f"{lease.what} {run_name}"


def resume_waits(executor: Any) -> None:
    """Before a call's work: an earlier call's abort (GpuLease.abort) no longer gives up this call's waits."""
    lease = lease_of(executor)
    if lease is not None:
        lease.resume()


class LeaseWatch:
    """One call's view of the lease: its waits are told through the call's progress (`report` replaces the
    call's own callback, whose last step a wait message continues) and kept for the call's audit record."""

    def __init__(self, executor: Any, progress: Progress | None):
        self.lease = lease_of(executor)
        self._progress = progress
        self._step = (0.0, 1.0)
        self._told = 0
        if self.lease is not None:
            self.lease.waits.clear()
            self.lease.listener = self._tell  # the next call's watch takes its place

    def report(self, done: float, total: float, message: str) -> None:
        self._step, self._told = (done, total), 0
        if self._progress is not None:
            self._progress(done, total, message)

    def _tell(self, message: str) -> None:
        log.warning("%s", message)  # for a person reading the server's stderr too
        if self._progress is None:
            return
        self._told += 1
        done, total = self._step
        # Progress must grow with every notification: each message of a wait adds a little less, below the next step.
        self._progress(min(total, done + 0.1 * (1 - 0.5 ** self._told)), total, message)

    def waited_s(self) -> float:
        return sum(w.waited_s for w in self.lease.waits) if self.lease is not None else 0.0

    def record(self) -> dict:
        """The waits of the call so far, for its audit record: {} when it waited for nobody."""
        waits = self.lease.waits if self.lease is not None else []
        return {"gpu_lease_waits": [w.model_dump(mode="json") for w in waits]} if waits else {}
