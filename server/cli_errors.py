"""The command line's one edge for failures: each becomes one line on stderr and its exit code, never a
traceback (README, "Exit codes")."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

from pydantic import ValidationError

from harness.footprint import DoesNotFit
from harness.oracle import OracleError
from harness.settings import ReferenceFailed
from harness.task_model import TaskError
from harness.worker_side.compile_policy import CompileRefused
from server.cli_args import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_PORT_IN_USE, EXIT_USAGE, UsageError
from server.executor import ExecutorError
from server.transport import PortInUse

# What a person can fix (an argument, a file, a folder, the task: its reference or oracle failing on a case, a
# reference that does not compile, a case too large for this machine): the usage exit code.
USER_ERRORS = (UsageError, TaskError, CompileRefused, OSError, ValueError, KeyError, ReferenceFailed, OracleError,
               ExecutorError, DoesNotFit)
MAX_LINE = 1000
_ROOT = Path(__file__).resolve().parents[1]


def one_line(exc: BaseException) -> str:
    """The exception's message on one line: pydantic's errors without their links, lines joined by '; '."""
    if isinstance(exc, ValidationError):
        errors = exc.errors(include_url=False)
        said = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in errors[:3])
        text = f"{exc.title}: {said}" + (f" (and {len(errors) - 3} more)" if len(errors) > 3 else "")
    elif isinstance(exc, KeyError) and len(exc.args) == 1:
        text = f"{exc.args[0]!r} is missing"
    else:
        text = ""
        for line in (line.strip() for line in str(exc).splitlines() if line.strip()):
            text += ("" if not text else " " if text.endswith(":") else "; ") + line  # "log:" runs on into the log
        text = text or type(exc).__name__
    return text if len(text) <= MAX_LINE else text[:MAX_LINE - 1] + "…"


def innermost(exc: BaseException) -> BaseException:
    """The first error inside exception groups (anyio's task groups wrap what a session raised)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    path = Path(frames[-1].filename)
    shown = path.relative_to(_ROOT) if path.is_relative_to(_ROOT) else path.name
    return f" (at {shown}:{frames[-1].lineno})"


def failed(prog: str, exc: BaseException) -> int:
    """Say what went wrong in one line on stderr; the exit code for its kind."""
    error = innermost(exc)
    if isinstance(error, SystemExit):
        raise error
    if isinstance(error, KeyboardInterrupt):
        message, code = "interrupted", EXIT_INTERRUPTED
    elif isinstance(error, PortInUse):
        message, code = one_line(error), EXIT_PORT_IN_USE
    elif isinstance(error, USER_ERRORS):
        message, code = one_line(error), EXIT_USAGE
    else:
        message = f"internal error (a bug in kernel-referee): {type(error).__name__}: {one_line(error)}{_where(error)}"
        code = EXIT_INTERNAL
    print(f"{prog}: {message}", file=sys.stderr, flush=True)
    return code
