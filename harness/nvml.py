"""What the GPU was doing around a timing: clocks, throttle reasons, temperature, power and the
other processes on the device, read through NVML by the trusted parent.

A timing taken while the clocks were pulled down, or while another process shared the GPU, is
noise; the referee records these readings beside the samples and warns about them, so that a
person reading a run can tell a measurement from an accident. Where NVML is missing (no driver,
no library) every reading is None with a note: the timing still counts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

log = logging.getLogger(__name__)

# nvmlClocksEventReasons bits (nvml.h). Idle, application-clock and sync-boost settings are
# benign; the others mean the GPU ran below the clocks it could have.
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
BENIGN = {"gpu_idle", "applications_clocks_setting", "sync_boost", "display_clock_setting"}


class GpuState(BaseModel):
    """One reading of the device."""

    model_config = ConfigDict(frozen=True)

    sm_clock_mhz: int | None = None
    max_sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    throttle: list[str] = []
    processes: list[int] = []  # pids with a compute context on the device (as NVML sees them)


class BoardFacts(BaseModel):
    """What a board is set to, read once: an environment fingerprint's NVML half (guard/fingerprint.py)."""

    model_config = ConfigDict(frozen=True)

    name: str | None = None
    uuid: str | None = None
    max_sm_clock_mhz: int | None = None
    max_memory_clock_mhz: int | None = None
    application_sm_clock_mhz: int | None = None  # a pinned clock (nvidia-smi -ac) changes every latency
    power_limit_w: float | None = None
    ecc_enabled: bool | None = None  # ECC on takes memory bandwidth
    driver_cuda_version: str | None = None


class GpuWatch(BaseModel):
    """Readings before and after one timing job, and what they imply."""

    model_config = ConfigDict(frozen=True)

    before: GpuState
    after: GpuState
    other_processes: list[int] = []
    warnings: list[str] = []


def decode_reasons(mask: int) -> list[str]:
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_REASONS)
    return names + ([f"unknown_0x{unknown:x}"] if unknown else [])


def judge(before: GpuState, after: GpuState, ours: Iterable[int]) -> GpuWatch:
    """Warnings for a timing taken between these two readings; `ours` are the referee's own pids."""
    mine = set(ours)
    seen = {p for p in (*before.processes, *after.processes) if p > 0}
    if seen & mine or not seen:
        others = sorted(seen - mine)
    else:  # NVML shows pids of another pid namespace (a container): only the count can tell
        others = sorted(seen) if len(seen) > len(mine) else []
    warnings = []
    harmful = sorted({r for r in (*before.throttle, *after.throttle) if r not in BENIGN})
    if harmful:
        warnings.append(f"the GPU was throttled during the timing ({', '.join(harmful)}): samples may be slow")
    if others:
        warnings.append(f"other processes held a context on the GPU during the timing (pids {', '.join(map(str, others))}): "
                        "if they ran work, comparisons made meanwhile are noise")
    clocks = [s.sm_clock_mhz for s in (before, after) if s.sm_clock_mhz]
    peak = after.max_sm_clock_mhz or before.max_sm_clock_mhz
    if peak and clocks and min(clocks) < 0.8 * peak and "gpu_idle" not in (*before.throttle, *after.throttle):
        warnings.append(f"the SM clock read {min(clocks)} MHz, under 80% of its {peak} MHz maximum")
    return GpuWatch(before=before, after=after, other_processes=others, warnings=warnings)


