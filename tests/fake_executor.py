"""A stand-in for the GPU side of a run: real NVRTC compiles, verdicts and latencies read from
markers in the kernel source.

Markers (in a comment anywhere in the source):
  fake: wrong          mismatch on every case
  fake: wrong-fresh    mismatch only on fresh (secret-seed) inputs
  fake: wrong-holdout  mismatch only on holdout cases
  fake: unwritten      timing finds unwritten outputs
  fake: latency_us=N   median latency N microseconds (default 100: default_latency_us)
  fake: die            the process kills itself during timing (a server killed mid-attempt)
  fake: slow_s=N       timing takes N seconds, unless abort() kills the "worker" first (worker_crashed)
  fake: unwritten-on-retime   timing after abort() (a fresh worker) finds unwritten outputs
  fake: retime_latency_us=N   timing after abort() (a fresh worker) has a median latency of N microseconds
  fake: no-ncu         profile() finds no ncu; fake: no-counters  ncu is denied the counters (ERR_NVGPUCTRPERM)
  fake: blocked        profile() answers the register-blocked matmul's recorded CSV (else the naive one's)
  fake: two-paced      a quarter of the timed launches 16% slower: the timing refused for its shape (timing_modes),
                       as the protocol refuses it twice; FakeExecutor(two_paced_baseline=True) times every kernel
                       without a latency_us marker (the baseline) at two paces too
  fake: spin_s=N       every launch on a performance case takes N seconds (in real time), bounded as the
                       referee bounds it: past the case's launch limit, too_slow (the check stops there);
                       past the call's deadline, OutOfTime
Not a marker: FakeExecutor(prepare_s=N) makes the first expected outputs take N seconds (a slow
preparation of a new run), unless close() ends the wait.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import signal
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from harness.call_limits import CallLimits, OutOfTime
from harness.vendor_yardstick import VendorReport
from harness.compile_cache import CompileCache
from harness.worker_side.sass_mix import InstructionMix, instruction_mix
from harness.gpu_lease import GpuLease, held
from harness.ncu_profile import NCU_MISSING, NO_PERMISSION, ProfilingUnavailable
from harness.placement import GpuInfo
from server.executor import ExecutorError
from harness.nvrtc_features import nvrtc_features
from harness.worker_side.nvrtc import compile_kernel
from harness.settings import CompiledKernel, ReferenceFailed
from harness.worker_side.buffers import tree_sha256
from harness.stats import geometric_mean, summarize
from harness.task_model import Case, Task
from harness.results import CaseCheck, CaseTiming, CheckReport, Reason, ReasonCode, TimingReport
from harness.timing_shape import shape_of, shape_reasons


NCU_FIXTURES = Path(__file__).parent / "fixtures" / "ncu"


def markers(source: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(r"fake: ([a-z_-]+)(?:=([0-9.]+))?", source)}


# What harness.peaks would measure on an H200, roughly.
H200_PEAKS = {"memory_gbps": 4300.0, "fp32_tflops": 51.0, "tensor_bf16_tflops": 830.0, "source": "measured"}
# What the fake's environment carries by default: the memory peak only. The fake's latencies are markers,
# the same for every case, not physics: the matmul's square-2048 case at the usual 50 us would be 344
# TFLOP/s of float32, beyond any device's compute limit, and refused (beyond_physical_limit). Tests of
# the physical limit pass H200_ENVIRONMENT (tests/test_physical_limit.py).
FAKE_PEAKS = {"memory_gbps": 4300.0, "source": "measured"}
# An H200's own facts (sm_90, 132 SMs at 1980 MHz, HBM3e at 3201 MHz on a 6144-bit bus, 60 MiB of L2) and its
# measured peaks.
H200_ENVIRONMENT = {"compute_capability": [9, 0], "sm_count": 132, "sm_clock_khz": 1980000,
                    "memory_clock_khz": 3201000, "memory_bus_bits": 6144, "l2_bytes": 60 * 2**20,
                    "peaks": H200_PEAKS}

# An H200's per-SM and per-block limits as its driver reports them (server/executor.py DEVICE_LIMITS).
H200_LIMITS = {"warp_size": 32, "registers_per_sm": 65536, "registers_per_block": 65536,
               "shared_bytes_per_sm": 233472, "shared_bytes_per_block": 49152, "max_shared_per_block_optin": 232448,
               "reserved_shared_bytes_per_block": 1024, "max_threads_per_block": 1024, "max_threads_per_sm": 2048,
               "max_blocks_per_sm": 32}


@functools.cache
def fake_nvrtc_features() -> dict:
    """The NVRTC features of this machine's NVRTC for sm_90: real (the fake compiles with the real NVRTC too)."""
    return nvrtc_features("sm_90").model_dump(mode="json")


