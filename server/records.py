"""The run's record, typed: the verdicts, the audit log's event kinds, history.json's attempts and summary.json.

Every reader and writer of those files goes through these models (server/record_files.py reads and writes
them). The on-disk format is the one the dicts had, byte for byte, so that old run folders still verify,
replay and render:

- a key is written when it was set (given to the constructor, read from the file, or assigned later), with
  its value, None included; a key never set is left out, as the dicts left it out;
- keys keep the order in which they were first set, as a dict's do: a record read from a file is written
  back in the file's order, and a new one in the order its writer set its keys;
- keys these models do not know are kept (`extra="allow"`) and written back where they were;
- a verdict or reason code that is not one of today's (an older or newer referee's) is kept as its string
  rather than refused: a run folder is evidence, and a reader must not lose or reject part of it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_serializer, model_validator

from harness.results import ReasonCode
from harness.worker_side.sass_mix import InstructionMix

Number = float | int  # an int read from a file stays an int: written back as it was


class Verdict(StrEnum):
    BASELINE = "baseline"
    VALID_FASTER = "valid-faster"
    VALID_NOT_FASTER = "valid-not-faster"
    REJECTED = "rejected"

    @property
    def valid(self) -> bool:
        return self is not Verdict.REJECTED


class EventKind(StrEnum):
    """Every kind of record the audit log (events.jsonl) holds."""

    RUN_CREATED = "run_created"
    RUN_RESUMED = "run_resumed"
    EXPECTED_OUTPUTS_WRITTEN = "expected_outputs_written"
    FILE_WRITTEN = "file_written"
    CALL = "call"
    TAMPER = "tamper"
    COMPILED = "compiled"
    PROBE_DONE = "probe_done"
    ATTEMPT_STARTED = "attempt_started"
    ATTEMPT_DONE = "attempt_done"
    ATTEMPT_INTERRUPTED = "attempt_interrupted"
    BASELINE_DONE = "baseline_done"
    BEYOND_PHYSICAL_LIMIT = "beyond_physical_limit"
    FLAGGED = "flagged"
    DISQUALIFIED = "disqualified"
    FINISHED = "finished"
    LOG_REPAIRED = "log_repaired"
    COMPILE_CHARGED = "compile_charged"  # a compile counted against the rate limit: a resumed run counts it again
    REVIEWED = "reviewed"  # a reviewer replayed, approved or rejected the finished run (the audit service)


# Kept as the string when it is not one of today's values (see the module's docstring).
VerdictText = Annotated[Verdict | str, Field(union_mode="left_to_right")]
ReasonCodeText = Annotated[ReasonCode | str, Field(union_mode="left_to_right")]
EventKindText = Annotated[EventKind | str, Field(union_mode="left_to_right")]


class Record(BaseModel):
    """A JSON object of a run folder: the keys that were set, in the order they were first set."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)
    _order: list[str] = PrivateAttr(default_factory=list)

    @model_validator(mode="wrap")
    @classmethod
    def _remember_order(cls, data: Any, handler):
        record = handler(data)
        if isinstance(data, dict) and isinstance(record, Record):
            record._order = [str(key) for key in data]
        return record

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if not name.startswith("_") and name not in self._order:
            self._order.append(name)

    @model_serializer(mode="wrap")
    def _set_keys_in_order(self, handler) -> dict[str, Any]:
        data = handler(self)
        present = self.model_fields_set | set(self.__pydantic_extra__ or ())
        keys = [k for k in self._order if k in present] + [k for k in data if k in present and k not in self._order]
        return {k: data[k] for k in keys if k in data}

    def has(self, key: str) -> bool:
        """Whether the file (or the writer) set this key."""
        return key in self.model_fields_set or key in (self.__pydantic_extra__ or {})

    def update(self, **fields: Any) -> None:
        for key, value in fields.items():
            setattr(self, key, value)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class StatsRecord(Record):
    """harness.stats.LatencyStats as written."""

    n: int | None = None
    median_ms: Number | None = None
    mean_ms: Number | None = None
    min_ms: Number | None = None
    max_ms: Number | None = None
    p10_ms: Number | None = None
    p90_ms: Number | None = None
    stdev_ms: Number | None = None
    cv: Number | None = None
    ci_low_ms: Number | None = None
    ci_high_ms: Number | None = None
    confidence: Number | None = None


