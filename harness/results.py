"""The typed results of checking and timing a kernel: what the agent and the audit log read."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from harness.compare import OutputCheck
from harness.stats import LatencyStats


class ReasonCode(str, Enum):
    COMPILE_ERROR = "compile_error"
    LAUNCH_ERROR = "launch_error"          # launch refused: bad geometry, too much shared memory, wrong signature
    CUDA_FAULT = "cuda_fault"              # sticky error: illegal address, trap, misaligned access
    TIMEOUT = "timeout"                    # killed at its deadline (the job's, or the tool call's)
    TOO_SLOW = "too_slow"                  # a launch ran past 20x the baseline's on the case (at least 1 s): stopped
    WORKER_CRASHED = "worker_crashed"
    OUT_OF_MEMORY = "out_of_memory"        # no device memory left for the case's buffers: not judged, still counted
    MISMATCH = "mismatch"                  # outputs differ from the reference beyond tolerance
    RACE = "race"                          # two runs on the same inputs disagree beyond tolerance
    OUT_OF_BOUNDS_WRITE = "out_of_bounds_write"
    INPUT_MODIFIED = "input_modified"
    UNWRITTEN_OUTPUT = "unwritten_output"  # timed launches that left output elements unwritten
    TIMED_OUTPUT_MISMATCH = "timed_output_mismatch"  # an audited timed launch's output is wrong
    LAUNCH_NOT_AS_DECLARED = "launch_not_as_declared"  # a timed launch ran other kernels, or another grid or block
    BEYOND_PHYSICAL_LIMIT = "beyond_physical_limit"  # faster than the device can move the bytes or do the flops
    UNEVEN_LAUNCHES = "uneven_launches"    # the mean launch far above the median: work shifted between launches
    ARITHMETIC_NOT_ALLOWED = "arithmetic_not_allowed"  # SASS on units the task's `arithmetic` forbids (tensor cores)
    DEVICE_HEAP = "device_heap"            # calls device malloc/free where the task does not allow the heap
    TIMING_MODES = "timing_modes"          # the timed launches fall into distinct fast and slow groups, twice
    TIMING_SPREAD = "timing_spread"        # the timed launches spread wider than honest kernels', twice
    RETIMING_DISAGREES = "retiming_disagrees"  # a flagged result timed again in a fresh worker: medians disagree
    EVIDENCE_TAMPERED = "evidence_tampered"  # a timed launch's sealed evidence changed after it was taken


class Reason(BaseModel):
    model_config = ConfigDict(frozen=True)

    code: ReasonCode
    case: str | None = None
    detail: str


class CaseCheck(BaseModel):
    case: str
    role: str
    passed: bool
    outputs: list[OutputCheck] = []
    agreement: str | None = None  # of the two runs with different poison
    reasons: list[Reason] = []
    warnings: list[str] = []
    judged_on: Literal["host", "device"] = "host"  # where its outputs were compared (harness/device_checks.py)


class CheckReport(BaseModel):
    passed: bool
    cases: list[CaseCheck]

    @property
    def reasons(self) -> list[Reason]:
        return [r for c in self.cases for r in c.reasons]


class CaseTiming(BaseModel):
    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)

    case: str
    passed: bool
    stats: LatencyStats | None = None
    samples_ms: list[float] = []
    # "kernel": each launch's own time on the GPU (CUPTI); "events": the time between its event pair,
    # launch latency included. With "kernel", the event pairs' samples and median are kept beside.
    clock: str = "events"
    event_samples_ms: list[float] | None = None
    event_median_ms: float | None = None
    kernel_floor_ms: float | None = None    # an empty kernel on the kernel clock
    gpu_busy_ms: float | None = None        # the GPU's busy time during the job (kernels, copies, memsets)
    achieved_gbps: float | None = None
    achieved_tflops: float | None = None
    roofline_ms: float | None = None        # max(bytes / bandwidth, flops / peak) with the device's measured peaks
    roofline_fraction: float | None = None  # roofline_ms / median: 1 at the limit
    launches: int = 0
    checked_launches: int = 0
    unwritten_launches: int = 0
    # "fresh": every launch's inputs drawn on the device from a secret per-job key; "rotated": the fixed sets
    inputs: str = "rotated"
    audited_launches: int = 0         # timed launches compared in full with the reference's output for their inputs
    # [timed launches, audited launches] of each fresh-input job whose samples these are (harness/audit_bound.py)
    audit_jobs: list[list[int]] = []
    event_overhead_ms: float | None = None
    host_kept_up: bool | None = None  # the whole timed loop was queued before the GPU reached it
    reasons: list[Reason] = []
    warnings: list[str] = []
    batches: int = 1                  # timing jobs merged (noise-adaptive sampling)
    # half-width of the median's 95% interval, relative to the median; "noise" in the run's files
    median_rel_halfwidth: float | None = Field(None, alias="noise")
    gpu: dict | None = None           # clocks, throttling and other processes around the timing (harness/nvml.py)


class TimingReport(BaseModel):
    passed: bool
    cases: list[CaseTiming]
    score_ms: float | None = None  # geometric mean of the case medians

    @property
    def reasons(self) -> list[Reason]:
        return [r for c in self.cases for r in c.reasons]
