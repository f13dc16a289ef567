"""`kernel-referee new-task`: a task folder made from the seed's flags (a description, a signature, the
reference and initial kernels, a cases file, an optional oracle).

The folder is made beside its destination under a temporary name and moved into place only once its
task.toml loads (harness/task.py): a failure leaves nothing behind, and an existing folder that is not
empty is never written into. What is inferred from the signature and the cases file is
harness/new_task_spec.py; the tolerances and their reasoning, harness/tolerance_proposal.py; the
manifest's text, harness/task_toml.py.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from harness.new_task_spec import NewTaskError, TaskPlan, plan_task, read_cases_file
from harness.task import load_task
from harness.task_model import Task, TaskError
from harness.task_toml import render
from harness.tolerance_proposal import ToleranceProposal, propose_tolerances


@dataclass(frozen=True)
class Sources:
    """The files new-task copies into the folder, by their names there."""

    reference: Path
    initial: Path
    oracle: Path | None = None

    def files(self) -> dict[str, Path]:
        named = {"reference.cu": self.reference, "initial.cu": self.initial}
        return named | ({"oracle.py": self.oracle} if self.oracle is not None else {})


@dataclass(frozen=True)
class NewTask:
    task: Task
    plan: TaskPlan
    tolerances: dict[str, ToleranceProposal]
    holdout_proposed: bool      # the plan's proposed holdout is in task.toml, commented out


def _check_destination(folder: Path) -> None:
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise NewTaskError(f"{folder}: exists and is not a folder; new-task makes a new folder")
    if folder.is_dir() and any(folder.iterdir()):
        raise NewTaskError(f"{folder}: exists and is not empty; new-task never writes into an existing task")


def _read_sources(sources: Sources) -> dict[str, bytes]:
    contents = {}
    for name, path in sources.files().items():
        flag = {"reference.cu": "--reference", "initial.cu": "--initial-kernel", "oracle.py": "--oracle"}[name]
        try:
            contents[name] = path.read_bytes()
        except OSError as exc:
            raise NewTaskError(f"{flag} {path}: cannot be read: {exc.strerror or exc}") from None
    return contents


def _load(folder: Path, text: str) -> Task:
    (folder / "task.toml").write_text(text, encoding="utf-8")
    try:
        return load_task(folder)
    except TaskError as err:
        hint = " (the task's name is the folder's unless --name gives one)" if err.field == "name" else ""
        raise NewTaskError(f"the task these inputs make does not load: {err.field}: {err.message}{hint}") from None


def _holdout_loads(folder: Path, plan: TaskPlan, tolerances: dict[str, ToleranceProposal], oracle: bool) -> bool:
    """Whether the proposed holdout is a case the task can take (its shapes and launches resolve)."""
    if plan.proposed_holdout is None:
        return False
    try:
        _load(folder, render(plan, tolerances, oracle, holdout="active"))
    except NewTaskError:
        return False
    return True


def _draft(work: Path, plan: TaskPlan, oracle: bool) -> Task:
    """The task with placeholder tolerances; without the proposed [vendor] where the task does not take it (a
    case beyond cuBLAS's sizes), said among what was inferred."""
    placeholder = {p.name: ToleranceProposal(0.0, 0.0, []) for p in plan.outputs}
    try:
        return _load(work, render(plan, placeholder, oracle))
    except NewTaskError as err:
        if plan.vendor is None:
            raise
        vendor, plan.vendor = plan.vendor, None
        draft = _load(work, render(plan, placeholder, oracle))  # the error of a task that fails either way
        plan.inferred.append(f"no [vendor] after all: cuBLAS gemm {vendor.c} = {vendor.a} x {vendor.b} does not fit "
                             f"the task ({err})")
        return draft


def _build(work: Path, plan: TaskPlan, contents: dict[str, bytes]) -> NewTask:
    for name, data in contents.items():
        (work / name).write_bytes(data)
    oracle = "oracle.py" in contents
    draft = _draft(work, plan, oracle)
    tolerances = propose_tolerances(draft, plan)
    proposed = _holdout_loads(work, plan, tolerances, oracle)
    task = _load(work, render(plan, tolerances, oracle, holdout="comment" if proposed else "none"))
    return NewTask(task=task, plan=plan, tolerances=tolerances, holdout_proposed=proposed)


def create_task(folder: Path, *, description: str, signature: str, sources: Sources, cases_file: Path,
                name: str | None = None) -> NewTask:
    """Make the task folder `folder`; a NewTaskError (one line) for any input that cannot make one."""
    folder = Path(folder)
    _check_destination(folder)
    contents = _read_sources(sources)
    plan = plan_task(name or folder.resolve().name, description, signature, read_cases_file(cases_file),
                     str(cases_file))
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = folder.parent / f".{folder.name}.new-task-{os.getpid()}"
    work.mkdir()
    try:
        made = _build(work, plan, contents)
        _check_destination(folder)  # again: nothing may have appeared there meanwhile
        if folder.is_dir():
            folder.rmdir()
        work.rename(folder)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return NewTask(task=load_task(folder), plan=made.plan, tolerances=made.tolerances,
                   holdout_proposed=made.holdout_proposed)
