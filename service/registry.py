"""The service's runs on disk, one folder each under ROOT/runs/: the task as submitted (`task/`), the referee's
results folder (`results/`, where the run folder is made by the referee's own lifecycle) and `state.json` (a
RunRecord). The registry is the only writer of state.json; every change is one atomic write."""

from __future__ import annotations

import logging
import re
import secrets
import shutil
import threading
from pathlib import Path

from service.records import RunRecord, RunState, now_iso, read_record, write_atomic

log = logging.getLogger(__name__)
RUN_ID = re.compile(r"r[0-9a-f]{12}")
STATE = "state.json"


class UnknownRun(KeyError):
    """No run of that id (or an id of the wrong form)."""


class Registry:
    def __init__(self, root: Path):
        self.root = root
        self.runs_dir = root / "runs"
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._records: dict[str, RunRecord] = {}
        for state_file in sorted(self.runs_dir.glob(f"*/{STATE}")):
            record = read_record(state_file, RunRecord)
            self._records[record.id] = record

    def folder(self, run_id: str) -> Path:
        return self.runs_dir / run_id

    def task_dir(self, run_id: str) -> Path:
        return self.folder(run_id) / "task"

    def compiles_journal(self, run_id: str) -> Path:
        """The compiles a queued run answered, kept until its run folder holds them (server/early_compiles.py)."""
        return self.folder(run_id) / "queued-compiles.jsonl"

    def results_dir(self, run_id: str) -> Path:
        return self.folder(run_id) / "results"

    def run_dir(self, run_id: str) -> Path | None:
        """The referee's run folder of the run, once its preparation moved it into place (results/run-NNN with its
        lock.json); read from the disk, not the state file, so a service killed just after the move finds it."""
        made = sorted(self.results_dir(run_id).glob("run-[0-9][0-9][0-9]*/lock.json"))
        return made[0].parent if made else None

    def create(self, task_dir: Path, team: str, task_name: str, max_attempts: int, note: str = "") -> RunRecord:
        """A new run in state CREATED: `task_dir` copied into its folder, its state file written last (a folder
        without one is no run, and is ignored)."""
        run_id = "r" + secrets.token_hex(6)
        folder = self.folder(run_id)
        folder.mkdir(parents=True)
        shutil.copytree(task_dir, folder / "task", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        record = RunRecord(id=run_id, team=team, task_name=task_name, note=note, max_attempts=max_attempts,
                           created=now_iso())
        with self._lock:
            write_atomic(folder / STATE, record)
            self._records[run_id] = record
        return record

    def unregistered_folders(self) -> list[Path]:
        """Run folders without a state file: a `create` cut short while it copied the task."""
        return sorted(f for f in self.runs_dir.iterdir() if RUN_ID.fullmatch(f.name) and not (f / STATE).exists())

    def get(self, run_id: str) -> RunRecord:
        if not RUN_ID.fullmatch(run_id or ""):
            raise UnknownRun(run_id)
        with self._lock:
            try:
                return self._records[run_id]
            except KeyError:
                raise UnknownRun(run_id) from None

    def all(self) -> list[RunRecord]:
        with self._lock:
            return sorted(self._records.values(), key=lambda r: (r.created, r.id))

    def update(self, run_id: str, **changes) -> RunRecord:
        with self._lock:
            record = self.get(run_id).model_copy(update=changes)
            write_atomic(self.folder(run_id) / STATE, record)
            self._records[run_id] = record
            return record

    def note(self, run_id: str, **changes) -> RunRecord:
        """`update` for a reason or a mark this process goes on acting on (a pending report): kept in memory where
        the disk refuses it (a full disk, the very cause it may explain), so the API still says it; logged."""
        with self._lock:
            record = self.get(run_id).model_copy(update=changes)
            try:
                write_atomic(self.folder(run_id) / STATE, record)
            except OSError as exc:
                log.warning("run %s: its state could not be written (%s); kept in memory", run_id, exc)
            self._records[run_id] = record
            return record

    def enqueue(self, run_id: str) -> RunRecord:
        """CREATED -> QUEUED, behind every run queued before it."""
        with self._lock:
            record = self.get(run_id)
            if record.state is not RunState.CREATED:
                return record
            seq = max((r.queued_seq for r in self._records.values() if r.queued_seq is not None), default=0) + 1
            return self.update(run_id, state=RunState.QUEUED, queued_seq=seq, queued_at=now_iso())

    def queued(self) -> list[RunRecord]:
        """The queue, first first."""
        with self._lock:
            return sorted((r for r in self._records.values() if r.state is RunState.QUEUED),
                          key=lambda r: r.queued_seq or 0)

    def in_state(self, state: RunState) -> list[RunRecord]:
        with self._lock:
            return [r for r in self._records.values() if r.state is state]
