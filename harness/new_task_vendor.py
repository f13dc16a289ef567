"""The `[vendor]` table `kernel-referee new-task` proposes for a GEMM-shaped signature: cuBLAS computing the
same product, timed as a yardstick beside the kernels ("vs cuBLAS" in check and the report, never a verdict).

GEMM-shaped: two 2-D inputs A (M x K) and B (K x N) of one dtype and a 2-D output C (M x N), the three shapes
written with the same expressions, in a pair of dtypes cuBLAS takes (harness/worker_side/cublas_api.py). The
shapes cannot say that the kernel computes C = A·B (an A·B plus a bias is shaped the same): new-task says what
it inferred, and cuBLAS's outputs are checked like a kernel's, so a wrong guess shows as a failing yardstick.
"""

from __future__ import annotations

from itertools import permutations

from harness.task_model import Param, Vendor
from harness.worker_side.cublas_api import GEMM_TYPES


def _gemm(a: Param, b: Param, c: Param) -> Vendor | None:
    if not all(len(p.shape) == 2 for p in (a, b, c)) or a.dtype != b.dtype or (a.dtype, c.dtype) not in GEMM_TYPES:
        return None
    (m, k), (k_b, n), (m_c, n_c) = a.shape, b.shape, c.shape
    if (k_b, m_c, n_c) != (k, m, n):
        return None
    return Vendor(library="cublas", op="gemm", a=a.name, b=b.name, c=c.name, m=m, n=n, k=k)


def gemm_vendor(params: list[Param]) -> Vendor | None:
    """A cuBLAS gemm for the first (A, B, C) of the parameters shaped as one, in the signature's order; None
    when none is."""
    inputs = [p for p in params if p.kind == "input"]
    outputs = [p for p in params if p.kind == "output"]
    for a, b in permutations(inputs, 2):
        for c in outputs:
            if (vendor := _gemm(a, b, c)) is not None:
                return vendor
    return None


def said(vendor: Vendor) -> str:
    """What new-task says it inferred."""
    return (f"[vendor] cuBLAS gemm {vendor.c} = {vendor.a} ({vendor.m} x {vendor.k}) x {vendor.b} ({vendor.k} x "
            f"{vendor.n}), a yardstick timed beside the kernels (delete the table if the kernel computes "
            "something else of these shapes)")
