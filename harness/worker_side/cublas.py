"""The GPU side of the vendor baseline (cuBLAS) and of the device peaks. Runs in a GPU worker only.

cuBLAS is loaded with ctypes from the file cuda.pathfinder finds:
`ctypes.CDLL(cuda.pathfinder.load_nvidia_dynamic_lib("cublas").abs_path)`. In a confined worker
that file must be readable under its Landlock rules: the nvidia-cublas wheel installs it in
site-packages (nvidia/cu13/lib), inside the Python prefix and sys.path that
sandbox/confine.py grants, and a toolkit install lives under /usr/local/cuda* or /usr/lib, also
granted. `_load` confirms it (the file is opened for reading before it is dlopened), and any
failure to load or to create a handle answers "unavailable", which the parent turns into a note.

The arguments of every cublasGemmEx call are computed by the parent (harness/vendor_yardstick.py
`gemm_call`); this side only passes them on, with the job's device pointers, on the worker's
stream, so the call is timed by harness/worker_side/execute.py `time` exactly like a kernel launch.
"""

from __future__ import annotations

import ctypes
import enum
import os

import ml_dtypes
import numpy as np
from cuda import pathfinder

from harness.worker_side import gpu, timed_loop, utility_kernels
from harness.worker_side.job import JobFailed
from harness.worker_side.cublas_api import CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT, CUBLAS_OP_N, CUDA_R_16BF, CUDA_R_32F
from harness.worker_side.cuda_check import CudaError, check
from sandbox.answers import Status


class CublasStatus(enum.IntEnum):
    """cublasStatus_t (cublas_api.h); named so that `check` names the error."""

    CUBLAS_STATUS_SUCCESS = 0
    CUBLAS_STATUS_NOT_INITIALIZED = 1
    CUBLAS_STATUS_ALLOC_FAILED = 3
    CUBLAS_STATUS_INVALID_VALUE = 7
    CUBLAS_STATUS_ARCH_MISMATCH = 8
    CUBLAS_STATUS_MAPPING_ERROR = 11
    CUBLAS_STATUS_EXECUTION_FAILED = 13
    CUBLAS_STATUS_INTERNAL_ERROR = 14
    CUBLAS_STATUS_NOT_SUPPORTED = 15
    CUBLAS_STATUS_LICENSE_ERROR = 16


def _status(value: int):
    try:
        return CublasStatus(value)
    except ValueError:
        return int(value)  # an unknown code is still a failure; `check` calls it "error N"


_P = ctypes.c_void_p
_I = ctypes.c_int
_FLOAT_P = ctypes.POINTER(ctypes.c_float)
_SIGNATURES = {
    "cublasCreate_v2": [ctypes.POINTER(_P)],
    "cublasSetStream_v2": [_P, _P],
    # handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc, compute, algo
    "cublasGemmEx": [_P, _I, _I, _I, _I, _I, _FLOAT_P, _P, _I, _I, _P, _I, _I, _FLOAT_P, _P, _I, _I, _I, _I],
}


class Cublas:
    """One cuBLAS handle on the worker's stream, made once per worker process."""

    def __init__(self, stream):
        self.path = _library_path()
        self.lib = ctypes.CDLL(self.path)
        for name, argtypes in _SIGNATURES.items():
            function = getattr(self.lib, name)
            function.argtypes, function.restype = argtypes, ctypes.c_int
        handle = _P()
        check(_status(self.lib.cublasCreate_v2(ctypes.byref(handle))), "cublasCreate_v2")
        self.handle = handle
        check(_status(self.lib.cublasSetStream_v2(handle, _P(int(stream)))), "cublasSetStream_v2")

    def gemm(self, call: dict, pointers: dict[str, int]) -> None:
        """One cublasGemmEx with the parent's arguments; array parameters named by the call."""
        alpha, beta = ctypes.c_float(call["alpha"]), ctypes.c_float(call["beta"])
        status = self.lib.cublasGemmEx(
            self.handle, call["transa"], call["transb"], call["m"], call["n"], call["k"], ctypes.byref(alpha),
            _P(pointers[call["a_param"]]), call["a_type"], call["lda"],
            _P(pointers[call["b_param"]]), call["b_type"], call["ldb"], ctypes.byref(beta),
            _P(pointers[call["c_param"]]), call["c_type"], call["ldc"], call["compute_type"], call["algo"])
        check(_status(status), "cublasGemmEx")


def _library_path() -> str:
    path = pathfinder.load_nvidia_dynamic_lib("cublas").abs_path
    if not path:
        raise OSError("cuda.pathfinder loaded cuBLAS but cannot say from where")
    with open(path, "rb") as library:  # readable here, under this worker's confinement
        library.read(4)
    return os.path.realpath(path)


_state: dict = {"cublas": None, "failure": None}


