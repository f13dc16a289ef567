"""Runs whose attempts are over but whose report could not be written whole (a full disk, an unreadable file).

The service shows a run finished only once its report is written and signed (docs/service.md). Such a run lets its
GPU go at once and stays running, `report_pending` and the reason (`waiting`) on its record. Its report is tried
again every RETRY_S, with no GPU claimed and no executor started: through its live side where this process holds
one, else from its folder, held as `kernel-referee report` holds it (after a restart). It is shown finished once
the report stands whole, `finished_at` the moment its GPU was let go.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from server.folder_lock import FolderHeld, FolderLock
from server.keys import SigningKeyError
from server.report_files import end_report_whole, report_whole, write_report_files
from server.run import Run
from server.signed_log import run_key
from service.records import RunRecord, RunState, now_iso
from service.registry import Registry

log = logging.getLogger(__name__)

RETRY_S = 10.0
REASON = ("its attempts are over, but its report could not be written and signed (the service's log says why): "
          "tried again every {retry:g} s; the run is shown finished once it is written")


class PendingReports:
    """The runs of this process whose report is pending: when each let its GPU go, and when it is tried next."""

    def __init__(self) -> None:
        self._released: dict[str, str] = {}    # run id -> when its GPU was let go (ISO 8601)
        self._next_try: dict[str, float] = {}  # run id -> time.monotonic() of its next try

    def pending(self, record: RunRecord) -> bool:
        return record.report_pending or record.id in self._released

    def due(self, run_id: str) -> bool:
        return time.monotonic() >= self._next_try.get(run_id, 0.0)

    def add(self, run_id: str) -> str:
        """A run whose report failed at its end, tried again in RETRY_S; returns the reason its record shows."""
        log.warning("run %s: its report could not be written; tried again in %g s", run_id, RETRY_S)
        self._released.setdefault(run_id, now_iso())
        self.tried(run_id)
        return REASON.format(retry=RETRY_S)

    def tried(self, run_id: str) -> None:
        self._next_try[run_id] = time.monotonic() + RETRY_S

    def done(self, run_id: str) -> str:
        """Forget the run; returns its `finished_at`: when its GPU was let go (now, for a run of an earlier start)."""
        self._next_try.pop(run_id, None)
        return self._released.pop(run_id, None) or now_iso()


def write_pending(run: Run | None, run_dir: Path) -> bool:
    """Try the report again; whether it now stands whole. `run`: the run's live side in this process, else None."""
    if run is not None:
        run.report_due = True
        return end_report_whole(run)
    try:
        with FolderLock.take(run_dir, "report"):
            write_report_files(run_dir)  # a failure is logged there
            return report_whole(run_dir, run_key(run_dir))
    except (FolderHeld, SigningKeyError) as exc:
        log.warning("the report of %s cannot be written now: %s", run_dir, exc)
        return False


def finish_pending(registry: Registry, reports: PendingReports, run_id: str, run: Run | None) -> bool:
    """The pending report tried again; where it now stands whole, the run shown finished. Whether it was."""
    reports.tried(run_id)
    run_dir = run.dir if run is not None else registry.run_dir(run_id)
    if run_dir is None or not write_pending(run, run_dir):
        return False
    registry.update(run_id, state=RunState.FINISHED, finished_at=reports.done(run_id), report_pending=False,
                    waiting=None)
    return True
