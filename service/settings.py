"""The service's settings, declared once; the command line reads its defaults from here."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from server.transport import base_url


class TeamLimits(BaseModel):
    """What one team (a token's owner) may have at once: runs waiting in the queue, and attempts a day (each run's
    budget counts, from its creation, against its team's last 24 hours)."""

    max_queued_runs: int = 4
    max_attempts_per_day: int = 70


class ServiceSettings(BaseModel):
    root: Path
    host: str = "127.0.0.1"
    port: int = 8000
    limits: TeamLimits = TeamLimits()
    default_max_attempts: int = 7   # the seed's seven-attempt audit
    expected_run_s: float = 1800.0  # a run's length assumed for the expected wait, until finished runs say better
    scheduler_period_s: float = 0.25
    slots_refresh_s: float = 10.0  # how often a cluster's GPUs are counted again (--ray: nodes join and leave)

    @property
    def base_url(self) -> str:
        return base_url(self.host, self.port)

    @property
    def intake_dir(self) -> Path:
        """Submissions being unpacked and linted (service/submit.py); nothing there outlives a restart."""
        return self.root / "intake"

    def mcp_url(self, run_id: str) -> str:
        """A run's MCP endpoint: the audience its agent token is bound to."""
        return f"{self.base_url}/runs/{run_id}/mcp"
