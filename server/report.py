"""A view of one run folder for the report, read defensively.

Reads summary.json and history.json through server/records.py, and lock.json, run.json,
events.jsonl, attempts/*.cu and, when present, replay.json; needs no GPU. A file that cannot be read
is a problem the report states, not a crash. The files it writes (report.html, heatmap.svg, heatmap.png) are derived
artefacts: they are not recorded in the audit log, so writing them again never breaks `verify`.
Everything agent-written (sources, rationales, usage, the finish reason) is carried as plain text
and escaped by the renderer.
"""

from __future__ import annotations

import difflib
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from server.cost import CostInputs, CostSheet, cost_sheet
from server.lock import locked_source
from server.record_files import read_history, read_summary
from server.records import AttemptRecord, CaseTimingRecord, HistoryFile, SpeedupRecord, SummaryFile, Verdict
from server.verify import verify_run

MAX_DIFF_LINES = 600
REJECTED = Verdict.REJECTED


@dataclass(frozen=True)
class CaseRow:
    """One case of an attempt in the report's tables."""

    case: str
    median_ms: float
    ci_low_ms: float | None
    ci_high_ms: float | None
    p10_ms: float | None
    p90_ms: float | None
    cv: float | None
    samples: int | None
    baseline_median_ms: float | None  # the baseline as measured beside this attempt, else attempt 0's
    speedup_vs_baseline: SpeedupRecord | None
    speedup_vs_best: SpeedupRecord | None

    @property
    def relative_to_baseline(self) -> float | None:
        if self.baseline_median_ms is None or self.baseline_median_ms <= 0:
            return None
        return self.median_ms / self.baseline_median_ms


@dataclass(frozen=True)
class ReasonView:
    code: str
    case: str | None
    detail: str


@dataclass
class AttemptView:
    number: int
    verdict: str
    reasons: list[ReasonView]
    rationale: str | None
    usage: dict[str, Any] | None
    parent: int | None
    score_ms: float | None
    speedup_vs_baseline: SpeedupRecord | None
    speedup_vs_best: SpeedupRecord | None
    cases: list[CaseRow]
    options: list[str]
    launch: Any
    resources: dict[str, Any] | None
    flags: list[str]
    source: str | None
    arithmetic: str | None = None  # the SASS instruction mix in one line (harness/worker_side/sass_mix.py)
    previous: int | None = None  # the attempt the diff is against
    diff: list[str] = field(default_factory=list)
    diff_truncated: bool = False
    is_best: bool = False
    disqualified: bool = False

    @property
    def rejected(self) -> bool:
        return self.verdict == REJECTED


@dataclass(frozen=True)
class ReplayDecision:
    decision: str | None  # "GO" or "NO-GO"; None when replay.json could not be read
    reasons: list[str]
    problem: str | None = None


@dataclass(frozen=True)
class CostView:
    wall_hours: float | None
    gpu_busy_hours: float | None
    kernel_ms_saved: float | None
    sheet: CostSheet | None


@dataclass(frozen=True)
class AuditView:
    ok: bool
    records: int
    head: str | None
    problems: list[str]


@dataclass
class RunReport:
    run_dir: Path
    run_name: str
    task: str
    status: str
    stop_reason: str | None
    created: str | None
    updated: str | None
    wall_seconds: float | None
    gpu_seconds: float | None
    compiles: int | None
    probes: int | None
    budget: dict[str, Any]
    settings: dict[str, Any]
    environment: dict[str, Any]
    lock: dict[str, Any]
    attempts: list[AttemptView]
    performance_cases: list[str]
    best_attempt: int | None
    best_speedup: SpeedupRecord | None
    rejections_by_kind: dict[str, int]
    holdout: dict[str, Any] | None
    disqualified: list[int]
    usage_totals: dict[str, float]
    event_counts: dict[str, int]
    calls_by_tool: dict[str, int]
    audit: AuditView
    replay: ReplayDecision | None
    cost: CostView
    problems: list[str]  # what could not be read, said in the report rather than hidden
    profiles: list[str] = field(default_factory=list)  # profile_kernel's full reports (profiles/pNNN.csv)


# -- defensive readers ------------------------------------------------------------------------

def _read_json(path: Path, problems: list[str]) -> Any:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError) as exc:
        problems.append(f"{path.name}: unreadable ({exc})")
        return None


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _record(read, run_dir: Path, name: str, problems: list[str]):
    """A record file read through server/record_files.py, or None with the problem noted."""
    try:
        return read(run_dir)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, ValidationError) as exc:  # ValidationError is a ValueError; named for the reader
        problems.append(f"{name}: unreadable ({str(exc).splitlines()[0]})")
        return None


