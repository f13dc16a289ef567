"""What the device can do at best: memory bandwidth and compute peaks, measured once per device.

The measurement runs in a GPU worker (harness/worker_side/cublas.py, op "peaks"): device-to-device copies of
several sizes well above the L2 (bytes read + bytes written, best of a few), and cuBLAS GEMMs of
8192³ in float32 and in bfloat16 with float32 accumulation where cuBLAS loads. The result is
cached in a JSON file named after the device's fingerprint (GPU, driver build and CUDA version, clocks, cuda-bindings and
cuBLAS versions, this protocol's version), so a changed clock or driver measures again and a file
that does not parse is ignored.

Each timed case is then placed under its roofline: the bound is
max(bytes / bandwidth, flops / compute peak), the compute peak chosen by the task's
`cost.compute`, and the fraction is bound / measured median (1 = at the limit).

The physical limit (physical_peaks, limit_checks, violations) is stricter: the larger of the
measured and the theoretical peak (from the device's clocks, bus and SM count), which no honest
kernel passes; an attempt whose median is beyond it by more than PHYSICAL_MARGIN is refused
(server/suspicion.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from pydantic import BaseModel, ValidationError

from harness.nvml import driver_build
from harness.unit_rates import capability_of, flops_per_sm_clock
from sandbox.answers import Status

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1                     # bump when the measurement changes: old cache files then miss
COPY_L2_MULTIPLES = (4, 8, 16)           # copy sizes, in multiples of the L2 size
COPY_REPEATS = 5
GEMM_SIZE = 8192
GEMM_REPEATS = 5
PEAKS_DEADLINE_S = 180.0
CACHE_ENV = "KERNEL_REFEREE_CACHE_DIR"
_FINGERPRINT_DEVICE_KEYS = ("name", "compute_capability", "sm_count", "sm_clock_khz", "memory_clock_khz",
                            "memory_bus_bits", "total_memory_bytes", "driver_version")


class DevicePeaks(BaseModel):
    memory_gbps: float                      # device-to-device copy, read + written, 1e9 bytes per second
    fp32_tflops: float | None = None        # cuBLAS float32 GEMM (CUDA cores)
    tensor_bf16_tflops: float | None = None  # cuBLAS bfloat16 GEMM, float32 accumulation (tensor cores)
    copy_bytes: list[int] = []              # the copy sizes measured
    gemm_size: int | None = None
    notes: list[str] = []                   # e.g. why a compute peak is missing
    measured_at: str | None = None
    source: str = "measured"                # "measured" now, or "cache" (a file from an earlier measurement)

    def compute_tflops(self, compute: str) -> float | None:
        return {"fp32": self.fp32_tflops, "tensor_bf16": self.tensor_bf16_tflops}.get(compute)


class PeaksUnavailable(RuntimeError):
    """The worker could not measure the peaks."""


# -- roofline ----------------------------------------------------------------------------------
def roofline_ms(peaks: DevicePeaks | None, bytes_moved: float | None, flops: float | None,
                compute: str = "fp32") -> float | None:
    """The least time the work can take on this device: max(bytes / bandwidth, flops / peak)."""
    if peaks is None:
        return None
    bounds_s = []
    if bytes_moved and peaks.memory_gbps:
        bounds_s.append(bytes_moved / (peaks.memory_gbps * 1e9))
    peak_tflops = peaks.compute_tflops(compute)
    if flops and peak_tflops:
        bounds_s.append(flops / (peak_tflops * 1e12))
    return max(bounds_s) * 1e3 if bounds_s else None


def roofline_fraction(bound_ms: float | None, median_ms: float | None) -> float | None:
    """Bound / measured: 1 at the roofline, 0.25 at a quarter of the attainable speed."""
    if not bound_ms or not median_ms:
        return None
    return bound_ms / median_ms


# -- fingerprint and cache -----------------------------------------------------------------------
def fingerprint(device: dict, versions: dict[str, str | None]) -> dict:
    """What the peaks depend on: the device (as a worker's 'ready' message gives it) and the software."""
    fields = {key: device.get(key) for key in _FINGERPRINT_DEVICE_KEYS}
    return {**fields, **{f"{name}_version": value for name, value in sorted(versions.items())},
            "protocol": PROTOCOL_VERSION}


def software_versions() -> dict[str, str | None]:
    found = {"nvidia-driver": driver_build()}
    for package in ("cuda-bindings", "nvidia-cublas"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = None
    return found


def cache_dir() -> Path:
    """$KERNEL_REFEREE_CACHE_DIR, else $XDG_CACHE_HOME/kernel-referee, else ~/.cache/kernel-referee."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kernel-referee"


def cache_path(folder: Path, print_: dict) -> Path:
    digest = hashlib.sha256(json.dumps(print_, sort_keys=True).encode()).hexdigest()[:16]
    return folder / f"peaks-{digest}.json"


def read_cache(folder: Path, print_: dict) -> DevicePeaks | None:
    """The cached peaks of exactly this fingerprint; None for a miss or a file that does not parse."""
    path = cache_path(folder, print_)
    try:
        document = json.loads(path.read_text())
        if document.get("fingerprint") != print_:
            return None
        peaks = DevicePeaks.model_validate(document["peaks"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ValidationError) as exc:
        log.warning("ignoring the peaks cache %s: %s", path, exc)
        return None
    if not peaks.memory_gbps > 0:
        return None
    return peaks.model_copy(update={"source": "cache"})


def write_cache(folder: Path, print_: dict, peaks: DevicePeaks) -> Path:
    path = cache_path(folder, print_)
    folder.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps({"fingerprint": print_, "peaks": peaks.model_dump(mode="json")}, indent=2))
    os.replace(temporary, path)  # a reader never sees half a file
    return path


# -- measuring -----------------------------------------------------------------------------------
def peaks_job(l2_bytes: int) -> dict:
    return {"op": "peaks", "copy_bytes": [multiple * l2_bytes for multiple in COPY_L2_MULTIPLES],
            "copy_repeats": COPY_REPEATS, "gemm_size": GEMM_SIZE, "gemm_repeats": GEMM_REPEATS}


def peaks_from_answer(answer: dict) -> DevicePeaks:
    """The worker's answer to a peaks job, read strictly: per-run timings in, best rates out."""
    if answer.get("status") != Status.OK:
        raise PeaksUnavailable(f"{answer.get('error')}: {answer.get('detail')}")
    copies = answer.get("copies")  # [{"bytes": N, "ms": [t, ...]}, ...]
    if not isinstance(copies, list) or not copies:
        raise PeaksUnavailable("the peaks answer has no copy timings")
    best_gbps = max(2 * float(c["bytes"]) / (min(c["ms"]) * 1e-3) / 1e9 for c in copies)
    gemm = answer.get("gemm") or {}  # {"fp32": [ms, ...], "tensor_bf16": [ms, ...]}
    size = answer.get("gemm_size")
    flops = 2.0 * size ** 3 if size else None

    def tflops(key: str) -> float | None:
        times = gemm.get(key)
        return flops / (min(times) * 1e-3) / 1e12 if flops and times else None

    return DevicePeaks(memory_gbps=best_gbps, fp32_tflops=tflops("fp32"), tensor_bf16_tflops=tflops("tensor_bf16"),
                       copy_bytes=[int(c["bytes"]) for c in copies], gemm_size=size,
                       notes=list(answer.get("notes", [])),
                       measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def measure(worker, device: dict) -> DevicePeaks:
    """Ask a GPU worker (sandbox.pool.Worker) to measure; raises PeaksUnavailable or the worker's errors."""
    answer, _ = worker.call(peaks_job(int(device["l2_bytes"])), [], PEAKS_DEADLINE_S, 1 << 20)
    return peaks_from_answer(answer)


def device_peaks(worker, device: dict, folder: Path | None = None) -> tuple[DevicePeaks | None, list[str]]:
    """The device's peaks from the cache or measured now (and cached); (None, notes) when neither works."""
    folder = cache_dir() if folder is None else folder
    print_ = fingerprint(device, software_versions())
    cached = read_cache(folder, print_)
    if cached is not None:
        return cached, []
    try:
        peaks = measure(worker, device)
    except Exception as exc:  # noqa: BLE001 - the peaks are informative: the run goes on without them
        log.warning("device peaks could not be measured", exc_info=True)
        return None, [f"device peaks could not be measured: {type(exc).__name__}: {exc}"[:1000]]
    try:
        write_cache(folder, print_, peaks)
    except OSError as exc:
        return peaks, [f"the peaks were measured but not cached in {folder}: {exc}"]
    return peaks, []


# -- the physical limit ---------------------------------------------------------------------------
# A candidate's median is refused (reason beyond_physical_limit), not merely re-checked, when it is faster
# than the device can move the task's bytes or do its flops, by more than this margin. The median is the
# score, and is judged itself: the upper end of its confidence interval is not, since a kernel that runs
# fast on a little over half of its launches and slow on the rest puts that end among its slow launches
# while its median, the score, stays fast (docs/timing.md, "Timing shapes"). The peak is already the larger of the
# measured rate and the datasheet-style theoretical one, so the margin only absorbs what neither sees:
# a boost clock above the base clock the device reports (CU_DEVICE_ATTRIBUTE_CLOCK_RATE is the base
# clock on some boards), a cost formula that rounds the compulsory traffic up a little, and timer
# granularity on the smallest cases. 10% is far above those and far below the 3x of a kernel that
# skips work (the 13.9x "memo" kernel claimed 160 TFLOP/s of fp32 against a 66.9 TFLOP/s device).
PHYSICAL_MARGIN = 0.10

UNITS = {"memory": "GB/s", "compute": "TFLOP/s"}


def theoretical_peaks(device: dict) -> dict[str, float | None]:
    """What the device's own facts allow at most ({memory_gbps, fp32_tflops, half2_tflops, tensor_bf16_tflops,
    tensor_fp16_tflops, tensor_tf32_tflops, tensor_fp8_tflops, tensor_int8_tflops, tensor_fp64_tflops}, None where
    they cannot tell): DRAM bandwidth = memory clock x 2 (double data rate) x bus bits / 8; each compute kind =
    SMs x its dense flops per SM per clock (harness/unit_rates.py) x SM clock. `device` is a run's environment
    (or a worker's device facts): memory_clock_khz, memory_bus_bits, sm_count, sm_clock_khz, compute_capability."""
    def number(key: str) -> float | None:
        value = device.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None

    memory_khz, bus_bits = number("memory_clock_khz"), number("memory_bus_bits")
    sms, sm_khz = number("sm_count"), number("sm_clock_khz")
    memory = memory_khz * 1e3 * 2 * bus_bits / 8 / 1e9 if memory_khz and bus_bits else None

    def compute(per_sm_clock: float | None) -> float | None:
        return sms * per_sm_clock * sm_khz * 1e3 / 1e12 if sms and sm_khz and per_sm_clock else None

    rates = flops_per_sm_clock(capability_of(device.get("compute_capability")))
    return {"memory_gbps": memory, **{f"{kind}_tflops": compute(rate) for kind, rate in rates.items()}}


class PhysicalPeak(BaseModel):
    """One of the device's limits: the larger of the measured and the theoretical figure."""

    kind: str                          # "memory", or the compute kind ("fp32", "half2", "tensor_bf16", ...)
    unit: str                          # "GB/s" or "TFLOP/s"
    peak: float                        # max(measured, theoretical)
    measured: float | None = None
    theoretical: float | None = None

    def describe(self) -> str:
        """'66.9 TFLOP/s peak (theoretical; measured 51.2)'."""
        source = "theoretical" if self.peak == self.theoretical else "measured"
        other = ("measured", self.measured) if source == "theoretical" else ("theoretical", self.theoretical)
        also = f"; {other[0]} {_figure(other[1])}" if other[1] is not None else ""
        return f"{_figure(self.peak)} {self.unit} peak ({source}{also})"


def _figure(value: float) -> str:
    return f"{value:.1f}" if value >= 10 else f"{value:.3g}"


def physical_peaks(environment: dict) -> dict[str, PhysicalPeak]:
    """The device's physical limits from a run's environment: "memory" and each compute kind (theoretical_peaks'
    keys), each the max of the measured peak (environment["peaks"], harness/peaks.py: memory, fp32 and
    tensor_bf16 are measured) and the theoretical one; a limit with neither is absent, and is then not checked.
    A measured rate can be below what an honest kernel reaches (cuBLAS's float32 GEMM is not the CUDA cores'
    limit), so it never stands alone when the device's facts give the theoretical one."""
    measured = environment.get("peaks") or {}
    theory = theoretical_peaks(environment)
    found = {}
    for key, theoretical in theory.items():
        kind = key.removesuffix("_gbps").removesuffix("_tflops")
        seen = measured.get(key)
        seen = float(seen) if isinstance(seen, (int, float)) and seen > 0 else None
        values = [v for v in (seen, theoretical) if v]
        if values:
            found[kind] = PhysicalPeak(kind=kind, unit=UNITS["memory" if kind == "memory" else "compute"],
                                       peak=max(values), measured=seen, theoretical=theoretical)
    return found


def physical_bound_ms(peak: PhysicalPeak, work: float) -> float:
    """The least time `work` (bytes for "memory", flops otherwise) can take at the peak."""
    scale = 1e9 if peak.kind == "memory" else 1e12
    return work / (peak.peak * scale) * 1e3


class LimitCheck(BaseModel):
    """One case's median against one physical limit."""

    case: str
    kind: str                          # "memory" or the compute class
    work: float                        # flops of the case, or the bytes it must move through DRAM while it runs
    cache_bytes: float | None = None   # memory: the L2 deducted from the case's bytes (see limit_checks)
    unit: str
    peak: PhysicalPeak
    bound_ms: float                    # work at the peak
    median_ms: float                   # the score's time: the median launch, the one judged
    achieved: float                    # the rate at the median, in `unit`
    margin: float
    beyond: bool                       # median_ms x (1 + margin) < bound_ms

    def detail(self) -> str:
        """'square-2048: 160.3 TFLOP/s of fp32 at the median 0.107 ms, beyond the device's 66.9 TFLOP/s peak
        (theoretical; measured 51.2) by more than the 10% margin'."""
        what = "memory traffic" if self.kind == "memory" else self.kind
        if self.cache_bytes:
            what += (f" (its {(self.work + self.cache_bytes) / 1e6:.1f} MB less the {self.cache_bytes / 1e6:.1f} MB "
                     f"of L2 its writes may stay in)")
        return (f"{self.case}: {_figure(self.achieved)} {self.unit} of {what} at the median {self.median_ms:.3g} ms, "
                f"beyond the device's {self.peak.describe()} by more than the {self.margin:.0%} margin")


def limit_checks(peaks: dict[str, PhysicalPeak], case: str, median_ms: float,
                 bytes_moved: float | None, flops: float | None, compute: str = "fp32",
                 margin: float = PHYSICAL_MARGIN, cache_bytes: float | None = None) -> list[LimitCheck]:
    """The case's median against the memory limit (for its bytes) and its compute class's limit (for its flops),
    where the device has that limit and the task declares that work. Beyond the limit when the median, made
    `margin` slower, is still faster than the bound: no slow launch moves that test (see PHYSICAL_MARGIN).

    `cache_bytes` (the L2's size) is deducted from the bytes: the L2 is flushed before every sample, so the
    inputs come from DRAM, but the L2 writes back, so up to its size of outputs can be written into it and
    reach DRAM only after the kernel has ended. The bytes that must cross the DRAM bus while the kernel runs
    are at least bytes - L2; a case whose bytes fit in the L2 has no memory bound."""
    cache = float(cache_bytes) if cache_bytes and cache_bytes > 0 else None
    dram_bytes = bytes_moved - cache if bytes_moved and cache else bytes_moved
    checks = []
    for kind, work in (("memory", dram_bytes), (compute, flops)):
        peak = peaks.get(kind)
        if peak is None or not work or work <= 0 or median_ms <= 0:
            continue
        bound = physical_bound_ms(peak, work)
        scale = 1e9 if kind == "memory" else 1e12
        checks.append(LimitCheck(case=case, kind=kind, work=work, cache_bytes=cache if kind == "memory" else None,
                                 unit=peak.unit, peak=peak, bound_ms=bound,
                                 median_ms=median_ms, achieved=work / (median_ms * 1e-3) / scale, margin=margin,
                                 beyond=median_ms * (1 + margin) < bound))
    return checks


def violations(checks: list[LimitCheck]) -> list[LimitCheck]:
    """The checks beyond the limit, the worst per case (the highest achieved / peak) first in case order."""
    worst: dict[str, LimitCheck] = {}
    for check in checks:
        if check.beyond and (check.case not in worst
                             or check.achieved / check.peak.peak > worst[check.case].achieved / worst[check.case].peak.peak):
            worst[check.case] = check
    return list(worst.values())
