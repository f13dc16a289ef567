"""The GPU side of a run, behind one small interface so the run logic can be tested without a GPU.

`GpuExecutor` owns the worker pool, the reference kernel and the compile service (a confined,
killable compile worker behind the compile cache). Tests stand in a fake with the same methods
(tests/fake_executor.py).
"""

from __future__ import annotations

import importlib.metadata
import threading
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Protocol

import numpy as np

from harness.call_limits import CallLimits
from harness.vendor_yardstick import VendorReport, time_vendor
from harness.compile_cache import CompileCache
from harness.worker_side.compile_policy import CompileResult
from harness.worker_side.nvrtc import nvrtc_version
from harness.referee import Referee
from harness.settings import CompiledKernel, TimingSettings
from harness.gpu_lease import GpuLease, gpu_key, held
from harness.nvml import Nvml, driver_build
from harness.peaks import device_peaks
from harness.nvrtc_features import nvrtc_features
from harness.task_model import Case, Task
from harness.results import CheckReport, TimingReport
from harness.compile_service import CompileService, DEFAULT_DEADLINE_S
from sandbox.confine import landlock_abi
from harness.gpu_workers import gpu_worker_pool
from harness.ncu_profile import profile_once
from sandbox.pool import Worker
from harness.gpus import list_gpus, nvml_arch
from harness.placement import GpuInfo


# The device's per-SM and per-block limits, as the GPU worker read them (harness/worker_side/gpu.py DeviceInfo):
# what an agent sizes blocks, registers and shared memory against (referee://device).
DEVICE_LIMITS = ("warp_size", "registers_per_sm", "registers_per_block", "shared_bytes_per_sm",
                 "shared_bytes_per_block", "max_shared_per_block_optin", "reserved_shared_bytes_per_block",
                 "max_threads_per_block", "max_threads_per_sm", "max_blocks_per_sm")


class ExecutorError(RuntimeError):
    """The GPU side cannot work (no device, the reference does not compile, a worker cannot start)."""


class Executor(Protocol):
    def start(self) -> dict: ...                     # environment facts; starts the workers
    def compile(self, source: str, options: tuple[str, ...]) -> CompileResult: ...
    # Optional, GpuExecutor's: compile(..., read_mix=False) and read_mix(compiled), the instruction mix read apart
    # while the GPU checks the kernel (server/mix_reading.py); an executor without them compiles in one step
    # The arch its compiles target, known with no GPU worker started (a run queued for a GPU compiles for it);
    # None where only the GPU it gets can tell
    def compile_arch(self) -> str | None: ...
    def expected(self, case: Case, seed: int) -> dict[str, np.ndarray]: ...
    def preload(self, case: Case, seed: int, outputs: dict[str, np.ndarray]) -> None: ...
    # The sha256-trees of expected outputs kept on the device (a case judged there); None: judged on the host
    def expected_trees(self, case: Case, seed: int) -> dict[str, str] | None: ...
    def lock_trees(self, case: Case, seed: int, trees: dict[str, str]) -> None: ...  # a run's locked trees
    # Why cases meant to be judged on the device are judged on the host (harness/device_checks.py), or None
    def judging_note(self) -> str | None: ...
    def prepare(self, cases: list[Case], seeds: dict[str, int]) -> None: ...  # make these inputs ahead of a check
    def check(self, kernel: CompiledKernel, cases: list[Case], seeds: dict[str, int] | None = None,
              against_oracle: bool = False) -> CheckReport: ...
    def time(self, kernel: CompiledKernel, cases: list[Case]) -> TimingReport: ...
    def time_vendor(self, cases: list[Case]) -> VendorReport | None: ...  # the task's [vendor] call; None without one
    # ncu's raw CSV of one launch on a case (harness/ncu_profile.py); ProfilingUnavailable where it cannot
    def profile(self, kernel: CompiledKernel, case: Case, metrics: tuple[str, ...]) -> str: ...
    # A tool call's work: every job sent meanwhile ends by its deadline, the candidate's launches within their limits
    def within(self, limits: CallLimits) -> AbstractContextManager[None]: ...
    def abort(self) -> None: ...                     # kill the candidate's job in flight (from another thread)
    def fresh_worker(self) -> None: ...              # the next candidate job starts in a new worker
    def close(self) -> None: ...


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