def _speedup(value: SpeedupRecord | None) -> SpeedupRecord | None:
    """A speedup the report can show: one with a finite ratio."""
    return value if value is not None and _number(value.ratio) is not None else None


def _reasons(entry: AttemptRecord) -> list[ReasonView]:
    return [ReasonView(str(getattr(r.code, "value", r.code) or "?"), _text(r.case), str(r.detail or ""))
            for r in entry.reasons]


def _case_rows(timing: dict[str, CaseTimingRecord] | None, baseline_medians: dict[str, float]) -> list[CaseRow]:
    rows = []
    for name, row in (timing or {}).items():
        median = _number(row.median_ms)
        if median is None:
            continue
        stats = row.stats
        beside = _number(row.baseline_median_ms)
        rows.append(CaseRow(
            case=name, median_ms=median, ci_low_ms=_number(stats.ci_low_ms), ci_high_ms=_number(stats.ci_high_ms),
            p10_ms=_number(stats.p10_ms), p90_ms=_number(stats.p90_ms), cv=_number(stats.cv),
            samples=_int(stats.n), baseline_median_ms=beside if beside is not None else baseline_medians.get(name),
            speedup_vs_baseline=_speedup(row.speedup_vs_baseline), speedup_vs_best=_speedup(row.speedup_vs_best)))
    return rows


def _source(run_dir: Path, number: int) -> str | None:
    # The path is made here from the number, never taken from history.json.
    path = run_dir / "attempts" / f"{number:03d}.cu"
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return None


def _attempt(run_dir: Path, entry: AttemptRecord, baseline_medians: dict[str, float]) -> AttemptView:
    verdict = str(entry.verdict or "unknown")
    return AttemptView(
        number=entry.attempt, verdict=verdict, reasons=_reasons(entry), rationale=_text(entry.rationale),
        usage=entry.usage or None, parent=entry.parent, score_ms=_number(entry.score_ms),
        speedup_vs_baseline=_speedup(entry.speedup_vs_baseline), speedup_vs_best=_speedup(entry.speedup_vs_best),
        cases=[] if verdict == REJECTED else _case_rows(entry.timing, baseline_medians),
        options=list(entry.options or []), launch=entry.launch,
        resources=entry.compile.resources if entry.compile else None, flags=list(entry.flags or []),
        source=_source(run_dir, entry.attempt),
        arithmetic=entry.compile.mix.summary() if entry.compile and entry.compile.mix else None)


def _attach_diffs(attempts: list[AttemptView]) -> None:
    """Each attempt's unified diff against the source of the attempt recorded before it."""
    before: AttemptView | None = None
    for attempt in attempts:
        if before is not None and attempt.source is not None and before.source is not None:
            lines = list(difflib.unified_diff(before.source.splitlines(), attempt.source.splitlines(),
                                              f"attempts/{before.number:03d}.cu", f"attempts/{attempt.number:03d}.cu",
                                              lineterm=""))
            attempt.previous = before.number
            attempt.diff, attempt.diff_truncated = lines[:MAX_DIFF_LINES], len(lines) > MAX_DIFF_LINES
        if attempt.source is not None:
            before = attempt


def _events(run_dir: Path) -> tuple[dict[str, int], dict[str, int]]:
    kinds: Counter[str] = Counter()
    tools: Counter[str] = Counter()
    try:
        lines = (run_dir / "events.jsonl").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return {}, {}
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        kinds[str(record.get("kind"))] += 1
        if record.get("kind") == "call":
            tools[str(_dict(record.get("data")).get("tool"))] += 1
    return dict(kinds), dict(tools)


def _replay(run_dir: Path) -> ReplayDecision | None:
    """replay.json, written by `kernel-referee replay`: {"decision": "GO"|"NO-GO", "reasons": [str], ...}."""
    path = run_dir / "replay.json"
    if not path.exists():
        return None
    problems: list[str] = []
    data = _read_json(path, problems)
    if problems or not isinstance(data, dict):
        return ReplayDecision(None, [], problems[0] if problems else "replay.json: not a JSON object")
    decision = data.get("decision")
    reasons = data.get("reasons")
    reasons = [str(r) for r in reasons] if isinstance(reasons, list) else ([] if reasons is None else [str(reasons)])
    if decision not in ("GO", "NO-GO"):
        return ReplayDecision(None, reasons, f"replay.json: decision is {str(decision)[:80]!r}, not GO or NO-GO")
    return ReplayDecision(decision, reasons)


