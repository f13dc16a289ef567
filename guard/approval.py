"""An approval: one kernel a team accepted, with everything the guard needs to hold later runs to it.

The kernel (its source, compile options and launch), the task it solves (copied, hashed), the baseline
kernel it is timed beside, the accepted latency per performance case (its median, interval, spread and the
samples' summary, the baseline's, and the ratio between them), the environment it was measured in, and its
provenance (the run it comes from, that run's chain head and key, the replay's decision, who approved it,
when, why, and whether the approval was forced past a failing check).

The approval is the predicate of an in-toto Statement signed in a DSSE envelope (guard/signing.py); the
files it names lie beside it in the store (guard/store.py), each held to its sha256.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from guard.fingerprint import Fingerprint
from harness.stats import LatencyStats, Speedup

# The approval's own predicate type: a URI the project owns, versioned so that a later form is told apart.
PREDICATE_TYPE = "https://kernel-referee.dev/approval/v1"
SCHEMA_VERSION = 1
KERNEL_FILE = "kernel.cu"
BASELINE_FILE = "baseline.cu"
TASK_FOLDER = "task"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")


class ApprovedKernel(_Frozen):
    """A kernel as the approval holds it: its file in the approval's folder and how it is compiled and launched."""

    file: str  # relative to the approval's folder: kernel.cu or baseline.cu
    sha256: str
    attempt: int  # its attempt in the run (0: the task's baseline)
    options: list[str] = []
    launch: dict  # harness.task_model.LaunchSpec as JSON


class TaskCopy(_Frozen):
    """The task, copied into the approval's folder under task/: every file with its sha256."""

    name: str
    files: dict[str, str]  # path relative to the approval's folder (task/...) -> sha256
    sha256: str  # of the sorted "path sha256" lines: the task as one digest


class AcceptedRatio(_Frozen):
    """One case's accepted ratio, the kernel's latency over its baseline's, measured as the guard measures it:
    interleaved rounds of a timing job of each, the Hodges-Lehmann estimate of the rounds' log ratios and its
    signed-rank interval (guard/verdict.py). Its interval counts the shift between jobs, which the run's speedup
    interval (the samples of its jobs merged) leaves out."""

    estimate: float = Field(gt=0.0)
    low: float = Field(gt=0.0)
    high: float = Field(gt=0.0)
    confidence: float = Field(gt=0.0, lt=1.0)
    rounds: int = Field(ge=1)  # the rounds kept, each one job of the kernel and one of its baseline
    set_aside: dict[str, int] = {}  # rounds not counted, by reason (another process, throttling)
    # per kernel ("baseline"; "candidate" where it is the task's own), the rounds (set-aside ones among them) whose
    # timing of it was taken as measured though its launches' shape was refused (a yardstick's, timing_shape.py)
    shape_waived: dict[str, int] = {}

    @model_serializer(mode="wrap")
    def _waivers_where_any(self, handler):
        """`shape_waived` is written only where a round took one: an approval without it stays readable by a guard
        that predates the field (the models forbid unknown fields)."""
        data = handler(self)
        if not data.get("shape_waived"):
            data.pop("shape_waived", None)
        return data


class RatioMeasurement(_Frozen):
    """Where the accepted ratios the guard holds later runs to come from."""

    source: Literal["guard-rounds", "run"]  # guard-rounds: each case's `ratio`; run: the run's own timing
    rounds: int | None = None  # the most rounds a case kept (guard-rounds; each case's own: its ratio's `rounds`)
    gpu: str | None = None  # the GPU that measured them (guard-rounds)
    gpu_uuid: str | None = None
    measured_at: str | None = None
    why: str | None = None  # why the run's were taken (approve --from-run), or what made these rounds


class CaseLatency(_Frozen):
    """One performance case's accepted latency: the kernel's and the baseline's distributions and their ratio."""

    case: str
    kernel: LatencyStats
    baseline: LatencyStats | None = None
    speedup: Speedup | None = None  # baseline median / kernel median, with its interval
    samples_ms: list[float] = []  # the kernel's accepted samples, as the run recorded them
    clock: str | None = None  # which clock timed them (harness/settings.py TimingSettings.clock)
    # The ratio the guard holds later runs to, from interleaved rounds; None: the run's medians and speedup interval
    ratio: AcceptedRatio | None = None


class ReplayDecision(_Frozen):
    """The replay of the run's kernel that the approval rests on (server/replay.py)."""

    decision: Literal["GO", "NO-GO", "none"]  # none: no replay was made (only with force)
    reasons: list[str] = []
    document: str | None = None  # replay.json or replay-attempt-NNN.json in the run folder
    document_sha256: str | None = None
    replayed_at: str | None = None
    gpu: str | None = None


class Provenance(_Frozen):
    """Where the approval comes from and who took it."""

    run: str  # the run folder's name
    task: str
    chain_head: str  # the run's audit log head when it was approved
    chain_records: int
    run_key_fingerprint: str | None  # None: a run made before signing (only with force)
    replay: ReplayDecision
    approver: str
    approved_at: str
    note: str | None = None
    forced: bool = False
    forced_over: list[str] = []  # what force overrode, in words: a failed replay, a run that does not verify


class Approval(_Frozen):
    """The predicate of an approval's statement."""

    schema_version: Literal[1] = SCHEMA_VERSION
    name: str
    task: TaskCopy
    kernel: ApprovedKernel
    baseline: ApprovedKernel
    cases: list[CaseLatency]
    speedup: Speedup | None = None  # the geometric mean over the cases, as the run recorded it
    timing: dict = {}  # the run's TimingSettings as JSON: the protocol the latencies were taken with
    timing_rounds: int | None = None
    # Where the cases' accepted ratios come from; None: an approval made before approve measured them (the run's)
    ratio_measurement: RatioMeasurement | None = None
    regression_threshold: float | None = None  # a slowdown share the guard tolerates; None: the guard's default
    fingerprint: Fingerprint
    provenance: Provenance

    def files(self) -> dict[str, str]:
        """Every file the approval names, relative to its folder, with its sha256."""
        return {self.kernel.file: self.kernel.sha256, self.baseline.file: self.baseline.sha256, **self.task.files}

    def case(self, name: str) -> CaseLatency | None:
        return next((c for c in self.cases if c.case == name), None)


class Subject(_Frozen):
    """An in-toto ResourceDescriptor as a subject: a file and its digest."""

    name: str
    digest: dict[str, str]


class Statement(_Frozen):
    """An in-toto Statement v1 whose predicate is an Approval."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    type_: Literal["https://in-toto.io/Statement/v1"] = Field("https://in-toto.io/Statement/v1", alias="_type")
    subject: list[Subject]
    predicateType: Literal["https://kernel-referee.dev/approval/v1"] = PREDICATE_TYPE  # noqa: N815 - in-toto's name
    predicate: Approval

    @classmethod
    def of(cls, approval: Approval) -> Statement:
        """The statement of an approval: its subjects are the kernel, the baseline and every task file."""
        return cls(subject=[Subject(name=name, digest={"sha256": sha256})
                            for name, sha256 in sorted(approval.files().items())], predicate=approval)

    def to_json(self) -> dict:
        return self.model_dump(mode="json", by_alias=True)
