"""Typed answers of the tools: what an agent reads (and what the output schemas advertise)."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, model_validator

from harness.compare import OutputCheck
from harness.nvrtc_features import NvrtcFeatures
from harness.profile_digest import ProfileDigest
from harness.stats import WITHIN_NOISE, LatencyStats, Significance, Speedup, significance
from harness.results import Reason
from harness.worker_side.sass_mix import InstructionMix
from server.records import Verdict


class Budget(BaseModel):
    max_attempts: int
    attempts_used: int
    attempts_left: int
    probes_left_in_window: int
    probe_gpu_seconds_left_in_window: float
    finished: bool
    stop_reason: str | None = None


class Resources(BaseModel):
    registers: int | None = None
    spill_bytes: int = 0
    shared_bytes: int = 0
    stack_bytes: int = 0


class CompileAnswer(BaseModel):
    candidate: str
    ok: bool
    arch: str | None = None  # what it was compiled for: the device's sm_XY, or sm_XYa when asked (-arch=sm_XYa)
    log: str
    log_resource: str | None = None
    resources: Resources | None = None
    compile_ms: float
    cache_hit: bool
    # The CUBIN's SASS instruction mix: the units it computes on (CUDA-core fp32, fp64, half2; tensor-core MMA by
    # input type); None when it did not compile.
    mix: InstructionMix | None = None
    # Why every probe and record_attempt would reject it before running it (arithmetic_not_allowed: units the
    # task's `arithmetic` forbids); None when nothing would.
    rejected: Reason | None = None


class SpeedupAnswer(Speedup):
    """A speedup as the tools answer it: with what its interval says, in the report's and the demo's words."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings", from_attributes=True)

    significance: Significance = Field(WITHIN_NOISE, description=(
        "what the 95% interval [low, high] says against 1.0: faster beyond noise, slower beyond noise, or within "
        "noise"))

    @model_validator(mode="after")
    def _say_what_the_interval_says(self) -> "SpeedupAnswer":
        # Always from the interval, whatever was passed: one rule (harness.stats.significance) for every answer.
        object.__setattr__(self, "significance", significance(self.low, self.high, self.beyond_noise))
        return self


class CaseStatus(BaseModel):
    case: str
    passed: bool
    outputs: list[OutputCheck] = []
    reasons: list[Reason] = []
    warnings: list[str] = []


class CheckAnswer(BaseModel):
    candidate: str
    passed: bool
    cases: list[CaseStatus]
    budget: Budget


class CaseLatency(BaseModel):
    case: str
    stats: LatencyStats
    achieved_gbps: float | None = None
    achieved_tflops: float | None = None
    roofline_ms: float | None = None        # max(bytes / bandwidth, flops / peak), the device's measured peaks
    roofline_fraction: float | None = None  # roofline_ms / median: 1 is at the limit
    baseline_median_ms: float | None = None
    speedup_vs_baseline: SpeedupAnswer | None = None
    speedup_vs_best: SpeedupAnswer | None = None
    inputs: str | None = None               # "fresh": every timed launch drew new inputs from a secret key
    audited_launches: int | None = None     # timed launches compared in full with the reference's output
    # At most this chance that a kernel wrong on more than half of the case's timed launches passed every audit:
    # below 2**-20 for an attempt; a time_kernel probe times one round and audits half as many (2**-10).
    audit_escape_bound: float | None = None


class TimeAnswer(BaseModel):
    candidate: str
    cases: list[CaseLatency]
    score_ms: float
    speedup_vs_baseline: SpeedupAnswer
    speedup_vs_best: SpeedupAnswer
    budget: Budget


class AttemptAnswer(BaseModel):
    attempt: int
    candidate: str
    verdict: Verdict
    reasons: list[Reason]
    cases: list[CaseLatency] = []
    score_ms: float | None = None
    speedup_vs_baseline: SpeedupAnswer | None = None
    speedup_vs_best: SpeedupAnswer | None = None
    best_attempt: int
    budget: Budget
    holdout: dict[str, Any] | None = None
    mix: InstructionMix | None = None  # the attempt's SASS instruction mix, as compile_kernel answers it


