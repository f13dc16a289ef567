"""The installed command line, run as a person runs it: a real process, its exit code, stdout and stderr."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cli_command() -> list[str]:
    """The `kernel-referee` console script beside this interpreter, else `python -m server.cli`: never a
    path fixed to one checkout's virtual environment."""
    script = Path(sys.executable).with_name("kernel-referee")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "server.cli"]


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*cli_command(), *map(str, args)], cwd=cwd or REPO, capture_output=True, text=True,
                          timeout=timeout)


def one_line_error(done: subprocess.CompletedProcess) -> str:
    """The single line a failed command wrote on stderr (asserting there is exactly one, and no traceback)."""
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]
