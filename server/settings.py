"""The referee's settings, declared once: the run's budget and timing protocol, the sandbox, the transport.

The command line builds a RefereeSettings from its arguments and reads its defaults from here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from harness.compile_service import DEFAULT_DEADLINE_S
from sandbox.confine import unavailable_reason
from server.run import RunSettings


class RefereeSettings(BaseModel):
    run: RunSettings = RunSettings()
    confine: bool = True  # workers run under Landlock, a network namespace and rlimits unless --no-sandbox
    transport: Literal["stdio", "http"] = "stdio"
    host: str = "127.0.0.1"  # HTTP only; loopback by default
    port: int = 8765  # HTTP only
    results: Path = Path("results")  # where new runs go
    compile_deadline_s: float = DEFAULT_DEADLINE_S  # a compile worker still busy after this is killed


def sandbox_refusal(confine: bool) -> str | None:
    """Workers are confined unless asked not to be; where Landlock is missing, say so and stop."""
    if not confine:
        return None
    reason = unavailable_reason()
    return None if reason is None else (
        f"workers cannot be confined: {reason}. Run on a kernel with Landlock (Linux >= 6.7 for TCP rules), "
        "or pass --no-sandbox to run them unconfined (recorded in the run's lock.json).")
