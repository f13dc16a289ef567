"""referee://device and describe_task's device_facts: the run's environment (what the GPU worker read from the
CUDA driver, the measured peaks, the launch floor, the NVRTC probe; server/executor.py) in the agent's terms."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from harness.nvrtc_features import NvrtcFeatures
from server.executor import DEVICE_LIMITS
from server.models import DeviceFacts, LaunchFloor, MeasuredPeaks

_FACTS = ("sm_count", "l2_bytes", "total_memory_bytes", "memory_bus_bits", "memory_clock_khz", "sm_clock_khz")
_RENAMED = {"max_shared_per_block_optin": "shared_bytes_per_block_optin"}
_TENSOR = re.compile(r"tensor_([a-z0-9]+)_tflops")


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _rate(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    return float(value) if ok else None


def device_facts(environment: dict) -> DeviceFacts:
    """The facts of a run's environment (lock.json's); a fact the environment lacks (a run started before it was
    gathered, a fake) is None."""
    limits = environment.get("limits") if isinstance(environment.get("limits"), dict) else {}
    counts = {key: _count(environment.get(key)) for key in _FACTS}
    counts |= {_RENAMED.get(key, key): _count(limits.get(key)) for key in DEVICE_LIMITS}
    capability = environment.get("compute_capability")
    return DeviceFacts(
        gpu=_text(environment.get("gpu")), driver_cuda_version=_text(environment.get("driver_cuda_version")),
        compute_capability=[int(v) for v in capability] if _is_pair(capability) else None, **counts,
        peaks=_peaks(environment.get("peaks"), environment.get("peaks_notes")),
        launch_floor=LaunchFloor(kernel_clock_ms=_rate(environment.get("kernel_floor_ms")),
                                 event_pair_ms=_rate(environment.get("event_overhead_ms"))),
        nvrtc=_nvrtc(environment.get("nvrtc_features")))


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _is_pair(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == 2 and all(_count(v) is not None for v in value)


def _peaks(peaks: Any, notes: Any) -> MeasuredPeaks | None:
    """The measured peaks, or only why they are missing (None when the environment says nothing of them)."""
    told = [str(n) for n in _listed(peaks.get("notes") if isinstance(peaks, dict) else None) + _listed(notes)]
    if not isinstance(peaks, dict):
        return MeasuredPeaks(notes=told) if told else None
    tensor = {m.group(1): rate for key, value in peaks.items()
              if (m := _TENSOR.fullmatch(key)) and (rate := _rate(value)) is not None}
    return MeasuredPeaks(memory_gbps=_rate(peaks.get("memory_gbps")), fp32_tflops=_rate(peaks.get("fp32_tflops")),
                         tensor_tflops=tensor, source=_text(peaks.get("source")), notes=told)


def _listed(value: Any) -> list:
    return list(value) if isinstance(value, list) else []


def _nvrtc(features: Any) -> NvrtcFeatures | None:
    try:
        return NvrtcFeatures.model_validate(features) if isinstance(features, dict) else None
    except ValidationError:
        return None
