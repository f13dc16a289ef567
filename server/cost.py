"""The cost sheet: what a run cost and when a faster kernel pays it back.

pilot cost          = engineer hours x hourly rate + model charges + GPU wall-clock hours x GPU hourly cost
saved GPU hours/mo  = ms saved end to end per invocation x invocations per month / 3,600,000
payback months      = pilot cost / (saved GPU hours per month x GPU hourly cost)

The milliseconds saved must be measured end to end after integration: a kernel's event-timed
latency is not what an application saves.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TextIO

from pydantic import BaseModel, Field

from server.record_files import read_history, read_summary

MS_PER_HOUR = 3_600_000


class CostInputs(BaseModel):
    engineer_hours: float = Field(ge=0)
    hourly_rate: float = Field(ge=0)
    model_cost: float = Field(ge=0)
    gpu_hour_cost: float = Field(ge=0)
    invocations_per_month: float = Field(ge=0)
    ms_saved_end_to_end: float = Field(ge=0)


class CostSheet(BaseModel):
    inputs: CostInputs
    run_wall_hours: float
    run_gpu_busy_hours: float
    engineering_cost: float
    gpu_cost: float
    pilot_cost: float
    saved_gpu_hours_per_month: float
    monthly_saving: float
    payback_months: float | None  # None when nothing is saved
    kernel_ms_saved: float | None  # from the run, for comparison only: not the end-to-end saving


def cost_sheet(inputs: CostInputs, run_wall_hours: float, run_gpu_busy_hours: float,
               kernel_ms_saved: float | None = None) -> CostSheet:
    engineering = inputs.engineer_hours * inputs.hourly_rate
    gpu = run_wall_hours * inputs.gpu_hour_cost  # the GPU is held for the whole run, busy or not
    pilot = engineering + inputs.model_cost + gpu
    saved_hours = inputs.ms_saved_end_to_end * inputs.invocations_per_month / MS_PER_HOUR
    monthly = saved_hours * inputs.gpu_hour_cost
    return CostSheet(inputs=inputs, run_wall_hours=run_wall_hours, run_gpu_busy_hours=run_gpu_busy_hours,
                     engineering_cost=engineering, gpu_cost=gpu, pilot_cost=pilot,
                     saved_gpu_hours_per_month=saved_hours, monthly_saving=monthly,
                     payback_months=pilot / monthly if monthly > 0 else None, kernel_ms_saved=kernel_ms_saved)


class CostError(ValueError):
    """A run folder whose files cannot give the cost sheet its hours; the message names the file and field."""


def _time(value: object, where: str) -> datetime:
    try:
        return datetime.fromisoformat(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise CostError(f"{where} is {'missing' if value is None else f'not an ISO time ({str(value)[:40]!r})'}; "
                        "the cost sheet needs it for the run's wall-clock hours") from None


def run_hours(run_dir: Path) -> tuple[float, float, float | None]:
    """(wall-clock hours from creation to the last summary, GPU-busy hours, kernel ms saved per call)."""
    try:
        run_json = json.loads((run_dir / "run.json").read_text())
        summary = read_summary(run_dir)
    except (OSError, ValueError) as exc:  # a pydantic ValidationError is a ValueError
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CostError(f"{run_dir}: run.json or summary.json cannot be read ({first})") from None
    created = _time(run_json.get("created") if isinstance(run_json, dict) else None, f"{run_dir}/run.json `created`")
    updated = _time(summary.updated, f"{run_dir}/summary.json `updated`")
    wall = (updated - created).total_seconds() / 3600
    baseline, best = (summary.baseline or {}).get("score_ms"), (summary.best or {}).get("score_ms")
    saved = baseline - best if baseline is not None and best is not None else None
    return wall, (summary.gpu_seconds or 0.0) / 3600, saved


def recorded_model_cost(run_dir: Path) -> tuple[float, int, int] | None:
    """(the sum of `usage.cost_usd` the client recorded with the run's attempts, the attempts that recorded one,
    the attempts); None when none did. A client that reports its spending spares typing it by hand."""
    try:
        attempts = [a for a in read_history(run_dir).attempts if a.attempt > 0]  # 0 is the baseline, no agent's
    except (OSError, ValueError) as exc:
        raise CostError(f"{run_dir}: history.json cannot be read ({type(exc).__name__})") from None
    costs = [float(a.usage["cost_usd"]) for a in attempts
             if a.usage and isinstance(a.usage.get("cost_usd"), (int, float)) and not isinstance(a.usage["cost_usd"], bool)]
    return (sum(costs), len(costs), len(attempts)) if costs else None


def model_cost_recorded(run_dir: Path, out: TextIO) -> float:
    """`cost`'s model charges without --model-cost: the recorded ones, said on `out`; a CostError without any."""
    recorded = recorded_model_cost(run_dir)
    if recorded is None:
        raise CostError(f"--model-cost is needed: no attempt of {run_dir} recorded usage.cost_usd")
    total, given, attempts = recorded
    print(f"model cost {total:.2f}: the usage.cost_usd recorded with {given} of {attempts} attempt(s) "
          "(--model-cost gives another)", file=out)
    return total


def render(sheet: CostSheet) -> str:
    i = sheet.inputs
    payback = "never (nothing saved)" if sheet.payback_months is None else f"{sheet.payback_months:.2f} months"
    kernel = "" if sheet.kernel_ms_saved is None else (
        f"\nThe run measured {sheet.kernel_ms_saved:.4f} ms saved per kernel call (geometric mean over its "
        "performance cases).")
    return (
        f"pilot cost            {sheet.pilot_cost:12.2f}  = engineering {sheet.engineering_cost:.2f} "
        f"({i.engineer_hours:g} h x {i.hourly_rate:g}) + model {i.model_cost:.2f} + GPU {sheet.gpu_cost:.2f} "
        f"({sheet.run_wall_hours:.3f} h held x {i.gpu_hour_cost:g}; {sheet.run_gpu_busy_hours:.4f} h busy)\n"
        f"saved GPU hours/month {sheet.saved_gpu_hours_per_month:12.4f}  = {i.ms_saved_end_to_end:g} ms x "
        f"{i.invocations_per_month:g} invocations / 3,600,000\n"
        f"monthly saving        {sheet.monthly_saving:12.2f}\n"
        f"payback               {payback}\n"
        "The saving uses the milliseconds saved END TO END per invocation, measured after integration; a "
        "kernel's event-timed latency is not what the application saves." + kernel)
