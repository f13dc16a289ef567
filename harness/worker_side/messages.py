"""The GPU and compile workers' messages, field by field: every job header the parent sends
(harness/jobs.py builds them) and every answer a worker gives (execute.py, timed_loop.py,
cublas.py, gpu_worker.py, compile_worker_main.py). JSON on the wire (sandbox/wire.py), so these are
TypedDicts: the worker reads them without a validation library, and the parent re-checks every
answer it uses (harness/jobs.py, harness/worker_calls.py). Statuses are sandbox/answers.py's.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from sandbox.answers import Status


class ArrayParam(TypedDict):
    kind: Literal["input", "output"]
    name: str
    dtype: str
    nbytes: int
    itemsize: int


class ScalarParam(TypedDict):
    kind: Literal["scalar"]
    name: str
    dtype: str
    value: int | float


class Launch(TypedDict):
    grid: list[int]
    block: list[int]
    shared_bytes: int


class InputEntry(TypedDict, total=False):
    key: str | None  # "NAME:SHA256", by which the worker keeps the buffer; None: not kept
    sent: bool  # its bytes come with the job (else the worker holds them, or draws them)
    drawn: dict  # how the worker draws it (fresh_inputs.draw_spec)


class _KernelJob(TypedDict):
    kernel: str  # the CUBIN's function, the job's first blob
    params: list[ArrayParam | ScalarParam]
    launch: Launch
    guard_seed: int  # the guard bands' canaries derive from it
    guard_bytes: int
    inputs: list[list[InputEntry]]  # per input set, per input
    # A launch of the kernel still running after this many seconds is too slow: the worker answers "too_slow"
    # and ends (the kernel holds the device). Absent: no limit but the job's deadline (the reference's jobs).
    launch_limit_s: NotRequired[float]


class RunJob(_KernelJob):
    op: Literal["run"]
    poisons: list[int]  # one launch per poison byte, on the same inputs
    # Outputs left on the device (harness/worker_side/device_judging.py): a candidate's held for a judging job,
    # their IPC handles in the answer; or the reference's first run kept as the expected outputs of this key,
    # judged against the second run with these tolerances ({output: [rtol, atol]}).
    hold_outputs: NotRequired[bool]
    keep_as: NotRequired[str]
    tolerances: NotRequired[dict[str, list[float]]]


class HeldRuns(TypedDict):
    handle: str  # a CUDA IPC memory handle, hex
    offset: int  # where the output starts in the exported allocation


class JudgedOutput(TypedDict):
    name: str
    dtype: str
    itemsize: int
    elements: int
    rtol: float
    atol: float
    runs: list[HeldRuns]  # the candidate's first and second run


class JudgeJob(TypedDict):
    op: Literal["judge"]
    expected: str  # the key the reference's outputs were kept as
    outputs: list[JudgedOutput]
    poisons: list[int]  # each run's poison byte: what an unwritten element holds
    first_mismatches: int  # how many mismatches to report with their values


class Draws(TypedDict):
    key: int
    launches: list[int]


class DrawRunJob(RunJob):  # op "draw_run": one launch per drawn launch number
    draws: Draws


class TimeJob(_KernelJob):
    op: Literal["time", "vendor_time"]  # vendor_time: a "vendor" call instead of kernel and launch
    sets: int
    warmups: int
    iterations: int
    cold_l2: bool
    poison: int
    checked_launches: list[int]  # re-checked (rotated sets) or audited (fresh inputs) launches
    known_outputs: dict[str, list[str]]  # by slot "SET/OUTPUT", hashes already found right
    clock: Literal["kernel", "events"]
    fresh: dict | None  # {"key": the job's secret key}, or None for rotated fixed sets


class PeaksJob(TypedDict):
    op: Literal["peaks"]
    copy_bytes: list[int]
    copy_repeats: int
    gemm_size: int
    gemm_repeats: int


class CompileJob(TypedDict):
    op: Literal["compile"]
    source: str
    kernel_name: str
    options: list[str]
    arch: str


class Failure(TypedDict):
    status: Status
    error: str
    detail: str


class OutputFields(TypedDict):
    output_sha256: list[str]  # every output slot's hash
    outputs_sent: int  # the distinct outputs whose bytes follow, before the guard bands


class RunAnswer(OutputFields):
    status: Status
    input_sha256: list[dict[str, str]]
    gpu_busy_ms: float | None
    resident_inputs: list[str]


class TimeAnswer(RunAnswer):
    samples_ms: list[float]  # each timed launch's event pair
    kernel_samples_ms: list[float] | None  # each launch's own span on the kernel clock
    clock_note: str | None
    unwritten: list[int]  # per launch, output elements still holding the poison
    tampered: list[str]  # the launches whose evidence no longer matches its MAC (harness/worker_side/evidence_mac.py)
    changed_inputs: list[int] | None  # per launch, drawn input elements the kernel changed
    launch_records: list | None  # per launch, the kernels it ran: [name, grid, block]
    event_overhead_ms: float
    kernel_floor_ms: float | None
    host_kept_up: bool
    phases_s: dict[str, float]