class FinishAnswer(BaseModel):
    stop_reason: str
    best_attempt: int
    disqualified: list[int]
    holdout: dict[str, Any]
    summary_resource: str = "referee://summary.json"
    # The fingerprint of the key that signs the run's log, for the person to keep outside the run folder
    # (`kernel-referee verify RUN --public-key FINGERPRINT`); None for a run made before signing.
    signing_key_fingerprint: str | None = None


class TaskCase(BaseModel):
    name: str
    role: str
    dims: dict[str, int | float]  # the case's dimensions and the task's constants
    baseline_median_ms: float | None = None


class MeasuredPeaks(BaseModel):
    """What the device reached when the run started (harness/peaks.py): the roofline timings are placed under."""

    memory_gbps: float | None = None      # device-to-device copies, bytes read + written, 1e9 bytes per second
    fp32_tflops: float | None = None      # cuBLAS float32 GEMM on the CUDA cores
    tensor_tflops: dict[str, float] = {}  # cuBLAS GEMM on the tensor cores by input type (float32 accumulation)
    source: str | None = None             # "measured" at the run's start, or "cache" (an earlier measurement)
    notes: list[str] = []                 # e.g. why a peak is missing


class LaunchFloor(BaseModel):
    """What an empty kernel measures: no timing of a real kernel reads less."""

    kernel_clock_ms: float | None = None  # on the kernel clock, which the timings read (None: timed by events)
    event_pair_ms: float | None = None    # between two CUDA events, the launch latency included


class DeviceFacts(BaseModel):
    """The run's GPU as its CUDA driver reported it when the run started, its measured peaks, the launch floor
    and the features of the NVRTC that compiles candidates (None where a fact was not reported)."""

    gpu: str | None = None
    compute_capability: list[int] | None = None
    sm_count: int | None = None
    warp_size: int | None = None
    registers_per_sm: int | None = None
    registers_per_block: int | None = None
    shared_bytes_per_sm: int | None = None
    shared_bytes_per_block: int | None = None
    shared_bytes_per_block_optin: int | None = None  # the most a launch's shared_bytes may be (the referee opts in)
    reserved_shared_bytes_per_block: int | None = None
    max_threads_per_block: int | None = None
    max_threads_per_sm: int | None = None
    max_blocks_per_sm: int | None = None
    l2_bytes: int | None = None
    total_memory_bytes: int | None = None
    memory_bus_bits: int | None = None
    memory_clock_khz: int | None = None
    sm_clock_khz: int | None = None
    driver_cuda_version: str | None = None
    peaks: MeasuredPeaks | None = None
    launch_floor: LaunchFloor = LaunchFloor()
    nvrtc: NvrtcFeatures | None = None


class PreparationStatus(BaseModel):
    """A new run's preparation, done behind a server that answers at once (server/preparation.py)."""
    state: Literal["queued", "preparing", "ready", "failed"]  # queued: waiting for a GPU (the audit service)
    step: str                       # what is being prepared now, or why it failed
    done_fraction: float
    elapsed_s: float
    expected_left_s: float | None   # about how long until the run is ready; None once it is, or has failed
    error: str | None = None


class TaskDescription(BaseModel):
    name: str
    description: str
    kernel_name: str
    signature: str
    parameters: list[dict[str, Any]]
    cases: list[TaskCase]
    tolerances: dict[str, dict[str, float]]
    launch_default: dict[str, Any]
    device: dict[str, Any]
    baseline_score_ms: float | None
    best_attempt: int
    best_score_ms: float | None
    budget: Budget
    vendor: dict | None = None  # {"name": "cuBLAS", "cases": {case: median_ms}}: the vendor library beside the baseline
    device_facts: DeviceFacts | None = None  # what referee://device answers
    profiling: bool = False  # profile_kernel answers (the run was served with --profile)
    # A new run's preparation: until it is ready, the tools that need it answer "preparing" and spend nothing
    preparation: PreparationStatus | None = None


