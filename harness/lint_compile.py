"""Lint's compiles: the task's reference and initial kernels through NVRTC, on the CPU, confined as `serve`
compiles them (harness/compile_service.py), and the signature's kernel name against the kernels the sources
define.

A task whose reference does not compile, or whose signature names a kernel the sources do not define, cannot
be refereed at all; without these checks it passed lint and was found out only on a GPU machine.
"""

from __future__ import annotations

import re

from harness.compile_service import CompileService
from harness.lint_findings import Finding, error, errors, warning
from harness.task_model import Task
from harness.worker_side.compile_policy import DEFAULT_ARCH, CompileRefused, CompileResult
from sandbox.confine import unavailable_reason

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\s*\([^)]*\)")
# `__global__`, then the return type and qualifiers (no parenthesis, brace or semicolon), then the name and `(`.
_KERNEL = re.compile(r"\b__global__\b[^;{}()]*?\b([A-Za-z_]\w*)\s*\(")
_MAX_ERROR_CHARS = 300


def defined_kernels(source: str) -> list[str]:
    """The names of the `__global__` functions a CUDA source defines or declares, in order, once each."""
    text = _LAUNCH_BOUNDS.sub("", _COMMENT.sub(" ", source))
    return list(dict.fromkeys(_KERNEL.findall(text)))


def _first_error(log: str) -> str:
    """The compile log's first line that says `error`, else its first line: what a person fixes first."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    chosen = next((line for line in lines if "error" in line.lower()), lines[0] if lines else "no log")
    return chosen if len(chosen) <= _MAX_ERROR_CHARS else chosen[:_MAX_ERROR_CHARS] + " [...]"


def _finding(task: Task, file: str, source: str, result: CompileResult) -> Finding | None:
    if result.ok:
        return None
    defined = defined_kernels(source)
    if task.kernel_name not in defined:
        said = f"defines {', '.join(defined)}" if defined else "defines no __global__ function"
        return error("kernel-name", f"the signature names kernel {task.kernel_name!r}, but {file} {said}: "
                                    "kernel.name and the signature must name the kernel the sources define")
    return error("compile", f"{file} does not compile for {result.arch}: {_first_error(result.full_log)}")


def compile_findings(task: Task, *, confine: bool = True, arch: str = DEFAULT_ARCH) -> list[Finding]:
    """An error for each of the task's own kernels that does not compile, or does not define the signature's
    kernel; a warning where the compile worker cannot be confined here (then nothing is compiled)."""
    if confine and (reason := unavailable_reason()) is not None:
        return [warning("compile-skipped", f"the reference and initial kernels were not compiled: the compile "
                                           f"worker cannot be confined on this machine ({reason})")]
    found = []
    with CompileService(confine=confine) as compiler:
        for which, file in (("reference", task.reference_file), ("initial", task.initial_file)):
            source = task.source(which)
            try:
                result = compiler.compile(source, task.kernel_name, arch=arch)
            except CompileRefused as exc:
                found.append(error("compile", f"{file} is refused by the compile policy: {exc}"))
                continue
            if (finding := _finding(task, file, source, result)) is not None:
                found.append(finding)
    return found


def with_compiles(task: Task, found: list[Finding]) -> list[Finding]:
    """`found` with the compile findings of `task`, errors first (a kernel that does not compile first of all)."""
    every = compile_findings(task) + found
    return errors(every) + [f for f in every if f.severity != "error"]