class Nvml:
    """NVML for one device, found by its UUID or its PCI bus id (CUDA and NVML may number devices differently;
    an index is NVML's own, and only a last resort)."""

    _lock = threading.Lock()

    def __init__(self, pci_bus_id: str | None = None, index: int = 0, uuid: str | None = None):
        self.note: str | None = None
        self._nvml = self._handle = None
        self._max_sm_clock_mhz: int | None = None  # a property of the board: read once (2 ms a call on an H200)
        try:
            import pynvml  # optional: without NVML the referee still times, with a note
            pynvml.nvmlInit()
            self._handle = _handle(pynvml, uuid, pci_bus_id, index)
            self._nvml = pynvml
        except Exception as exc:  # noqa: BLE001 - ImportError or any NVMLError: no readings
            self.note = f"NVML unavailable: {exc}"
            log.info(self.note)

    @property
    def available(self) -> bool:
        return self._handle is not None

    def uuid(self) -> str | None:
        """The device's UUID (GPU-...), as the worker's driver also gives it; None without NVML."""
        value = _try(self._nvml.nvmlDeviceGetUUID, self._handle) if self.available else None
        return value.decode() if isinstance(value, bytes) else value

    def read(self) -> GpuState:
        if not self.available:
            return GpuState()
        n, h = self._nvml, self._handle
        with self._lock:
            if self._max_sm_clock_mhz is None:
                self._max_sm_clock_mhz = _try(n.nvmlDeviceGetMaxClockInfo, h, n.NVML_CLOCK_SM)
            return GpuState(
                sm_clock_mhz=_try(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM),
                max_sm_clock_mhz=self._max_sm_clock_mhz,
                memory_clock_mhz=_try(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_MEM),
                temperature_c=_try(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU),
                power_w=_scaled(_try(n.nvmlDeviceGetPowerUsage, h), 1e-3),
                throttle=decode_reasons(_try(_reasons_call(n), h) or 0),
                processes=[int(p.pid) for p in (_try(n.nvmlDeviceGetComputeRunningProcesses, h) or [])],
            )


    def board(self) -> BoardFacts:
        """The board's name, UUID, clock ceilings, power limit and ECC mode; every field None without NVML."""
        if not self.available:
            return BoardFacts()
        n, h = self._nvml, self._handle
        name = _try(n.nvmlDeviceGetName, h)
        cuda = _try(n.nvmlSystemGetCudaDriverVersion)
        ecc = _try(n.nvmlDeviceGetEccMode, h)  # (current, pending)
        return BoardFacts(
            name=name.decode() if isinstance(name, bytes) else name, uuid=self.uuid(),
            max_sm_clock_mhz=_try(n.nvmlDeviceGetMaxClockInfo, h, n.NVML_CLOCK_SM),
            max_memory_clock_mhz=_try(n.nvmlDeviceGetMaxClockInfo, h, n.NVML_CLOCK_MEM),
            application_sm_clock_mhz=_try(n.nvmlDeviceGetApplicationsClock, h, n.NVML_CLOCK_SM),
            power_limit_w=_scaled(_try(n.nvmlDeviceGetPowerManagementLimit, h), 1e-3),
            ecc_enabled=bool(ecc[0]) if ecc else None,
            driver_cuda_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None)


def driver_build() -> str | None:
    """The NVIDIA driver's version, as nvidia-smi prints it ("580.159.04"); None without NVML.

    The CUDA version a driver supports (13.0) spans many driver builds, whose code generation and
    scheduling can differ: a run's environment names the build, so a replay on another one says so.
    """
    try:
        import pynvml  # optional: without NVML the build is unknown
        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
    except Exception:  # noqa: BLE001 - ImportError or any NVMLError: the build is unknown
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


def _handle(n, uuid: str | None, pci_bus_id: str | None, index: int):
    if uuid:
        return n.nvmlDeviceGetHandleByUUID(uuid)
    if pci_bus_id:
        return n.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
    return n.nvmlDeviceGetHandleByIndex(index)


def _reasons_call(n):
    return getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or n.nvmlDeviceGetCurrentClocksThrottleReasons


def _try(call, *args):
    try:
        return call(*args)
    except Exception:  # noqa: BLE001 - a reading the driver does not support is simply absent
        return None


def _scaled(value, factor):
    return None if value is None else round(value * factor, 1)
