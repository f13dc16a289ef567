"""`kernel-referee lint TASK`: is this task worth refereeing? On the CPU, no GPU needed.

Loading the task (harness/task.py) already checks the manifest whole, every launch on every case included.
Lint then refuses a degenerate task, one a kernel computing nothing would pass (harness/lint_outputs.py,
with the task's float64 oracle on its correctness cases), or one whose tolerance lets a TF32 or float16
version of the computation through, or whose cases do not fit the machine (harness/lint_sizes.py): each is
an error. What makes a run less telling without making it meaningless is a warning: a performance case too
small to time, no holdout case, no oracle (then the output checks cannot run, and the warning says so),
a case too large for the recorded device.

`serve` and `check` run `lint_before_run` first: the same checks, except the device memory (they read the
real device) and the oracle on correctness cases larger than CHEAP_ORACLE_ELEMENTS.
"""

from __future__ import annotations

import math
from pathlib import Path

from harness.lint_compile import compile_findings, with_compiles
from harness.lint_cases import one_valued_inputs, repeated_holdouts
from harness.lint_findings import Finding, errors, warning
from harness.lint_outputs import output_findings
from harness.lint_sizes import RECORDED_H200, DeviceFigures, host_memory_bytes, too_large, too_small
from harness.settings import TimingSettings
from harness.task import load_task
from harness.task_model import Case, Task

CHEAP_ORACLE_ELEMENTS = 1 << 22   # array elements of a correctness case the pre-run lint gives the oracle
LARGE_ORACLE_ELEMENTS = 1 << 26   # array elements of a performance or holdout case lint gives the oracle
OUTPUT_CHECKS = "zero, constant, equal to an input, seed-insensitive outputs and the TF32/float16 tolerance"
_SAME_HOST = object()


def _case_elements(task: Task, case: Case) -> int:
    return sum(math.prod(shape) for shape in task.shapes(case.dims).values())


def _affordable(task: Task, cases: list[Case], element_limit: int | None) -> tuple[list[Case], list[str]]:
    kept = [c for c in cases if element_limit is None or _case_elements(task, c) <= element_limit]
    return kept, [c.name for c in cases if c not in kept]


def _oracle_cases(task: Task, element_limit: int | None) -> tuple[list[Case], list[Finding]]:
    """The cases the oracle runs on (correctness ones, then performance and holdout ones up to
    LARGE_ORACLE_ELEMENTS), and a warning for what could not be checked."""
    if task.oracle_file is None:
        return [], [warning("no-oracle", f"the task has no oracle (task.toml `oracle`): {OUTPUT_CHECKS} could "
                                         "not be checked (lint computes outputs with the oracle only); the holdout "
                                         "and replay will have no independent oracle")]
    cases, skipped = _affordable(task, list(task.correctness_cases), element_limit)
    found = [] if task.correctness_cases else [
        warning("no-correctness-case", f"the task has no correctness case: {OUTPUT_CHECKS} ran on none")]
    if skipped:
        found.append(warning("oracle-skipped", f"correctness case(s) {', '.join(skipped)} over {element_limit} "
                                               "elements: not given to the oracle here (`kernel-referee lint` "
                                               "checks them)"))
    limit = min(element_limit or LARGE_ORACLE_ELEMENTS, LARGE_ORACLE_ELEMENTS)
    others, too_large_here = _affordable(task, [*task.performance_cases, *task.holdout_cases], limit)
    if too_large_here and element_limit is None:  # before a run, only the cheap ones are meant to be checked
        found.append(warning("oracle-skipped", f"case(s) {', '.join(too_large_here)} over {limit} elements: not "
                                               "given to the oracle, no stand-in was judged on them"))
    return cases + others, found


def lint_task(task: Task, *, settings: TimingSettings | None = None, host_memory=_SAME_HOST,
              figures: DeviceFigures | None = RECORDED_H200, oracle_element_limit: int | None = None) -> list[Finding]:
    """Every finding on `task`, errors first. `host_memory`: bytes of host memory (default: this machine's);
    `figures`: the device's figures (default: the recorded H200; None skips the device memory check)."""
    settings = settings or TimingSettings()
    memory = host_memory_bytes() if host_memory is _SAME_HOST else host_memory
    cases, found = _oracle_cases(task, oracle_element_limit)
    found += repeated_holdouts(task)
    found += one_valued_inputs(task, _affordable(task, list(task.correctness_cases), oracle_element_limit)[0])
    found += output_findings(task, cases)
    if not task.holdout_cases:
        found.append(warning("no-holdout", "the task has no holdout case: the final check sees nothing the agent "
                                           "has not seen, and a replay cannot say GO"))
    found += too_small(task, figures or RECORDED_H200)
    found += too_large(task, settings, memory, figures)
    return errors(found) + [f for f in found if f.severity != "error"]


def lint_folder(path: str | Path, **options) -> tuple[Task, list[Finding]]:
    """Load the task (a TaskError for a manifest that does not load) and lint it."""
    task = load_task(path)
    return task, with_compiles(task, lint_task(task, **options))


def lint_before_run(task: Task, settings: TimingSettings, compiles: bool = True) -> list[Finding]:
    """The part `serve` and `check` run first: no memory checks (they measure the device and this machine's
    available memory themselves, harness/footprint.py), the oracle on correctness cases up to
    CHEAP_ORACLE_ELEMENTS; the reference's and initial kernel's compiles unless `compiles` is False (`serve` on a
    GPU has them checked first thing in the run's preparation, behind its `initialize` answer)."""
    found = lint_task(task, settings=settings, host_memory=None, figures=None,
                      oracle_element_limit=CHEAP_ORACLE_ELEMENTS)
    return with_compiles(task, found) if compiles else found


class LintRefused(ValueError):
    """A task with lint errors, refused before a run or a check starts; the message is one line."""

    def __init__(self, task: Task, found: list[Finding]):
        wrong = errors(found)
        more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        super().__init__(f"refused: task {task.name} fails lint: {wrong[0].line()}{more}; "
                         f"`kernel-referee lint {task.root}` lists every finding")
        self.findings = found


def refuse_on_errors(task: Task, found: list[Finding]) -> None:
    if errors(found):
        raise LintRefused(task, found)


def refuse_uncompilable(task: Task) -> None:
    """A LintRefused where the task's reference or initial kernel does not compile, or does not define the
    signature's kernel (harness/lint_compile.py); the lint's compiles alone, in a compile worker of their own."""
    refuse_on_errors(task, compile_findings(task))
