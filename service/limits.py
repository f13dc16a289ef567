"""A team's limits (service/settings.py `TeamLimits`) against the runs it has: what refuses one more."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from service.records import RunRecord, RunState
from service.settings import TeamLimits

DAY_S = 86400


def limit_refusal(records: Iterable[RunRecord], limits: TeamLimits, team: str, budget: int) -> str | None:
    """Why a new run of `budget` attempts for `team` would pass one of its limits; None where it would not. A run
    failed before it had a GPU counts against no limit."""
    mine = [r for r in records if r.team == team]
    queued = sum(r.state in (RunState.CREATED, RunState.QUEUED) for r in mine)
    mine = [r for r in mine if not (r.state is RunState.FAILED and r.started_at is None)]  # never had a GPU
    if queued >= limits.max_queued_runs:
        return f"team {team!r} has {queued} runs waiting (at most {limits.max_queued_runs})"
    now = datetime.now().astimezone()
    today = sum(r.max_attempts for r in mine if (now - datetime.fromisoformat(r.created)).total_seconds() < DAY_S)
    if today + budget > limits.max_attempts_per_day:
        return (f"team {team!r} has {today} attempts budgeted in the last 24 hours; {budget} more "
                f"would pass its {limits.max_attempts_per_day} a day")
    return None
