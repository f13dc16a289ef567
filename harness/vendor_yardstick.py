"""The vendor baseline, parent side: what the task's `[vendor]` table asks of cuBLAS, and its result.

The GPU side is harness/worker_side/cublas.py. The parent turns the manifest into the exact cublasGemmEx
arguments (so the mapping is tested without a GPU), times the call with the same protocol as any
candidate (harness/referee.py `Referee.time_vendor`: warm-ups, per-launch events, cold L2,
rotated input sets, re-checked outputs), and reports it as a yardstick ("vs cuBLAS"). A cuBLAS
that cannot be loaded is a note, never a failure of the run.
"""

from __future__ import annotations

import logging
import os
import site
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from harness import expr
from harness.settings import Unavailable
from harness.worker_side.cublas_api import CUBLAS_GEMM_DEFAULT, CUBLAS_OP_N, CUDA_TYPES, GEMM_TYPES
from sandbox.grants import cuda_paths, python_paths
from harness.stats import geometric_mean
from harness.results import TimingReport
from harness.timing_shape import shape_waived

if TYPE_CHECKING:
    from harness.referee import Referee
    from harness.task_model import Case, Task

log = logging.getLogger(__name__)

LIBRARY_NAMES = {"cublas": "cuBLAS"}
# Where the nvidia-cublas wheels put the library, below a site-packages folder (as cuda.pathfinder searches).
WHEEL_LIBRARY_FILES = ("nvidia/cu13/lib/libcublas.so.13", "nvidia/cublas/lib/libcublas.so.12")


def gemm_call(task: "Task", case: "Case") -> dict:
    """The cublasGemmEx arguments for one case, as sent to the worker.

    Row-major C (m x n) = A (m x k) · B (k x n) is, read column-major, Cᵀ (n x m) = Bᵀ (n x k) · Aᵀ
    (k x m): a row-major matrix of r x c with row stride c is the column-major matrix of c x r with
    leading dimension c. So cuBLAS gets (m, n, k) = (n, m, k), its A operand is B with lda = n, its
    B operand is A with ldb = k, and C has ldc = n; no transposes.
    """
    vendor = task.vendor
    if vendor is None or vendor.op != "gemm":
        raise ValueError(f"task {task.name!r} declares no gemm vendor baseline")
    m, n, k = (expr.evaluate_int(getattr(vendor, key), case.dims) for key in ("m", "n", "k"))
    dtypes = {p.name: p.dtype for p in task.params}
    ab_dtype, c_dtype = dtypes[vendor.a], dtypes[vendor.c]
    return {"library": vendor.library, "op": "gemm", "transa": CUBLAS_OP_N, "transb": CUBLAS_OP_N,
            "m": n, "n": m, "k": k,
            "a_param": vendor.b, "a_type": CUDA_TYPES[dtypes[vendor.b]], "lda": n,
            "b_param": vendor.a, "b_type": CUDA_TYPES[ab_dtype], "ldb": k,
            "c_param": vendor.c, "c_type": CUDA_TYPES[c_dtype], "ldc": n,
            "compute_type": GEMM_TYPES[(ab_dtype, c_dtype)], "algo": CUBLAS_GEMM_DEFAULT,
            "alpha": 1.0, "beta": 0.0}


class VendorReport(BaseModel):
    """The vendor library timed on the performance cases, or why it was not."""

    name: str                              # "cuBLAS"
    library: str                           # "cublas"
    available: bool                        # the library loaded in the worker
    timing: TimingReport | None = None     # every case checked against the reference while timed
    notes: list[str] = []
    gpu_seconds: float = 0.0

    @property
    def medians_ms(self) -> dict[str, float]:
        """Median latency per case that passed the protocol; empty when none did."""
        if self.timing is None:
            return {}
        return {c.case: c.stats.median_ms for c in self.timing.cases if c.passed and c.stats}