class GpuExecutor:
    def __init__(self, task: Task, settings: TimingSettings | None = None, cache: CompileCache | None = None,
                 confine: bool = True, compile_deadline_s: float = DEFAULT_DEADLINE_S, lease_what: str = "serve",
                 gpu: GpuInfo | None = None):
        self.task = task
        self.gpu = gpu  # the GPU placed on (harness/placement.py); None: the one CUDA numbers 0
        self.settings = settings or TimingSettings()
        self.cache = cache or CompileCache()
        self.confine = confine
        self.compiler = CompileService(cache=self.cache, confine=confine, deadline_s=compile_deadline_s)
        self.pool = gpu_worker_pool(gpu.uuid if gpu else None, confine=confine)
        self.referee: Referee | None = None
        self.arch: str | None = None  # the candidate worker's, known once it started
        self._arch_ahead: str | None = None  # NVML's, before that ("": NVML cannot tell)
        self.facts: dict | None = None
        self._lock = threading.Lock()
        self.peaks_cache_dir: Path | None = None  # None: harness.peaks.cache_dir() ($KERNEL_REFEREE_CACHE_DIR, XDG)
        self.lease_what = lease_what  # what this process is, for another waiting for the GPU's lease
        self.gpu_lease: GpuLease | None = None  # known once started: the GPU's host-wide lease (harness/gpu_lease.py)
        self.profiled: Worker | None = None  # profile_kernel's one-shot worker while it runs

    def hello(self) -> dict:
        """The candidate worker's greeting (its device and arch); starts it."""
        hello = self.pool.candidate.ensure_started()
        self.arch = hello["arch"]
        return hello

    def start(self) -> dict:
        if self.facts is not None:
            return self.facts
        hello = self.hello()
        reference = self.compile(self.task.source("reference"), ())
        if not reference.ok:
            raise ExecutorError(f"the task's reference does not compile:\n{reference.log}")
        kernel = CompiledKernel("reference", reference.cubin, reference.lowered_name, self.task.own_launch("reference"))
        self.referee = Referee(self.task, self.pool, kernel, self.settings)
        self.referee.device = hello["device"]
        gpu_uuid = self._placed_uuid(hello.get("gpu_uuid"))
        self.referee.nvml = Nvml(hello.get("pci_bus_id"), uuid=gpu_uuid)
        gpu_uuid = gpu_uuid or self.referee.nvml.uuid()
        key = gpu_key(gpu_uuid, hello.get("pci_bus_id"))
        self.gpu_lease = self.referee.lease = GpuLease(key, self.lease_what) if key else None
        device = hello["device"]
        driver = device["driver_version"]
        self.facts = {
            "gpu": device["name"], "gpu_uuid": gpu_uuid, "gpu_index": self._index(gpu_uuid),
            "compute_capability": device["compute_capability"],
            "arch": hello["arch"],
            "sm_count": device["sm_count"], "l2_bytes": device["l2_bytes"],
            "total_memory_bytes": device["total_memory_bytes"], "sm_clock_khz": device["sm_clock_khz"],
            "memory_clock_khz": device["memory_clock_khz"], "memory_bus_bits": device["memory_bus_bits"],
            "driver_cuda_version": f"{driver // 1000}.{driver % 1000 // 10}", "driver": driver_build(),
            "nvrtc": nvrtc_version(),
            "cuda_bindings": package_version("cuda-bindings"), "event_overhead_ms": hello["event_overhead_ms"],
            **_clock_facts(hello.get("kernel_clock") or {}, self.settings.clock),
            "sandbox": {"confined": self.confine, "landlock_abi": landlock_abi()},
            "gpu_state": self.referee.nvml.read().model_dump(mode="json") if self.referee.nvml.available else None,
            "nvml_note": self.referee.nvml.note,
            "limits": {key: device.get(key) for key in DEVICE_LIMITS},
            "nvrtc_features": nvrtc_features(hello["arch"], self.compiler.compile).model_dump(mode="json"),
        }
        self.facts.update(self._peaks(device))
        return self.facts

    def _placed_uuid(self, seen: str | None) -> str | None:
        """The workers' GPU's UUID; a worker on another GPU than the one placed on is an error, never a result."""
        if self.gpu is not None and seen is not None and seen.lower() != self.gpu.uuid.lower():
            raise ExecutorError(f"the GPU worker runs on {seen}, not on {self.gpu.describe()} where the run was placed")
        return seen or (self.gpu.uuid if self.gpu else None)

    def _index(self, gpu_uuid: str | None) -> int | None:
        """The GPU's index as nvidia-smi numbers it (for people; the UUID names it); None where NVML cannot tell."""
        if self.gpu is not None:
            return self.gpu.index
        return next((g.index for g in list_gpus() if gpu_uuid and g.uuid == gpu_uuid), None)

    def _peaks(self, device: dict) -> dict:
        """The device's measured peaks (cached per device fingerprint), for every timing's roofline fraction."""
        with held(self.gpu_lease):  # measured rates are timings too
            peaks, notes = device_peaks(self.pool.reference, device, self.peaks_cache_dir)
        self.referee.peaks = peaks
        return {"peaks": peaks.model_dump(mode="json") if peaks else None, "peaks_notes": notes}

    def compile_arch(self) -> str | None:
        if self.arch is None and self._arch_ahead is None:
            self._arch_ahead = nvml_arch(self.gpu.uuid if self.gpu else None) or ""
        return self.arch or self._arch_ahead or None

    def compile(self, source: str, options: tuple[str, ...], read_mix: bool = True) -> CompileResult:
        """`read_mix=False`: without the instruction mix of a new compile, which `read_mix` then reads (the GPU
        checks the kernel meanwhile)."""
        # NVRTC runs on the CPU: a GPU worker is started for its arch only where NVML cannot tell it
        arch = self.compile_arch() or self.hello()["arch"]
        return self.compiler.compile(source, self.task.kernel_name, options, arch, within=self._deadline(),
                                     read_mix=read_mix)

    def read_mix(self, compiled: CompileResult) -> CompileResult:
        return self.compiler.read_mix(compiled, within=self._deadline())

    def _deadline(self):
        return self.referee.limits.deadline if self.referee is not None and self.referee.limits else None

    def expected(self, case: Case, seed: int) -> dict[str, np.ndarray]:
        return self.referee.expected(case, seed)

    def preload(self, case: Case, seed: int, outputs: dict[str, np.ndarray]) -> None:
        self.referee.preload(case, seed, outputs)

    def expected_trees(self, case: Case, seed: int) -> dict[str, str] | None:
        return self.referee.expected_trees(case, seed)

    def lock_trees(self, case: Case, seed: int, trees: dict[str, str]) -> None:
        self.referee.lock_trees(case, seed, trees)

    def judging_note(self) -> str | None:
        return self.referee.device_off if self.referee is not None else None

    def prepare(self, cases: list[Case], seeds: dict[str, int]) -> None:
        self.referee.prepare(cases, seeds)

    def check(self, kernel: CompiledKernel, cases: list[Case], seeds: dict[str, int] | None = None,
              against_oracle: bool = False) -> CheckReport:
        return self.referee.check(kernel, cases, seeds, against_oracle)

    def time(self, kernel: CompiledKernel, cases: list[Case]) -> TimingReport:
        return self.referee.time(kernel, cases)

    def time_vendor(self, cases: list[Case]) -> VendorReport | None:
        return time_vendor(self.referee, cases)

    def profile(self, kernel: CompiledKernel, case: Case, metrics: tuple[str, ...]) -> str:
        def run_once(worker: Worker) -> None:
            self.profiled = worker
            self.referee.run_on(worker, kernel, case)

        deadline = self._deadline()
        try:
            with held(self.gpu_lease, deadline):  # the profiler's replays would disturb another process's timing
                return profile_once(kernel.symbol, metrics, run_once, device=self.pool.candidate.device,
                                    confine=self.confine, gpu_uuid=self.pool.gpu_uuid, deadline=deadline)
        finally:
            self.profiled = None

    def within(self, limits: CallLimits) -> AbstractContextManager[None]:
        return self.referee.within(limits) if self.referee is not None else nullcontext()

    def abort(self) -> None:
        self.compiler.interrupt()
        self.pool.candidate.interrupt()
        profiled = self.profiled
        if profiled is not None:
            profiled.interrupt()
        if self.gpu_lease is not None:
            self.gpu_lease.abort()

    def fresh_worker(self) -> None:
        """Stop the candidate worker: the next candidate job starts a new process with a new CUDA context."""
        self.pool.candidate.kill()

    def close(self) -> None:
        self.compiler.close()
        self.pool.close()


def _clock_facts(kernel_clock: dict, wanted: str) -> dict:
    """Which clock this run's timings read, and why where it is not the kernel clock."""
    if wanted == "kernel" and kernel_clock.get("available"):
        version = kernel_clock.get("cupti_version")
        tracing = kernel_clock.get("tracing") or "concurrent"  # a worker that does not say traced concurrently
        return {"clock": "kernel", "clock_note": f"CUPTI activity records, {tracing} kernel tracing (CUPTI API {version})",
                "kernel_floor_ms": kernel_clock.get("empty_kernel_ms")}
    why = "asked for in the settings" if wanted == "events" else (
        f"the kernel clock is unavailable: {kernel_clock.get('note') or 'the worker does not say why'}")
    return {"clock": "events", "clock_note": why, "kernel_floor_ms": None}