class SpeedupRecord(Record):
    """harness.stats.Speedup as written."""

    ratio: Number | None = None
    low: Number | None = None
    high: Number | None = None
    beyond_noise: bool | None = None


class ReasonRecord(Record):
    """harness.results.Reason as written."""

    code: ReasonCodeText | None = None
    case: str | None = None
    detail: str | None = None


class CaseTimingRecord(Record):
    """One performance case of an attempt, timed side by side with the best and the baseline."""

    stats: StatsRecord | None = None
    samples_ms: list[Number] | None = None
    achieved_gbps: Number | None = None
    achieved_tflops: Number | None = None
    roofline_ms: Number | None = None
    roofline_fraction: Number | None = None
    clock: str | None = None
    event_median_ms: Number | None = None
    inputs: str | None = None             # "fresh": every timed launch drew new inputs from a secret key
    audited_launches: int | None = None   # timed launches compared in full with the reference's output
    # at most this chance that a kernel wrong on more than half of the case's timed launches passed every audit
    audit_escape_bound: Number | None = None
    baseline_stats: StatsRecord | None = None
    best_stats: StatsRecord | None = None
    speedup_vs_baseline: SpeedupRecord | None = None
    speedup_vs_best: SpeedupRecord | None = None
    # by kernel label: why a yardstick's timing (the baseline, the best) was taken as measured, its shape alone refused
    shape_waived: dict[str, list[str]] | None = None

    @property
    def median_ms(self) -> Number | None:
        return self.stats.median_ms if self.stats else None

    @property
    def baseline_median_ms(self) -> Number | None:
        return self.baseline_stats.median_ms if self.baseline_stats else None


class CompileRecord(Record):
    ok: bool | None = None
    compile_ms: Number | None = None
    cache_hit: bool | None = None
    log: str | None = None
    resources: dict[str, Any] | None = None
    mix: InstructionMix | None = None  # the CUBIN's SASS instruction mix (harness/worker_side/sass_mix.py)


class AttemptRecord(Record):
    """One entry of history.json: an attempt (0 is the baseline) and how it was judged."""

    attempt: int
    candidate: str | None = None
    started: str | None = None
    finished: str | None = None
    source_file: str | None = None
    source_sha256: str | None = None
    options: list[str] | None = None
    launch: dict[str, Any] | None = None
    verdict: VerdictText | None = None
    reasons: list[ReasonRecord] = Field(default_factory=list)
    compile: CompileRecord | None = None
    validation: dict[str, Any] | None = None
    timing: dict[str, CaseTimingRecord] | None = None
    score_ms: Number | None = None
    speedup_vs_baseline: SpeedupRecord | None = None
    speedup_vs_best: SpeedupRecord | None = None
    physical_limit: dict[str, Any] | None = None
    flags: list[str] | None = None
    reverification: dict[str, Any] | None = None
    rationale: str | None = None
    usage: dict[str, Any] | None = None
    parent: int | None = None
    vendor: dict[str, Any] | None = None  # the baseline's: the vendor library timed beside it

    @property
    def rejected(self) -> bool:
        return self.verdict == Verdict.REJECTED

    @property
    def valid(self) -> bool:
        """Judged and not rejected: the baseline, or a valid attempt (faster or not)."""
        return self.verdict in (Verdict.BASELINE, Verdict.VALID_FASTER, Verdict.VALID_NOT_FASTER)

    def case_timing(self, case: str) -> CaseTimingRecord | None:
        return (self.timing or {}).get(case)

    def median_ms(self, case: str) -> Number | None:
        """The attempt's median on `case`; None when it was not timed there."""
        row = self.case_timing(case)
        return row.median_ms if row else None

    def medians(self) -> dict[str, Number]:
        """Every timed case's median."""
        return {name: row.median_ms for name, row in (self.timing or {}).items() if row.median_ms is not None}

    def stats(self) -> dict[str, StatsRecord]:
        return {name: row.stats for name, row in (self.timing or {}).items() if row.stats is not None}

    def first_reason_code(self) -> str | None:
        """The code of the first reason, as written (summary.json counts rejections by it)."""
        code = self.reasons[0].code if self.reasons else None
        return code.value if isinstance(code, ReasonCode) else code

    def latency_view(self) -> dict[str, Any]:
        """What summary.json shows of an attempt: its score and, per case, the median and its interval."""
        return {"attempt": self.attempt, "score_ms": self.score_ms,
                "cases": {name: {k: getattr(row.stats, k) for k in ("median_ms", "ci_low_ms", "ci_high_ms", "cv")}
                          for name, row in (self.timing or {}).items()}}


