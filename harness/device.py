"""Is there a usable NVIDIA GPU here, and if not, why not (in words a user can act on)."""

from __future__ import annotations

import functools


@functools.cache
def gpu_absent_reason() -> str | None:
    """None when a CUDA device is usable; otherwise the reason, e.g. no driver library."""
    try:
        from cuda.bindings import driver
    except ImportError as exc:  # pragma: no cover - a broken install
        return f"cuda-bindings is not importable: {exc}"
    try:
        result = driver.cuInit(0)
    except Exception as exc:  # noqa: BLE001 - DynamicLibNotFoundError and friends
        return f"no NVIDIA driver library (libcuda) on this machine ({type(exc).__name__})"
    if result[0] != driver.CUresult.CUDA_SUCCESS:
        return f"cuInit failed: {result[0].name}"
    error, count = driver.cuDeviceGetCount()
    if error != driver.CUresult.CUDA_SUCCESS or count == 0:
        return "the NVIDIA driver reports no CUDA device"
    return None
