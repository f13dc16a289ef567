"""What a replay reads from a run folder: its task, settings, lock, the attempt to replay (a Subject) and
the replay requests (best-case-N.json)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from harness.task_model import LaunchSpec, Task, TaskError
from harness.task import load_task
from server.record_files import HISTORY, SUMMARY, read_history, read_summary
from server.records import AttemptRecord, SummaryFile
from server.run import RunSettings

_REQUEST = re.compile(r"best-case-([0-9]+)\.json")
_ATTEMPT_FILE = re.compile(r"attempts/[0-9]{3}\.cu")


class RunFolderError(Exception):
    """The run folder cannot be replayed: incomplete, inconsistent, or no such attempt."""


@dataclass(frozen=True)
class Subject:
    """A kernel of the run as history.json recorded it."""

    attempt: int
    source_file: str
    source: str
    options: tuple[str, ...]
    launch: LaunchSpec

    def describe(self) -> dict:
        return {"attempt": self.attempt, "source_file": self.source_file,
                "source_sha256": hashlib.sha256(self.source.encode()).hexdigest(), "options": list(self.options),
                "launch": self.launch.model_dump(mode="json")}


@dataclass
class RunRecord:
    """What a replay reads from a verified run folder."""

    dir: Path
    task: Task
    settings: RunSettings
    lock: dict
    summary: SummaryFile
    kernel: Subject                 # what is replayed: the best, or the attempt asked for
    baseline: Subject
    is_best: bool
    requests: list[tuple[str, dict]] = field(default_factory=list)  # (best-case-N.json, its request), the best only


def _json(path: Path):
    return json.loads(path.read_bytes())


def load_record(run_dir: Path, attempt: int | None = None) -> RunRecord:
    for name in ("run.json", "lock.json", HISTORY, SUMMARY):
        if not (run_dir / name).is_file():
            raise RunFolderError(f"it has no {name} (a run that stopped before its baseline was recorded)")
    try:
        task = load_task(run_dir / "task")
    except TaskError as exc:
        raise RunFolderError(f"its task copy does not load: {exc}") from None
    history = {e.attempt: e for e in read_history(run_dir).attempts}
    summary = read_summary(run_dir)
    number = summary.best_number if attempt is None else attempt
    record = RunRecord(dir=run_dir, task=task, settings=RunSettings.of_run(run_dir), lock=_json(run_dir / "lock.json"),
                       summary=summary, kernel=_subject(run_dir, history, number),
                       baseline=_subject(run_dir, history, 0), is_best=attempt is None)
    if attempt is None:
        record.requests = _requests(run_dir, task, record.kernel)
    return record


def _subject(run_dir: Path, history: dict[int, AttemptRecord], number: int) -> Subject:
    entry = history.get(number)
    if entry is None:
        raise RunFolderError(f"history.json has no attempt {number} (it has {sorted(history)})")
    if entry.candidate is None or not _ATTEMPT_FILE.fullmatch(str(entry.source_file)):
        raise RunFolderError(f"attempt {number} was interrupted: history.json records no kernel for it")
    source = (run_dir / entry.source_file).read_bytes().decode()
    if hashlib.sha256(source.encode()).hexdigest() != entry.source_sha256:
        raise RunFolderError(f"{entry.source_file} is not the source history.json records for attempt {number}")
    return Subject(number, entry.source_file, source, tuple(entry.options or ()), LaunchSpec.model_validate(entry.launch))


def _requests(run_dir: Path, task: Task, best: Subject) -> list[tuple[str, dict]]:
    """The best's replay requests, each checked against the best attempt and the task's case it names."""
    paths = sorted((p for p in run_dir.glob("best-case-*.json") if _REQUEST.fullmatch(p.name)),
                   key=lambda p: int(_REQUEST.fullmatch(p.name)[1]))
    if not paths:
        raise RunFolderError("it has no best-case-N.json replay requests")
    if (run_dir / "best.cu").read_bytes().decode() != best.source:
        raise RunFolderError(f"best.cu is not the source of the best attempt ({best.attempt})")
    requests = []
    for path in paths:
        request = _json(path)
        case = task.case(request.get("case"))
        recorded = (request.get("attempt"), tuple(request.get("options", ())), request.get("role"),
                    request.get("dims"), request.get("seed"))
        if recorded != (best.attempt, best.options, case.role, case.dims, case.seed):
            raise RunFolderError(f"{path.name} does not match the best attempt ({best.attempt}) and the task's "
                                 f"case {case.name}")
        requests.append((path.name, request))
    return requests
