"""The run's environment (lock.json `environment`) as rows a person reads: label, value with its unit.

The GPU's state at the start (harness/nvml.py GpuState) and the device's measured peaks (harness/peaks.py
DevicePeaks) get a row per reading; any other nested object a row per key. Values are plain text: the
renderer escapes them. A field missing or of an unexpected type reads "—", never an error: an old or odd
run folder still renders.
"""

from __future__ import annotations

import json
import math
from typing import Any

DASH = "—"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _with_unit(value: Any, unit: str, digits: str = ",.0f") -> str:
    number = _number(value)
    return DASH if number is None else f"{number:{digits}} {unit}"


def _listed(value: Any, empty: str = "none") -> str:
    if not isinstance(value, list):
        return DASH if value is None else scalar(value)
    return ", ".join(scalar(v) for v in value) if value else empty


def scalar(value: Any) -> str:
    """A value as text: strings as they are, anything else as compact JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def gpu_state_rows(state: Any) -> list[tuple[str, str]]:
    """One NVML reading of the device when the run started."""
    label = "GPU state at the start"
    if not isinstance(state, dict):
        return [(label, "not read (no NVML)" if state is None else scalar(state))]
    clock = _with_unit(state.get("sm_clock_mhz"), "MHz")
    top = _number(state.get("max_sm_clock_mhz"))
    return [
        (f"{label}: SM clock", clock if top is None else f"{clock} (maximum {top:,.0f} MHz)"),
        (f"{label}: memory clock", _with_unit(state.get("memory_clock_mhz"), "MHz")),
        (f"{label}: temperature", _with_unit(state.get("temperature_c"), "°C")),
        (f"{label}: power", _with_unit(state.get("power_w"), "W", ",.1f")),
        (f"{label}: throttle reasons", _listed(state.get("throttle"))),
        (f"{label}: processes on the GPU (pids)", _listed(state.get("processes"))),
    ]


def peaks_rows(peaks: Any) -> list[tuple[str, str]]:
    """The device's measured peaks, the roofline and the physical limit of every timing."""
    if not isinstance(peaks, dict):
        return [("peaks", "not measured" if peaks is None else scalar(peaks))]
    copies = _listed(peaks.get("copy_bytes"), DASH)
    gemm = _number(peaks.get("gemm_size"))
    rows = [
        ("peak memory bandwidth", f"{_with_unit(peaks.get('memory_gbps'), 'GB/s')} (device-to-device copies of "
                                  f"{copies} bytes, read + written)"),
        ("peak float32", f"{_with_unit(peaks.get('fp32_tflops'), 'TFLOP/s', ',.1f')} (cuBLAS GEMM"
                         + ("" if gemm is None else f", {gemm:.0f}³") + ")"),
        ("peak bfloat16 tensor", _with_unit(peaks.get("tensor_bf16_tflops"), "TFLOP/s", ",.1f")),
        ("peaks measured", f"{peaks.get('measured_at') or DASH} ({peaks.get('source') or DASH})"),
    ]
    if peaks.get("notes"):
        rows.append(("peaks notes", "; ".join(scalar(n) for n in peaks["notes"]) if isinstance(peaks["notes"], list)
                     else scalar(peaks["notes"])))
    return rows


def environment_rows(environment: dict[str, Any]) -> list[tuple[str, str]]:
    """Every field of the environment, in its order; nested objects as rows of their own."""
    rows: list[tuple[str, str]] = []
    for key, value in environment.items():
        if key == "gpu_state":
            rows += gpu_state_rows(value)
        elif key == "peaks":
            rows += peaks_rows(value)
        elif key == "peaks_notes":
            rows.append((key, _listed(value)))
        elif isinstance(value, dict):
            rows += [(f"{key}: {sub}", scalar(v)) for sub, v in value.items()] or [(key, "none")]
        else:
            rows.append((key, scalar(value)))
    return rows
