"""A typed view of one run folder, read defensively, and `write_report`: report.html and the heatmaps.

Reads summary.json, history.json, lock.json, run.json, events.jsonl, attempts/*.cu and, when present,
replay.json; needs no GPU. The files it writes (report.html, heatmap.svg, heatmap.png) are derived
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

from server.verify import verify_run
from server.cost import CostInputs, CostSheet, cost_sheet
from server.lock import locked_source
from server.records import Verdict

MAX_DIFF_LINES = 600
REJECTED = Verdict.REJECTED


@dataclass(frozen=True)
class Spread:
    """A speedup with its interval (from harness.stats.Speedup)."""
    ratio: float
    low: float | None
    high: float | None
    beyond_noise: bool


@dataclass(frozen=True)
class CaseLatency:
    case: str
    median_ms: float
    ci_low_ms: float | None
    ci_high_ms: float | None
    p10_ms: float | None
    p90_ms: float | None
    cv: float | None
    samples: int | None
    baseline_median_ms: float | None  # the baseline as measured beside this attempt, else attempt 0's
    speedup_vs_baseline: Spread | None
    speedup_vs_best: Spread | None

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
    speedup_vs_baseline: Spread | None
    speedup_vs_best: Spread | None
    cases: list[CaseLatency]
    options: list[str]
    launch: Any
    resources: dict[str, Any] | None
    flags: list[str]
    source: str | None
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
    best_speedup: Spread | None
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


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _spread(value: Any) -> Spread | None:
    value = _dict(value)
    ratio = _number(value.get("ratio"))
    if ratio is None:
        return None
    return Spread(ratio, _number(value.get("low")), _number(value.get("high")), value.get("beyond_noise") is True)


def _reasons(value: Any) -> list[ReasonView]:
    reasons = value if isinstance(value, list) else []
    return [ReasonView(str(r.get("code", "?")), _text(r.get("case")), str(r.get("detail", "")))
            for r in reasons if isinstance(r, dict)]


def _case_latencies(timing: Any, baseline_medians: dict[str, float]) -> list[CaseLatency]:
    rows = []
    for name, row in _dict(timing).items():
        row = _dict(row)
        stats = _dict(row.get("stats"))
        median = _number(stats.get("median_ms"))
        if median is None:
            continue
        beside = _number(_dict(row.get("baseline_stats")).get("median_ms"))
        rows.append(CaseLatency(
            case=str(name), median_ms=median, ci_low_ms=_number(stats.get("ci_low_ms")),
            ci_high_ms=_number(stats.get("ci_high_ms")), p10_ms=_number(stats.get("p10_ms")),
            p90_ms=_number(stats.get("p90_ms")), cv=_number(stats.get("cv")), samples=_int(stats.get("n")),
            baseline_median_ms=beside if beside is not None else baseline_medians.get(str(name)),
            speedup_vs_baseline=_spread(row.get("speedup_vs_baseline")),
            speedup_vs_best=_spread(row.get("speedup_vs_best"))))
    return rows


def _source(run_dir: Path, number: int) -> str | None:
    # The path is made here from the number, never taken from history.json.
    path = run_dir / "attempts" / f"{number:03d}.cu"
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return None


def _attempt(run_dir: Path, entry: dict, baseline_medians: dict[str, float]) -> AttemptView:
    number = _int(entry.get("attempt")) or 0
    verdict = str(entry.get("verdict") or "unknown")
    resources = _dict(entry.get("compile")).get("resources")
    usage = entry.get("usage") if isinstance(entry.get("usage"), dict) else None
    return AttemptView(
        number=number, verdict=verdict, reasons=_reasons(entry.get("reasons")),
        rationale=_text(entry.get("rationale")), usage=usage or None, parent=_int(entry.get("parent")),
        score_ms=_number(entry.get("score_ms")), speedup_vs_baseline=_spread(entry.get("speedup_vs_baseline")),
        speedup_vs_best=_spread(entry.get("speedup_vs_best")),
        cases=[] if verdict == REJECTED else _case_latencies(entry.get("timing"), baseline_medians),
        options=[str(o) for o in _list(entry.get("options"))],
        launch=entry.get("launch"), resources=resources if isinstance(resources, dict) else None,
        flags=[str(f) for f in _list(entry.get("flags"))], source=_source(run_dir, number))


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


def _cost(summary: dict, wall_seconds: float | None, inputs: CostInputs | None) -> CostView:
    wall = None if wall_seconds is None else wall_seconds / 3600
    gpu = _number(summary.get("gpu_seconds"))
    busy = None if gpu is None else gpu / 3600
    base, best = (_number(_dict(summary.get(k)).get("score_ms")) for k in ("baseline", "best"))
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
    history = _dict(_read_json(run_dir / "history.json", problems))
    entries = [e for e in _list(history.get("attempts")) if isinstance(e, dict)]
    if not entries:
        raise ValueError(f"{run_dir} is not a run folder with recorded attempts (no history.json entries)")
    summary = _dict(_read_json(run_dir / "summary.json", problems))
    run_json = _dict(_read_json(run_dir / "run.json", problems))
    lock = _dict(_read_json(run_dir / "lock.json", problems))
    baseline = next((e for e in entries if e.get("attempt") == 0), entries[0])
    baseline_medians = {case: v for case, row in _dict(baseline.get("timing")).items()
                        if (v := _number(_dict(_dict(row).get("stats")).get("median_ms"))) is not None}
    attempts = sorted((_attempt(run_dir, e, baseline_medians) for e in entries), key=lambda a: a.number)
    _attach_diffs(attempts)
    best = _int(summary.get("best_attempt"))
    disqualified = [n for n in _list(summary.get("disqualified")) if _int(n) is not None]
    for attempt in attempts:
        attempt.is_best, attempt.disqualified = attempt.number == best, attempt.number in disqualified
    cases = list(dict.fromkeys(c.case for a in attempts for c in a.cases))
    rejections = Counter(a.reasons[0].code if a.reasons else "unknown" for a in attempts if a.rejected)
    wall = _wall_seconds(run_json.get("created"), summary.get("updated"))
    kinds, tools = _events(run_dir)
    audit = verify_run(run_dir)
    return RunReport(
        run_dir=run_dir, run_name=str(summary.get("run") or run_dir.name),
        task=str(summary.get("task") or run_json.get("task") or history.get("task") or "?"),
        status=str(summary.get("status") or "unknown"), stop_reason=_text(summary.get("stop_reason")),
        created=_text(run_json.get("created")), updated=_text(summary.get("updated")), wall_seconds=wall,
        gpu_seconds=_number(summary.get("gpu_seconds")), compiles=_int(summary.get("compiles")),
        probes=_int(summary.get("probes")), budget=_dict(summary.get("budget")),
        settings=_dict(run_json.get("settings")),
        environment=_dict(lock.get("environment")) or _dict(summary.get("environment")), lock=_lock_view(lock),
        attempts=attempts, performance_cases=cases, best_attempt=best,
        best_speedup=_spread(summary.get("speedup_vs_baseline")), rejections_by_kind=dict(rejections),
        holdout=summary.get("holdout") if isinstance(summary.get("holdout"), dict) else None,
        disqualified=disqualified, usage_totals=_usage_totals(attempts), event_counts=kinds, calls_by_tool=tools,
        audit=AuditView(audit.ok, audit.records, audit.head, audit.problems), replay=_replay(run_dir),
        cost=_cost(summary, wall, cost_inputs), problems=problems)
