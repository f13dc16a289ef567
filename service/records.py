"""The service's typed records on disk: a run's state file and the token list, each written atomically (a
temporary file renamed over the old one), so a service killed at any moment leaves the old file or the new one."""

from __future__ import annotations

import enum
import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, Field

Model = TypeVar("Model", bound=BaseModel)


class RunState(str, enum.Enum):
    CREATED = "created"    # registered, its task copied and linted; queued next (failed at a start that finds it)
    QUEUED = "queued"      # waiting for a GPU: describe_task answers, GPU tools say the run is queued
    RUNNING = "running"    # holds a GPU's serving claim; its run folder is prepared or served
    FINISHED = "finished"  # the run folder's summary says finished; its GPU went to the next run
    FAILED = "failed"      # its preparation failed, or a kill left it created (the reason in `error`); nothing spent


class Role(str, enum.Enum):
    ADMIN = "admin"
    REVIEWER = "reviewer"
    AGENT = "agent"


class RunRecord(BaseModel):
    """One run of the service: what was asked and where it stands. The budget and what was spent are not here:
    the run folder (`run_dir`) owns them, as it does for `serve`."""

    id: str
    team: str
    task_name: str
    note: str = ""
    max_attempts: int
    state: RunState = RunState.CREATED
    created: str
    queued_seq: int | None = None      # the queue's order: lower goes first; kept across restarts
    queued_at: str | None = None
    started_at: str | None = None      # when it got its GPU
    finished_at: str | None = None
    gpu_uuid: str | None = None        # the GPU whose serving claim it holds (or held)
    error: str | None = None
    # why a running run is not served now (its GPU held elsewhere) or not shown finished yet (its report unwritten)
    waiting: str | None = None
    # when its GPU was let go, its attempts over but its report not yet written whole (service/pending_reports.py)
    report_pending_since: str | None = None


class TokenRecord(BaseModel):
    """A bearer token as stored: its SHA-256 only. Tokens are 256-bit random strings, so a fast hash is enough."""

    sha256: str
    role: Role
    owner: str                          # the team (a reviewer's or agent's), or "admin"
    run_id: str | None = None           # an agent token's one run
    issued: str


class TokenFile(BaseModel):
    tokens: list[TokenRecord] = Field(default_factory=list)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_atomic(path: Path, record: BaseModel) -> None:
    """`record` as JSON at `path`, replacing the old file in one rename after an fsync."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(record.model_dump_json(indent=2))
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def read_record(path: Path, model: type[Model]) -> Model:
    return model.model_validate(json.loads(path.read_text()))
