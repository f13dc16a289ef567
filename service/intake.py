"""Intake: what a team submits (a task archive, or new-task's fields), made into a task folder and linted before
anything is queued; and the lines that connect an agent to the run once it is created.

A third source, the admin's `POST /api/runs {task_dir}`, is a folder on the service's disk: copied as an archive is
unpacked (plain files and folders only, the same limits) and linted the same way.

A refusal here is a typed `IntakeRefused` whose `causes` are the lines to show the team as they are: an archive
rule broken (service/archive.py), new-task's one-line error, a manifest that does not load, or lint's error
findings in lint's own words (harness/lint.py). Nothing is registered or queued before `prepare_task` returns.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, Field

from harness.lint import lint_folder
from harness.lint_findings import Finding, errors
from harness.new_task import Sources, create_task
from harness.new_task_spec import NewTaskError
from harness.task_model import Task, TaskError
from service.archive import ArchiveLimits, ArchiveRefused, ArchiveRule, task_root, unpack_archive

MAX_NOTE_CHARS = 2000
MAX_FIELD_BYTES = 1 << 20  # a kernel's source or a cases file typed into the form
_SERVER_NAME = re.compile(r"[^A-Za-z0-9_-]+")


class NewTaskFields(BaseModel):
    """`kernel-referee new-task`'s inputs, given as text rather than paths."""

    name: str | None = None
    description: str = Field(min_length=1)
    signature: str = Field(min_length=1)
    reference_cu: str = Field(min_length=1, max_length=MAX_FIELD_BYTES)
    initial_cu: str = Field(min_length=1, max_length=MAX_FIELD_BYTES)
    oracle_py: str | None = Field(default=None, max_length=MAX_FIELD_BYTES)
    cases_json: str = Field(min_length=1, max_length=MAX_FIELD_BYTES)


class Submission(BaseModel):
    """One submission: exactly one of an archive's bytes, new-task's fields or a task folder on the service's disk
    (the admin's only: service/submit.py), the budget and a note."""

    archive: bytes | None = None
    fields: NewTaskFields | None = None
    task_dir: Path | None = None
    max_attempts: int = Field(ge=1, le=100)
    note: str = Field(default="", max_length=MAX_NOTE_CHARS)


class IntakeRefused(ValueError):
    """The submission cannot become a run; `causes` are the lines that say why, to show as they are."""

    def __init__(self, summary: str, causes: list[str], status: int = 422):
        self.summary, self.causes, self.status = summary, causes, status   # status: the HTTP answer's
        super().__init__(f"{summary}: {causes[0]}" if causes else summary)


@dataclass
class PreparedTask:
    folder: Path                 # the task folder, ready to copy into the run
    task: Task
    findings: list[Finding] = field(default_factory=list)   # lint's warnings, kept to show

    @property
    def warnings(self) -> list[str]:
        return [f.line() for f in self.findings if f.severity != "error"]


def _from_archive(data: bytes, work: Path, limits: ArchiveLimits) -> Path:
    try:
        unpack_archive(data, work / "unpacked", limits)
        return task_root(work / "unpacked")
    except ArchiveRefused as refusal:
        raise IntakeRefused("the archive is refused", [str(refusal)]) from None


def _copy_plain_file(source: Path, target: Path, budget: int) -> int:
    """`source`'s bytes into `target`, opened without following a link (one swapped in after the walk looked); its
    length, refused past `budget` bytes."""
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # a fifo opened, then refused
    with os.fdopen(fd, "rb") as src, target.open("xb") as out:
        if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
            raise ArchiveRefused(str(source), ArchiveRule.SPECIAL_FILE, "only plain files and folders")
        data = src.read(budget + 1)
        if len(data) > budget:
            raise ArchiveRefused(str(source), ArchiveRule.MEMBER_SIZE, f"more than {budget} bytes")
        out.write(data)
        return len(data)


