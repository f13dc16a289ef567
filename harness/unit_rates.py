"""What one SM does per clock on each arithmetic unit, by compute capability: the datasheets' dense rates.

The physical limit (harness/peaks.py) multiplies these by the device's SMs and SM clock. Each figure is the
hardware's full rate, the larger one where boards differ, since the limit refuses only what no kernel can do:
a figure too high lets a few impossible results through, one too low refuses an honest kernel.

Checked against the datasheets: H100 SXM (132 SMs) 989 TFLOP/s dense bf16 and fp16, 495 tf32, 1979 fp8 and
int8 at its 1830 MHz tensor boost (4096, 2048 and 8192 per SM per clock), 67 fp64 tensor at 1980 MHz (256);
A100 (108 SMs, 1410 MHz) 312 bf16 and fp16, 156 tf32, 624 int8, 19.5 fp64 tensor (2048, 1024, 4096, 128);
L40S and the other 8.9 parts run fp8 and int8 at twice their bf16 rate.
"""

from __future__ import annotations

# CUDA-core float32 lanes per SM; each does one FMA (2 flops) per clock.
FP32_LANES_EXACT = {(6, 0): 64, (6, 1): 128, (6, 2): 128, (8, 0): 64, (8, 6): 128, (8, 7): 128, (8, 9): 128,
                    (9, 0): 128}
FP32_LANES_MAJOR = {7: 64, 10: 128, 11: 128, 12: 128}
# half2 on the CUDA cores: at most four times the float32 flops of the same SM (8.0's 78 TFLOP/s fp16 against
# 19.5 fp32; 9.0 has twice, 8.6 and 8.9 once): four times is the bound on every architecture.
HALF2_PER_FP32 = 4

# Dense tensor-core flops (ops for the integer types) per SM per clock, by input type. GA10x, Ada and
# Blackwell RTX (8.6, 8.9, 12.x) are listed at their full rate (GeForce boards halve it for float32
# accumulation); Blackwell datacenter (10.x) doubles Hopper (B200's 2.25 PFLOP/s bf16 on 148 SMs).
# Earlier architectures, and types an architecture lacks, are not listed: no theoretical peak.
TENSOR_EXACT: dict[str, dict[tuple[int, int], int]] = {
    "bf16": {(8, 0): 2048, (8, 6): 1024, (8, 7): 2048, (8, 9): 1024, (9, 0): 4096},
    "fp16": {(7, 0): 1024, (7, 2): 1024, (7, 5): 1024, (8, 0): 2048, (8, 6): 1024, (8, 7): 2048, (8, 9): 1024,
             (9, 0): 4096},
    "tf32": {(8, 0): 1024, (8, 6): 512, (8, 7): 1024, (8, 9): 512, (9, 0): 2048},
    "fp8": {(8, 9): 2048, (9, 0): 8192},
    "int8": {(7, 2): 2048, (7, 5): 2048, (8, 0): 4096, (8, 6): 2048, (8, 7): 4096, (8, 9): 2048, (9, 0): 8192},
    "fp64": {(8, 0): 128, (9, 0): 256},
}
TENSOR_MAJOR: dict[str, dict[int, int]] = {
    "bf16": {10: 8192, 12: 1024}, "fp16": {10: 8192, 12: 1024}, "tf32": {10: 4096, 12: 512},
    "fp8": {10: 16384, 12: 2048}, "int8": {10: 16384, 12: 2048}, "fp64": {10: 256},
}


def capability_of(value) -> tuple[int, int] | None:
    """(major, minor) from [9, 0], (9, 0), "9.0" or "sm_90"; None when it does not read."""
    try:
        if isinstance(value, str):
            text = value.strip().lower().removeprefix("sm_").removeprefix("compute_")
            if "." in text:
                major, minor = text.split(".", 1)
                return int(major), int(minor)
            return int(text[:-1]), int(text[-1])
        major, minor = value
        return int(major), int(minor)
    except (TypeError, ValueError):
        return None


def _per_sm(table: dict, by_major: dict, capability: tuple[int, int] | None) -> int | None:
    if capability is None:
        return None
    return table.get(capability, by_major.get(capability[0]))


def flops_per_sm_clock(capability: tuple[int, int] | None) -> dict[str, int | None]:
    """Per SM per clock, by compute kind ("fp32", "half2", "tensor_bf16", "tensor_fp16", "tensor_tf32",
    "tensor_fp8", "tensor_int8", "tensor_fp64"); None where the architecture is not known or lacks the unit."""
    lanes = _per_sm(FP32_LANES_EXACT, FP32_LANES_MAJOR, capability)
    rates: dict[str, int | None] = {"fp32": 2 * lanes if lanes else None,
                                    "half2": 2 * lanes * HALF2_PER_FP32 if lanes else None}
    for input_type, table in TENSOR_EXACT.items():
        rates[f"tensor_{input_type}"] = _per_sm(table, TENSOR_MAJOR.get(input_type, {}), capability)
    return rates
