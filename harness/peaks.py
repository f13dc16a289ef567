"""What the device can do at best: memory bandwidth and compute peaks, measured once per device.

The measurement runs in a GPU worker (harness/vendor.py, op "peaks"): device-to-device copies of
several sizes well above the L2 (bytes read + bytes written, best of a few), and cuBLAS GEMMs of
8192³ in float32 and in bfloat16 with float32 accumulation where cuBLAS loads. The result is
cached in a JSON file named after the device's fingerprint (GPU, driver build and CUDA version, clocks, cuda-bindings and
cuBLAS versions, this protocol's version), so a changed clock or driver measures again and a file
that does not parse is ignored.

Each timed case is then placed under its roofline: the bound is
max(bytes / bandwidth, flops / compute peak), the compute peak chosen by the task's
`cost.compute`, and the fraction is bound / measured median (1 = at the limit).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, ValidationError

from harness.nvml import driver_build

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
    from importlib.metadata import PackageNotFoundError, version

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
    if answer.get("status") != "ok":
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