def time_vendor(referee: "Referee", cases: list["Case"]) -> VendorReport | None:
    """Time the task's vendor call on `cases`; None when the task declares none. Never raises for
    a library that is missing or fails: that is a note."""
    vendor = referee.task.vendor
    if vendor is None:
        return None
    name = LIBRARY_NAMES[vendor.library]
    started = time.perf_counter()
    try:
        timing = shape_waived(referee.time_vendor(cases, lambda case: gemm_call(referee.task, case)))  # a yardstick
    except Unavailable as exc:
        notes = [f"{name} is not available in the GPU worker ({exc}); no vendor baseline"]
        return VendorReport(name=name, library=vendor.library, available=False,
                            notes=notes + confinement_notes(), gpu_seconds=time.perf_counter() - started)
    except RuntimeError as exc:  # a worker that could not start or answered an error: informative only
        log.warning("the %s baseline failed", name, exc_info=True)
        return VendorReport(name=name, library=vendor.library, available=False, notes=[
            f"{name} baseline failed: {exc}"[:2000]], gpu_seconds=time.perf_counter() - started)
    notes = [] if timing.passed else [
        f"{name} failed the protocol, so it is not reported: "
        + "; ".join(f"{r.code.value} [{r.case}]: {r.detail}" for r in timing.reasons[:3])]
    return VendorReport(name=name, library=vendor.library, available=True, timing=timing, notes=notes,
                        gpu_seconds=time.perf_counter() - started)


def vendor_summary(report: VendorReport | None, baseline_medians_ms: dict[str, float]) -> dict | None:
    """summary.json's "vendor": per case the vendor's latency, throughput, roofline fraction and
    how fast the baseline is beside it (vendor median / baseline median: below 1, slower)."""
    if report is None:
        return None
    cases = {}
    for timing in (report.timing.cases if report.timing else []):
        if not (timing.passed and timing.stats):
            continue
        s = timing.stats
        baseline = baseline_medians_ms.get(timing.case)
        cases[timing.case] = {
            "median_ms": s.median_ms, "ci_low_ms": s.ci_low_ms, "ci_high_ms": s.ci_high_ms, "cv": s.cv,
            "achieved_gbps": timing.achieved_gbps, "achieved_tflops": timing.achieved_tflops,
            "roofline_fraction": timing.roofline_fraction,
            "baseline_speedup_vs_vendor": s.median_ms / baseline if baseline else None}
    score = geometric_mean([c["median_ms"] for c in cases.values()]) if cases else None
    return {"name": report.name, "library": report.library, "available": report.available,
            "score_ms": score, "cases": cases, "notes": report.notes}


def describe_view(summary_vendor: dict | None) -> dict | None:
    """describe_task's `vendor`: {"name": "cuBLAS", "cases": {case: median_ms}}, or None without numbers."""
    if not summary_vendor or not summary_vendor.get("cases"):
        return None
    return {"name": summary_vendor["name"],
            "cases": {name: row["median_ms"] for name, row in summary_vendor["cases"].items()}}


def confinement_notes(granted: Iterable[str] | None = None, site_dirs: Iterable[str] | None = None) -> list[str]:
    """Why a confined worker may not load cuBLAS: the wheel is absent, or installed where the
    worker's Landlock rules grant no read access (sandbox/confine.py grants the Python prefix and
    sys.path, which is where pip puts it)."""
    if granted is None:
        granted = python_paths() + cuda_paths()
    granted = [os.path.realpath(g) for g in granted]
    found = cublas_wheel_libraries(site_dirs)
    if not found:
        return ["no nvidia-cublas wheel in site-packages (pip install nvidia-cublas; a system cuBLAS on the "
                "loader's path is used where there is one)"]
    hidden = [path for path in found if not any(_beneath(path, g) for g in granted)]
    return [f"{path} is outside every folder a confined GPU worker may read" for path in hidden]


def cublas_wheel_libraries(site_dirs: Iterable[str] | None = None) -> list[str]:
    """libcublas files of the nvidia-cublas wheels, as real paths."""
    dirs = site.getsitepackages() if site_dirs is None else site_dirs
    found = []
    for folder in dirs:
        for relative in WHEEL_LIBRARY_FILES:
            path = Path(folder) / relative
            if path.exists() and os.path.realpath(path) not in found:
                found.append(os.path.realpath(path))
    return found


def _beneath(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")
