"""Runs whose attempts are over but whose report could not be written whole (a full disk, an unreadable file).

The service shows a run finished only once its report is written and signed (docs/service.md). Such a run lets its
GPU go at once and stays running, `report_pending_since` (when its GPU was let go) and the reason (`waiting`) on
its record. Its report is tried again after RETRY_S, then twice as long after each failure, up to RETRY_MAX_S,
with no GPU claimed and no executor started: through its live side where this process holds one, else from its
folder, held as `kernel-referee report` holds it (after a restart). It is shown finished once the report stands
whole, `finished_at` the moment its GPU was let go.
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
RETRY_MAX_S = 300.0
REASON = ("its attempts are over, but its report could not be written and signed (the service's log says why): "
          "tried again after {retry:g} s, then less often while it fails (at most {most:g} s apart); the run is "
          "shown finished once it is written")


class PendingReports:
    """When each pending report of this process is tried next, and how many tries have failed."""

    def __init__(self) -> None:
        self._next_try: dict[str, float] = {}  # run id -> time.monotonic() of its next try
        self._failed: dict[str, int] = {}

    @staticmethod
    def pending(record: RunRecord) -> bool:
        return record.report_pending_since is not None

    def due(self, run_id: str) -> bool:
        return time.monotonic() >= self._next_try.get(run_id, 0.0)

    def failed(self, run_id: str) -> str:
        """A try that failed (the first at the run's end); returns the reason the run's record shows."""
        tries = self._failed[run_id] = self._failed.get(run_id, 0) + 1
        wait = min(RETRY_S * 2 ** (tries - 1), RETRY_MAX_S)
        self._next_try[run_id] = time.monotonic() + wait
        log.warning("run %s: its report could not be written (%d tries); tried again in %g s", run_id, tries, wait)
        return REASON.format(retry=RETRY_S, most=RETRY_MAX_S)

    def done(self, run_id: str) -> None:
        self._next_try.pop(run_id, None)
        self._failed.pop(run_id, None)


def write_pending(run: Run | None, run_dir: Path) -> bool:
    """Try the report again; whether it now stands whole. `run`: the run's live side in this process, else None."""
    if run is not None:
        run.report_due = True
        return end_report_whole(run)
    try:
        with FolderLock.take(run_dir, "report"):
            write_report_files(run_dir)  # a failure is logged there
            return report_whole(run_dir, run_key(run_dir))
    except (FolderHeld, SigningKeyError, OSError) as exc:
        log.warning("the report of %s cannot be written now: %s", run_dir, exc)
        return False


def finish_pending(registry: Registry, reports: PendingReports, run_id: str, run: Run | None) -> bool:
    """The pending report tried again; where it now stands whole, the run shown finished. Whether it was."""
    run_dir = run.dir if run is not None else registry.run_dir(run_id)
    if run_dir is None:
        log.warning("run %s: its report is pending but its run folder is gone", run_id)
    if run_dir is None or not write_pending(run, run_dir):
        registry.note(run_id, waiting=reports.failed(run_id))
        return False
    released = registry.get(run_id).report_pending_since
    registry.update(run_id, state=RunState.FINISHED, finished_at=released or now_iso(), report_pending_since=None,
                    waiting=None)
    reports.done(run_id)
    return True