class HistoryFile(Record):
    """history.json: every attempt, in attempt order."""

    task: str | None = None
    attempts: list[AttemptRecord] = Field(default_factory=list)

    def attempt(self, number: int) -> AttemptRecord | None:
        return next((a for a in self.attempts if a.attempt == number), None)


class SummaryFile(Record):
    """summary.json: the run so far (the run keeps it in memory and rewrites it after every change)."""

    vendor: dict[str, Any] | None = None
    best_attempt: int | None = None
    task: str | None = None
    run: str | None = None
    status: str | None = None
    updated: str | None = None
    stop_reason: str | None = None
    budget: dict[str, Any] | None = None
    best: dict[str, Any] | None = None
    baseline: dict[str, Any] | None = None
    speedup_vs_baseline: SpeedupRecord | None = None
    attempts: dict[str, Any] | None = None
    rejections_by_reason: dict[str, int] | None = None
    gpu_seconds: Number | None = None
    compiles: int | None = None
    probes: int | None = None
    environment: dict[str, Any] | None = None
    chain_head: str | None = None
    chain_seq: int | None = None  # the seq of the record chain_head names
    holdout: dict[str, Any] | None = None
    disqualified: list[int] | None = None

    @property
    def finished(self) -> bool:
        return self.status == "finished"

    @property
    def best_number(self) -> int:
        """The best attempt's number: the baseline (0) until another is best."""
        return self.best_attempt if self.best_attempt is not None else 0


# Where a holdout result is shown for a task without a float64 oracle (summary.json's holdout `oracle_used`).
NO_INDEPENDENT_ORACLE = "no independent oracle"


def holdout_oracle_words(holdout: dict[str, Any]) -> str:
    """The holdout's check against the float64 oracle, in the words every report uses. A run from before
    `oracle_used` was recorded says what it recorded."""
    if holdout.get("oracle_used") is False:
        return f"{NO_INDEPENDENT_ORACLE} (the task declares none): checked against the reference's outputs only"
    said = {True: "passed", False: "failed"}.get(holdout.get("oracle_passed"))
    skipped = [str(name) for name in holdout.get("oracle_skipped") or []]
    cases = holdout.get("cases") or []
    if said is None and skipped and len(skipped) >= len(cases):
        return "not run: every holdout case is too large for the host's oracle"
    if said is None and holdout.get("oracle_used"):
        return "not run: the check against the reference's outputs failed first"
    if said and skipped:
        return f"{said}; not run on {', '.join(skipped)} (too large for the host's oracle)"
    return said or "—"


class EventRecord(Record):
    """One line of events.jsonl (server/audit.py writes and chains them)."""

    seq: int | None = None
    time: str | None = None
    kind: EventKindText | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    prev: str | None = None
    hash: str | None = None