# The fake device's UUID: its timings hold the host-wide lease of this name (harness/gpu_lease.py), in the folder
# $KERNEL_REFEREE_GPU_LEASES names (tests/conftest.py gives each test session its own).
FAKE_GPU_UUID = "GPU-fa4e0000-0000-4000-8000-000000000001"


def fake_gpus(count: int) -> list[GpuInfo]:
    """A host of `count` fake GPUs (harness/placement.py): GPU 0 is FAKE_GPU_UUID, as the one-GPU fake's."""
    return [GpuInfo(i, FAKE_GPU_UUID if i == 0 else f"GPU-fa4e0000-0000-4000-8000-{i + 1:012d}", 141 << 30)
            for i in range(count)]



@functools.lru_cache(maxsize=256)
def _mix_of(cubin: bytes):
    """The CUBIN's instruction mix, read once per CUBIN (the tests compile the same few kernels many times)."""
    with tempfile.TemporaryDirectory() as scratch:
        return instruction_mix(cubin, Path(scratch))

class FakeExecutor:
    def __init__(self, task: Task, gpu: str = "Fake GPU", vendor_latency_us: float | None = 20.0,
                 environment: dict | None = None, default_latency_us: float = 100.0,
                 gpu_uuid: str | None = FAKE_GPU_UUID, lease_what: str = "serve", placed: GpuInfo | None = None,
                 trees_from_bytes: int | None = None, prepare_s: float = 0.0, two_paced_baseline: bool = False):
        self.task = task
        self.two_paced_baseline = two_paced_baseline
        # The first expected outputs take this long (a slow preparation), unless close() ends the wait: then they fail
        self.prepare_s = prepare_s
        self.closed = threading.Event()
        self.gpu = gpu
        self.gpu_uuid = placed.uuid if placed else gpu_uuid  # placed: on that fake GPU, as GpuExecutor(gpu=...)
        self.gpu_index = placed.index if placed else 0
        gpu_uuid = self.gpu_uuid
        self.gpu_lease = GpuLease(gpu_uuid, lease_what) if gpu_uuid else None  # as GpuExecutor's, once started
        self.environment = environment or {}  # facts that replace or add to start()'s
        self.default_latency_us = default_latency_us  # a kernel without a latency_us marker (the baseline)
        self.vendor_latency_us = vendor_latency_us  # None: the vendor library "cannot be loaded"
        self.cache = CompileCache()
        self.sources: dict[bytes, str] = {}
        self.preloaded: dict[tuple[str, int], dict] = {}
        self.calls: list[str] = []
        self.aborted = 0
        self.abort_signal = threading.Event()  # set by abort(): a slow timing in flight ends as a killed worker would
        self.prepared: list[dict[str, int]] = []  # the seeds of each prepare() call
        self.checked_seeds: list[dict | None] = []  # the seeds of each check() call
        self.limits: CallLimits | None = None  # the call in progress (within())
        self.limits_seen: list[CallLimits] = []  # every call's, in order
        self.profiled: list[tuple] = []  # (symbol, case, metrics) of each profile() call
        self.job_limits: list[CallLimits | None] = []  # the limits in force at each check() and time()
        # Cases with at least this many bytes of outputs are "judged on the device": their expected outputs are
        # kept as sha256-trees (harness/device_checks.py); None: every case on the host.
        self.trees_from_bytes = trees_from_bytes
        self.locked_trees: dict[tuple[str, int], dict[str, str]] = {}
        self.device_off: str | None = None  # why cases meant for the device were judged on the host

    def _deadline(self):
        return self.limits.deadline if self.limits else None

    @contextmanager
    def within(self, limits: CallLimits):
        self.limits = limits
        self.limits_seen.append(limits)
        try:
            yield
        finally:
            self.limits = None

    def _spin(self, case: Case, marks: dict, launches: int) -> Reason | None:
        """`launches` launches of a spin_s kernel on a performance case: too_slow past the case's launch limit,
        OutOfTime past the call's deadline."""
        if "spin_s" not in marks or case.role != "performance":
            return None
        seconds = float(marks["spin_s"])
        limit = self.limits.launch_s.get(case.name) if self.limits else None
        if limit is not None and seconds > limit:
            self._sleep(limit, case)
            return Reason(code=ReasonCode.TOO_SLOW, case=case.name, detail=f"launch 1 was still running after {limit:.3g} s")
        self._sleep(seconds * launches, case)
        return None

    def _sleep(self, seconds: float, case: Case) -> None:
        deadline = self.limits.deadline if self.limits else None
        if deadline is not None and seconds > deadline.remaining():
            time.sleep(deadline.remaining())
            raise OutOfTime(f"the call's {deadline.seconds:g} s ran out during the job on case {case.name}; "
                            "the worker was killed")
        time.sleep(seconds)

    def start(self) -> dict:
        return {"gpu": self.gpu, "gpu_uuid": self.gpu_uuid, "gpu_index": self.gpu_index, "compute_capability": [9, 0], "arch": "sm_90", "driver_cuda_version": "13.0",
                "nvrtc": "13.x", "cuda_bindings": "13.x", "sm_clock_khz": 1980000, "event_overhead_ms": 0.002,
                "kernel_floor_ms": 0.0023, "limits": H200_LIMITS, "nvrtc_features": fake_nvrtc_features(),
                "peaks": FAKE_PEAKS, "peaks_notes": [], **self.environment}

    def compile_arch(self) -> str | None:
        return "sm_90"  # the fake's device, known before any worker, as NVML tells GpuExecutor

    def compile(self, source: str, options: tuple[str, ...]):
        result = compile_kernel(source, self.task.kernel_name, options=options, arch="sm_90", cache=self.cache)
        if result.ok:
            result = result.model_copy(update={"mix": _mix_of(result.cubin)})  # as the compile worker answers
            # Markers are comments, so two candidates may share a CUBIN: tag it with the source (never run).
            tagged = result.cubin + b"\0fake:" + hashlib.sha256(source.encode()).digest()
            result = result.model_copy(update={"cubin": tagged})
            self.sources[hashlib.sha256(tagged).digest()] = source
        return result

    def expected(self, case: Case, seed: int) -> dict[str, np.ndarray]:
        delay, self.prepare_s = self.prepare_s, 0.0
        if delay and self.closed.wait(delay):
            raise ExecutorError("the executor was closed while the reference outputs were computed (fake)")
        key = (case.name, seed)
        if key in self.preloaded:
            return self.preloaded[key]
        shapes = self.task.shapes(case.dims)
        rng = np.random.default_rng(seed)
        return {p.name: rng.standard_normal(shapes[p.name]).astype(np.float32) for p in self.task.output_params}

    def preload(self, case: Case, seed: int, outputs: dict) -> None:
        self.preloaded[(case.name, seed)] = outputs

    def expected_trees(self, case: Case, seed: int) -> dict[str, str] | None:
        nbytes = self.task.nbytes(case.dims)
        if self.trees_from_bytes is None or sum(nbytes[p.name] for p in self.task.output_params) < self.trees_from_bytes:
            return None
        trees = {name: tree_sha256(array) for name, array in self.expected(case, seed).items()}
        locked = self.locked_trees.get((case.name, seed))
        if locked is not None and locked != trees:
            raise ReferenceFailed(case.name, "its outputs are not the ones the run locked (their sha256-tree differs)")
        return trees

    def lock_trees(self, case: Case, seed: int, trees: dict[str, str]) -> None:
        self.locked_trees[(case.name, seed)] = dict(trees)

    def judging_note(self) -> str | None:
        return self.device_off


    def _source(self, kernel: CompiledKernel) -> str:
        return self.sources[hashlib.sha256(kernel.cubin).digest()]

    def prepare(self, cases: list[Case], seeds: dict[str, int]) -> None:
        self.prepared.append({c.name: seeds[c.name] for c in cases})

    def check(self, kernel: CompiledKernel, cases: list[Case], seeds: dict | None = None,
              against_oracle: bool = False) -> CheckReport:
        self.calls.append("check")
        self.checked_seeds.append(seeds)
        self.job_limits.append(self.limits)
        marks = markers(self._source(kernel))
        results = []
        for case in cases:
            slow = self._spin(case, marks, launches=2)
            if slow is not None:
                results.append(CaseCheck(case=case.name, role=case.role, passed=False, reasons=[slow]))
                break  # the worker was stopped: the check ends there
            wrong = ("wrong" in marks or (seeds and "wrong-fresh" in marks)
                     or (case.role == "holdout" and "wrong-holdout" in marks))
            reasons = [Reason(code=ReasonCode.MISMATCH, case=case.name, detail="c: 12 of 100 elements beyond tolerance")] \
                if wrong else []
            results.append(CaseCheck(case=case.name, role=case.role, passed=not wrong, reasons=reasons,
                                     agreement="identical"))
        passed = len(results) == len(cases) and all(r.passed for r in results)
        return CheckReport(passed=passed, cases=results)

    def time(self, kernel: CompiledKernel, cases: list[Case]) -> TimingReport:
        with held(self.gpu_lease, self._deadline()):  # as the Referee's timing protocol holds it around every timing job
            return self._time(kernel, cases)

    def _time(self, kernel: CompiledKernel, cases: list[Case]) -> TimingReport:
        self.abort_signal.clear()  # before the job is seen to start: an abort from then on ends it
        self.calls.append("time")
        self.job_limits.append(self.limits)
        marks = markers(self._source(kernel))
        if "die" in marks:
            os.kill(os.getpid(), signal.SIGKILL)
        if "slow_s" in marks:
            if self.abort_signal.wait(float(marks["slow_s"])):
                return _killed(cases)
        retimed = self.aborted and "retime_latency_us" in marks
        latency_us = marks["retime_latency_us"] if retimed else marks.get("latency_us", self.default_latency_us)
        latency_ms = float(latency_us) / 1000
        rng = np.random.default_rng(len(self.calls))
        timings = []
        for case in cases:
            slow = self._spin(case, marks, launches=1)
            if slow is not None:
                return TimingReport(passed=False, cases=timings + [CaseTiming(case=case.name, passed=False,
                                                                              reasons=[slow])])
            samples = list(latency_ms * (1 + 0.003 * rng.standard_normal(50)))
            reasons = [Reason(code=ReasonCode.UNWRITTEN_OUTPUT, case=case.name, detail="3 of 50 timed launches left "
                              "output elements unwritten")] if "unwritten" in marks or (
                "unwritten-on-retime" in marks and self.aborted) else []
            if "two-paced" in marks or (self.two_paced_baseline and "latency_us" not in marks):
                samples = samples[:37] + [x * 1.16 for x in samples[37:]]
                reasons += shape_reasons(shape_of(samples), case.name)
            stats = summarize(samples)
            timings.append(CaseTiming(case=case.name, passed=not reasons, stats=stats, samples_ms=samples,
                                      launches=50, achieved_gbps=100.0, achieved_tflops=1.0, reasons=reasons,
                                      roofline_ms=0.01, roofline_fraction=0.01 / stats.median_ms,
                                      inputs="fresh", audited_launches=3))
        passed = all(t.passed for t in timings)
        return TimingReport(passed=passed, cases=timings,
                            score_ms=geometric_mean([t.stats.median_ms for t in timings]) if passed else None)

    def profile(self, kernel: CompiledKernel, case: Case, metrics: tuple[str, ...]) -> str:
        """A recorded ncu CSV (tests/fixtures/ncu/), or ncu_profile's one-line reasons for no profile; under the
        GPU lease within the call's deadline, as GpuExecutor.profile."""
        with held(self.gpu_lease, self._deadline()):
            return self._profile(kernel, case, metrics)

    def _profile(self, kernel: CompiledKernel, case: Case, metrics: tuple[str, ...]) -> str:
        self.calls.append("profile")
        self.profiled.append((kernel.symbol, case.name, metrics))
        marks = markers(self._source(kernel))
        if "no-ncu" in marks:
            raise ProfilingUnavailable(NCU_MISSING)
        if "no-counters" in marks:
            raise ProfilingUnavailable(NO_PERMISSION)
        name = "register_blocked" if "blocked" in marks else "naive"
        return (NCU_FIXTURES / f"{name}-matmul_f32-square-2048.csv").read_text()

    def time_vendor(self, cases: list[Case]) -> VendorReport | None:
        with held(self.gpu_lease):
            return self._time_vendor(cases)

    def _time_vendor(self, cases: list[Case]) -> VendorReport | None:
        if self.task.vendor is None:
            return None
        if self.vendor_latency_us is None:
            return VendorReport(name="cuBLAS", library="cublas", available=False,
                                notes=["cuBLAS is not available in the GPU worker (fake); no vendor baseline"])
        samples = [self.vendor_latency_us / 1000] * 50
        timings = [CaseTiming(case=c.name, passed=True, stats=summarize(samples), samples_ms=samples, launches=50,
                              achieved_gbps=500.0, achieved_tflops=5.0, roofline_fraction=0.5) for c in cases]
        return VendorReport(name="cuBLAS", library="cublas", available=True,
                            timing=TimingReport(passed=True, cases=timings, score_ms=self.vendor_latency_us / 1000))

    def abort(self) -> None:
        self.aborted += 1
        self.abort_signal.set()
        if self.gpu_lease is not None:
            self.gpu_lease.abort()

    def fresh_worker(self) -> None:
        self.aborted += 1

    def close(self) -> None:
        self.closed.set()


def _killed(cases: list[Case]) -> TimingReport:
    """What the real executor answers when abort() killed the worker during a timing job."""
    reasons = [Reason(code=ReasonCode.WORKER_CRASHED, case=cases[0].name, detail="the worker was killed (fake)")]
    return TimingReport(passed=False, cases=[CaseTiming(case=cases[0].name, passed=False, reasons=reasons)])


class Fp16TensorCoreToolchain(FakeExecutor):
    """A toolchain that turns every candidate but the task's own initial kernel into fp16 tensor-core code: what
    matmul_f32 (CUDA cores only) forbids."""

    def compile(self, source: str, options: tuple[str, ...]):
        result = super().compile(source, options)
        if result.ok and source != self.task.source("initial"):
            result = result.model_copy(update={"mix": InstructionMix(instructions=100, tensor={"fp16": 3},
                                                                     tensor_forms=["HMMA.16816.F32"])})
        return result