class ProfileAnswer(BaseModel):
    candidate: str
    case: str
    profile: str        # the id of the full ncu report: referee://profiles/{profile}
    resource: str
    digest: ProfileDigest
    budget: Budget


class LaunchInput(BaseModel):
    """Launch geometry: each entry an integer or an expression of the case dimensions
    (arithmetic, comparisons giving 1 or 0, ceil_div, min, max, where(condition, a, b)), e.g.
    grid ["ceil_div(n, 64)", "ceil_div(m, 64)"]."""

    model_config = ConfigDict(extra="forbid")

    grid: list[str | int] = Field(min_length=1, max_length=3, description="blocks per grid: x, y, z")
    block: list[str | int] = Field(min_length=1, max_length=3, description="threads per block: x, y, z")
    shared_bytes: str | int = Field(default=0, description="dynamic shared memory per block, in bytes")
    per_case: dict[str, "LaunchInput"] = Field(default_factory=dict, max_length=64,
                                               description="another geometry for a named case")


USAGE_MAX_BYTES = 4096
USAGE_MAX_EXTRA_KEYS = 16
USAGE_MAX_TEXT = 200
_USAGE_MAX_NUMBER = 1e15
_USAGE_KEY = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def _plain_usage_value(value: Any) -> Any:
    """An extra usage value: plain and small, so that what the audit log keeps stays bounded."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and len(value) <= USAGE_MAX_TEXT:
        return value
    if isinstance(value, (int, float)) and math.isfinite(value) and abs(value) <= _USAGE_MAX_NUMBER:
        return value
    raise ValueError(f"an extra usage value must be a string of at most {USAGE_MAX_TEXT} characters, a finite "
                     f"number within +-{_USAGE_MAX_NUMBER:g}, true, false or null")


_UsageExtra = Annotated[Any, AfterValidator(_plain_usage_value), WithJsonSchema({"anyOf": [
    {"type": "string", "maxLength": USAGE_MAX_TEXT},
    {"type": "number", "minimum": -_USAGE_MAX_NUMBER, "maximum": _USAGE_MAX_NUMBER},
    {"type": "boolean"}, {"type": "null"}]})]


class Usage(BaseModel):
    """What the client spent to produce this attempt, kept in the audit log as given: the fields below and at
    most 16 more keys of plain values (a short string, a number, true, false or null), 4096 bytes in all as
    JSON. Anything larger is refused before the attempt is counted."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"maxProperties": 5 + USAGE_MAX_EXTRA_KEYS})
    __pydantic_extra__: dict[str, _UsageExtra]

    model: str | None = Field(default=None, max_length=USAGE_MAX_TEXT, description="the model that wrote the attempt")
    calls: int | None = Field(default=None, ge=0, le=int(_USAGE_MAX_NUMBER), description="model calls spent on it")
    input_tokens: int | None = Field(default=None, ge=0, le=int(_USAGE_MAX_NUMBER), description="input tokens spent")
    output_tokens: int | None = Field(default=None, ge=0, le=int(_USAGE_MAX_NUMBER), description="output tokens spent")
    cost_usd: float | None = Field(default=None, ge=0, le=_USAGE_MAX_NUMBER, allow_inf_nan=False,
                                   description="what it cost, in US dollars")

    @model_validator(mode="after")
    def _bounded(self) -> "Usage":
        extra = self.model_extra or {}
        if len(extra) > USAGE_MAX_EXTRA_KEYS:
            raise ValueError(f"usage has {len(extra)} extra keys; at most {USAGE_MAX_EXTRA_KEYS} are kept")
        bad = [key for key in extra if not _USAGE_KEY.fullmatch(key)]
        if bad:
            raise ValueError(f"usage key {bad[0][:40]!r}: keys are 1 to 64 letters, digits, '_', '.' or '-'")
        size = len(self.model_dump_json(exclude_none=True).encode())
        if size > USAGE_MAX_BYTES:
            raise ValueError(f"usage is {size} bytes as JSON; at most {USAGE_MAX_BYTES} are kept")
        return self