def cublas(context: gpu.Context) -> Cublas:
    """The worker's cuBLAS, or JobFailed(Status.UNAVAILABLE) saying why it cannot be had."""
    if _state["cublas"] is None and _state["failure"] is None:
        try:
            _state["cublas"] = Cublas(context.stream)
        except Exception as exc:  # noqa: BLE001 - DynamicLibNotFoundError, OSError, a cuBLAS status: all "unavailable"
            _state["failure"] = f"{type(exc).__name__}: {exc}"
    if _state["failure"] is not None:
        raise JobFailed(Status.UNAVAILABLE, "CUBLAS_UNAVAILABLE", f"cuBLAS could not be loaded: {_state['failure']}")
    return _state["cublas"]


def answer(context: gpu.Context, utilities: utility_kernels.Utilities, header: dict, blobs: list[bytes]):
    if header["op"] == "vendor_time":
        call = header["vendor"]
        if (call.get("library"), call.get("op")) != ("cublas", "gemm"):
            raise JobFailed(Status.LAUNCH_ERROR, "UNKNOWN_VENDOR_CALL", f"no vendor call {call.get('library')!r} "
                                    f"{call.get('op')!r}")
        library = cublas(context)
        return timed_loop.time_job(context, utilities, header, blobs, launcher=lambda pointers: library.gemm(call, pointers))
    return measure_peaks(context, header), []


# -- device peaks ------------------------------------------------------------------------------
def measure_peaks(context: gpu.Context, header: dict) -> dict:
    """Per-run event timings of device-to-device copies and of square cuBLAS GEMMs; the parent
    (harness/peaks.py) turns them into rates. The GEMMs are skipped, with a note, without cuBLAS."""
    copies = [{"bytes": nbytes, "ms": _copy_times_ms(context, nbytes, header["copy_repeats"])}
              for nbytes in header["copy_bytes"]]
    notes, gemm, size = [], {}, header["gemm_size"]
    try:
        library = cublas(context)
    except JobFailed as failed:
        notes.append(f"no compute peaks: {failed.detail}")
    else:
        for key, dtype, cuda_type in (("fp32", np.float32, CUDA_R_32F), ("tensor_bf16", ml_dtypes.bfloat16, CUDA_R_16BF)):
            try:
                gemm[key] = _gemm_times_ms(context, library, dtype, cuda_type, size, header["gemm_repeats"])
            except CudaError as exc:
                if gpu.is_sticky(exc):
                    raise
                notes.append(f"no {key} peak: {exc}")
    return {"status": Status.OK, "copies": copies, "gemm_size": size, "gemm": gemm, "notes": notes}


def _timed_ms(context: gpu.Context, repeats: int, work, warmups: int = 3) -> list[float]:
    """Warm-ups (clocks up, first-call set-up done), then `repeats` runs of `work()`, each between
    its own pair of events; the parent keeps the best."""
    pairs = [gpu.EventPair() for _ in range(repeats)]
    try:
        for _ in range(warmups):
            work()
        for pair in pairs:
            gpu.record(pair.start, context.stream)
            work()
            gpu.record(pair.end, context.stream)
        context.synchronize()
        return [pair.elapsed_ms() for pair in pairs]
    finally:
        for pair in pairs:
            pair.destroy()


def _copy_times_ms(context: gpu.Context, nbytes: int, repeats: int) -> list[float]:
    source, destination = gpu.Allocation(nbytes), None
    try:
        destination = gpu.Allocation(nbytes)
        gpu.fill(source.ptr, 0x5A, nbytes, context.stream)
        return _timed_ms(context, repeats, lambda: gpu.copy(destination.ptr, source.ptr, nbytes, context.stream))
    finally:
        for allocation in (source, destination):
            if allocation is not None:
                allocation.free()


def _gemm_times_ms(context: gpu.Context, library: Cublas, dtype, cuda_type: int, size: int, repeats: int) -> list[float]:
    """C (float32) = A · B, all size x size; inputs drawn at random so the tensor cores do real work."""
    host = np.random.default_rng(0x9EA5).random((size, size), dtype=np.float32)
    host -= 0.5
    host = host.astype(dtype, copy=False)
    allocations = []
    try:
        for nbytes in (host.nbytes, host.nbytes, size * size * 4):
            allocations.append(gpu.Allocation(nbytes))
        a, b, c = allocations
        gpu.upload(a.ptr, host)
        gpu.upload(b.ptr, host)
        call = {"transa": CUBLAS_OP_N, "transb": CUBLAS_OP_N, "m": size, "n": size, "k": size,
                "a_param": "a", "a_type": cuda_type, "lda": size, "b_param": "b", "b_type": cuda_type, "ldb": size,
                "c_param": "c", "c_type": CUDA_R_32F, "ldc": size, "compute_type": CUBLAS_COMPUTE_32F,
                "algo": CUBLAS_GEMM_DEFAULT, "alpha": 1.0, "beta": 0.0}
        pointers = {"a": a.ptr, "b": b.ptr, "c": c.ptr}
        return _timed_ms(context, repeats, lambda: library.gemm(call, pointers))
    finally:
        for allocation in allocations:
            allocation.free()