def _wall_seconds(created: Any, updated: Any) -> float | None:
    try:
        return (datetime.fromisoformat(str(updated)) - datetime.fromisoformat(str(created))).total_seconds()
    except ValueError:
        return None


def _usage_totals(attempts: list[AttemptView]) -> dict[str, float]:
    totals: Counter[str] = Counter()
    for attempt in attempts:
        for key, value in (attempt.usage or {}).items():
            if _number(value) is not None:
                totals[str(key)] += value
    return dict(totals)


def _cost(summary: SummaryFile, wall_seconds: float | None, inputs: CostInputs | None) -> CostView:
    wall = None if wall_seconds is None else wall_seconds / 3600
    gpu = _number(summary.gpu_seconds)
    busy = None if gpu is None else gpu / 3600
    base, best = (_number(_dict(view).get("score_ms")) for view in (summary.baseline, summary.best))
    saved = base - best if base is not None and best is not None else None
    sheet = cost_sheet(inputs, wall or 0.0, busy or 0.0, saved) if inputs is not None else None
    return CostView(wall, busy, saved, sheet)


def _lock_view(lock: dict) -> dict[str, Any]:
    return {"files_sha256": lock.get("files_sha256"),
            "referee_source_sha256": lock.get("referee_source_sha256", lock.get("harness_sha256")),
            "files": len(_dict(lock.get("files"))), "referee_source_modules": len(locked_source(lock) or {})}


def load_report(run_dir: Path, cost_inputs: CostInputs | None = None) -> RunReport:
    """Everything the report shows, from the run folder's files. Raises ValueError if it is no run folder."""
    run_dir = Path(run_dir)
    problems: list[str] = []
    history = _record(read_history, run_dir, "history.json", problems) or HistoryFile()
    entries = history.attempts
    if not entries:
        raise ValueError(f"{run_dir} is not a run folder with recorded attempts (no history.json entries)")
    summary = _record(read_summary, run_dir, "summary.json", problems) or SummaryFile()
    run_json = _dict(_read_json(run_dir / "run.json", problems))
    lock = _dict(_read_json(run_dir / "lock.json", problems))
    baseline = history.attempt(0) or entries[0]
    baseline_medians = {case: v for case, m in baseline.medians().items() if (v := _number(m)) is not None}
    attempts = sorted((_attempt(run_dir, e, baseline_medians) for e in entries), key=lambda a: a.number)
    _attach_diffs(attempts)
    best = summary.best_attempt
    disqualified = list(summary.disqualified or [])
    for attempt in attempts:
        attempt.is_best, attempt.disqualified = attempt.number == best, attempt.number in disqualified
    cases = list(dict.fromkeys(c.case for a in attempts for c in a.cases))
    rejections = Counter(a.reasons[0].code if a.reasons else "unknown" for a in attempts if a.rejected)
    wall = _wall_seconds(run_json.get("created"), summary.updated)
    kinds, tools = _events(run_dir)
    audit = verify_run(run_dir)
    return RunReport(
        run_dir=run_dir, run_name=summary.run or run_dir.name,
        task=summary.task or str(run_json.get("task") or "") or history.task or "?",
        status=summary.status or "unknown", stop_reason=summary.stop_reason,
        created=_text(run_json.get("created")), updated=summary.updated, wall_seconds=wall,
        gpu_seconds=_number(summary.gpu_seconds), compiles=summary.compiles, probes=summary.probes,
        budget=summary.budget or {}, settings=_dict(run_json.get("settings")),
        environment=_dict(lock.get("environment")) or summary.environment or {}, lock=_lock_view(lock),
        attempts=attempts, performance_cases=cases, best_attempt=best,
        best_speedup=_speedup(summary.speedup_vs_baseline), rejections_by_kind=dict(rejections),
        holdout=summary.holdout,
        disqualified=disqualified, usage_totals=_usage_totals(attempts), event_counts=kinds, calls_by_tool=tools,
        audit=AuditView(audit.ok, audit.records, audit.head, audit.problems), replay=_replay(run_dir),
        cost=_cost(summary, wall, cost_inputs), problems=problems,
        profiles=sorted(f"profiles/{p.name}" for p in (run_dir / "profiles").glob("p*.csv")))
