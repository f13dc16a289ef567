"""`kernel-referee new-task` and `kernel-referee lint`, and the lint `serve` and `check` run first: the
command line's side only (what is printed, the exit codes); the work is harness/new_task.py and
harness/lint.py."""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from harness.lint import lint_before_run, lint_folder, lint_task, refuse_on_errors
from harness.lint_compile import with_compiles
from harness.lint_findings import Finding, errors
from harness.new_task import NewTask, Sources, create_task
from harness.settings import TimingSettings
from harness.task_model import Task

EXIT_CLEAN, EXIT_LINT_ERRORS = 0, 1


def print_findings(label: str, found: list[Finding], out: TextIO) -> int:
    """The findings, one a line, after a count; the exit code they make (1 with any error)."""
    wrong = errors(found)
    if not found:
        print(f"{label}: lint passed (no findings)", file=out)
    else:
        verdict = "refused" if wrong else "passed"
        print(f"{label}: lint {verdict}: {len(wrong)} error(s), {len(found) - len(wrong)} warning(s)", file=out)
    for finding in found:
        print(finding.line(), file=out)
    return EXIT_LINT_ERRORS if wrong else EXIT_CLEAN


def lint(task_dir: Path, out: TextIO) -> int:
    """`kernel-referee lint TASK`: 0 no errors (warnings allowed), 1 errors; a task that does not load is a
    TaskError (exit 2 at the command line's edge)."""
    _, found = lint_folder(task_dir)
    return print_findings(str(task_dir), found, out)


def lint_first(task: Task, settings: TimingSettings, warnings_to: TextIO, prefix: str = "",
               compiles: bool = True) -> None:
    """What `serve` and `check` do before anything else: refuse a task with lint errors (a LintRefused, one
    line), say each warning on one line. `compiles` False leaves out the kernels' compiles (harness/lint.py
    `lint_before_run`)."""
    found = lint_before_run(task, settings, compiles=compiles)
    refuse_on_errors(task, found)
    for finding in found:
        print(f"{prefix}lint {finding.line()}", file=warnings_to, flush=True)


def _describe(made: NewTask, folder: Path, out: TextIO) -> None:
    task = made.task
    kinds = {kind: ", ".join(p.name for p in task.params if p.kind == kind) for kind in ("input", "output", "scalar")}
    said = "; ".join(f"{kind}s {names}" for kind, names in kinds.items() if names)
    print(f"wrote {folder} (task {task.name}, kernel {task.kernel_name}): {said}", file=out)
    print("cases: " + ", ".join(f"{c.name} ({c.role})" for c in task.cases), file=out)
    for line in made.plan.inferred:
        print(f"inferred: {line}", file=out)
    for name, proposal in made.tolerances.items():
        print(f"tolerance of {name}: {proposal.said()}", file=out)
    holdout = made.plan.proposed_holdout
    if made.holdout_proposed and holdout is not None:
        dims = ", ".join(f"{k}={v}" for k, v in holdout.dims.items())
        print(f"proposed holdout: {holdout.name} ({dims}; commented out at the end of task.toml: uncomment "
              "it to keep it)", file=out)


def new_task(folder: Path, *, description: str, signature: str, reference: Path, initial: Path,
             cases_file: Path, oracle: Path | None, name: str | None, out: TextIO) -> int:
    """`kernel-referee new-task DIR ...`: write the folder, say what was made and inferred, then lint it (the
    exit code is lint's: the folder is kept either way, to be edited)."""
    made = create_task(folder, description=description, signature=signature, cases_file=cases_file,
                       sources=Sources(reference=reference, initial=initial, oracle=oracle), name=name)
    _describe(made, folder, out)
    return print_findings(str(folder), with_compiles(made.task, lint_task(made.task)), out)