def _from_folder(task_dir: Path, work: Path, limits: ArchiveLimits) -> Path:
    """A copy of the task folder `task_dir` under `work`: plain files and folders only (a link could name any file of
    the host), within the archive's limits on files and bytes."""
    target, files, total = work / "task", 0, 0
    try:
        if task_dir.is_symlink() or not (task_dir / "task.toml").is_file():
            raise ArchiveRefused(str(task_dir), ArchiveRule.FORMAT, "not a task folder (with task.toml), or a link")
        for folder, subfolders, names in os.walk(task_dir, followlinks=False):
            here = Path(folder)
            (target / here.relative_to(task_dir)).mkdir(parents=True, exist_ok=True)
            subfolders[:] = [d for d in subfolders if d != "__pycache__"]
            for name in [*subfolders, *names]:
                mode = os.lstat(here / name).st_mode
                if stat.S_ISLNK(mode):
                    raise ArchiveRefused(str(here / name), ArchiveRule.LINK, "a symbolic link")
                if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                    raise ArchiveRefused(str(here / name), ArchiveRule.SPECIAL_FILE, "only plain files and folders")
            for name in names:
                if name.endswith(".pyc"):
                    continue
                files += 1
                if files > limits.max_files:
                    raise ArchiveRefused(str(here / name), ArchiveRule.FILE_COUNT, f"more than {limits.max_files} files")
                total += _copy_plain_file(here / name, target / here.relative_to(task_dir) / name,
                                          min(limits.max_member_bytes, limits.max_total_bytes - total))
    except ArchiveRefused as refusal:
        raise IntakeRefused("the task folder is refused", [f"{refusal.member} refused ({refusal.rule.value}): "
                                                           f"{refusal.detail}"]) from None
    except OSError as exc:
        raise IntakeRefused("the task folder is refused", [f"{exc.filename}: {exc.strerror}"]) from None
    return target


def _from_fields(fields: NewTaskFields, work: Path) -> Path:
    inputs = work / "inputs"
    inputs.mkdir()
    named = {"reference.cu": fields.reference_cu, "initial.cu": fields.initial_cu, "cases.json": fields.cases_json}
    if fields.oracle_py:
        named["oracle.py"] = fields.oracle_py
    for file_name, text in named.items():
        (inputs / file_name).write_text(text, encoding="utf-8")
    sources = Sources(reference=inputs / "reference.cu", initial=inputs / "initial.cu",
                      oracle=inputs / "oracle.py" if fields.oracle_py else None)
    name = fields.name or "task"
    try:
        create_task(work / "task" / name, description=fields.description, signature=fields.signature,
                    sources=sources, cases_file=inputs / "cases.json", name=fields.name)
    except NewTaskError as err:
        raise IntakeRefused("new-task cannot make a task of these fields", [str(err)]) from None
    return work / "task" / name


def _lint(folder: Path) -> tuple[Task, list[Finding]]:
    try:
        task, found = lint_folder(folder)
    except TaskError as err:
        raise IntakeRefused("the task does not load", [f"{err.field}: {err.message}"]) from None
    wrong = errors(found)
    if wrong:
        raise IntakeRefused(f"lint refuses task {task.name}", [f.line() for f in wrong])
    return task, found


def prepare_task(submission: Submission, work: Path, limits: ArchiveLimits | None = None) -> PreparedTask:
    """The submitted task as a linted folder under the empty folder `work`, or IntakeRefused.

    Slow (lint compiles the kernels and runs the oracle): call it from a worker thread."""
    given = [submission.archive, submission.fields, submission.task_dir]
    if sum(source is not None for source in given) != 1:
        raise IntakeRefused("a submission is an archive or new-task's fields", ["give exactly one of the two"])
    work.mkdir(parents=True, exist_ok=True)
    try:
        if submission.archive is not None:
            folder = _from_archive(submission.archive, work, limits or ArchiveLimits())
        elif submission.task_dir is not None:
            folder = _from_folder(submission.task_dir, work, limits or ArchiveLimits())
        else:
            folder = _from_fields(submission.fields, work)
        task, found = _lint(folder)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return PreparedTask(folder=folder, task=task, findings=found)


class Connection(BaseModel):
    """How an agent reaches its run: shown once, with the token, when the run is created."""

    server_name: str
    url: str
    token: str
    claude_command: str
    mcp_json: str


def connection(run_id: str, url: str, token: str) -> Connection:
    """The `claude mcp add` line and `.mcp.json` snippet of docs/clients.md's HTTP section, for this run."""
    name = "kernel-referee-" + _SERVER_NAME.sub("-", run_id).strip("-")
    command = f'claude mcp add --transport http {name} {url} --header "Authorization: Bearer {token}"'
    snippet = {"mcpServers": {name: {"type": "http", "url": url, "headers": {"Authorization": f"Bearer {token}"}}}}
    return Connection(server_name=name, url=url, token=token, claude_command=command,
                      mcp_json=json.dumps(snippet, indent=2))
