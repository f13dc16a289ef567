"""The thin, checked driver-API layer used inside a GPU worker (never in the parent).

Every call goes through `check`, which names the call and the CUDA error.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from cuda.bindings import driver

from harness.worker_side.cuda_check import CudaError, check
from harness.worker_side.buffers import array_alignment, guarded_bytes

# Errors after which the context is unusable: the worker must exit and be replaced.
STICKY_ERRORS = frozenset({
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_INVALID_PC", "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_ASSERT", "CUDA_ERROR_TRAP", "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_CONTEXT_IS_DESTROYED", "CUDA_ERROR_UNKNOWN", "CUDA_ERROR_LAUNCH_TIMEOUT",
    "CUDA_ERROR_TENSOR_MEMORY_LEAK", "CUDA_ERROR_CONTAINED",
})

PRINTF_FIFO_BYTES = 1 << 20
MALLOC_HEAP_BYTES = 8 << 20

_SCALAR_CTYPES = {
    "int8": ctypes.c_int8, "uint8": ctypes.c_uint8, "int32": ctypes.c_int32, "uint32": ctypes.c_uint32,
    "int64": ctypes.c_int64, "uint16": ctypes.c_uint16, "uint64": ctypes.c_uint64,
    "float32": ctypes.c_float, "float64": ctypes.c_double,
    "float16": ctypes.c_uint16, "bfloat16": ctypes.c_uint16,
}


_HALF_DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


class TooSlow(Exception):
    """A launch ran past the job's launch limit. The kernel still runs (nothing stops a kernel from outside
    but the end of its context): the worker answers "too_slow" and ends without touching the device again."""


def is_sticky(error: CudaError) -> bool:
    return error.name in STICKY_ERRORS


def is_out_of_memory(error: CudaError) -> bool:
    return error.name == "CUDA_ERROR_OUT_OF_MEMORY"


def memory_note() -> str:
    """Free and total device memory, for an out-of-memory report (best effort)."""
    err, free, total = driver.cuMemGetInfo()
    if err != driver.CUresult.CUDA_SUCCESS:
        return "free device memory unknown"
    return f"{free / 2**20:.0f} MiB free of {total / 2**20:.0f} MiB on the device"


@dataclass(frozen=True)
class DeviceInfo:
    ordinal: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    l2_bytes: int
    max_shared_per_block_optin: int
    shared_bytes_per_block: int
    shared_bytes_per_sm: int
    reserved_shared_bytes_per_block: int
    registers_per_block: int
    registers_per_sm: int
    warp_size: int
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    sm_clock_khz: int
    memory_clock_khz: int
    memory_bus_bits: int
    total_memory_bytes: int
    driver_version: int

    def as_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


class Context:
    """The worker's one CUDA context (the device's primary context) and stream."""

    def __init__(self, ordinal: int = 0):
        check(driver.cuInit(0), "cuInit")
        self.device = check(driver.cuDeviceGet(ordinal), "cuDeviceGet")
        self.context = check(driver.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        check(driver.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        # A printf or malloc flood must stay bounded in time and memory.
        check(driver.cuCtxSetLimit(driver.CUlimit.CU_LIMIT_PRINTF_FIFO_SIZE, PRINTF_FIFO_BYTES), "cuCtxSetLimit(printf)")
        check(driver.cuCtxSetLimit(driver.CUlimit.CU_LIMIT_MALLOC_HEAP_SIZE, MALLOC_HEAP_BYTES), "cuCtxSetLimit(heap)")
        # No L2 set-aside for persisting accesses: a candidate's evict-last hints cannot pin lines
        # across the flush (devices without the feature refuse the call, which changes nothing).
        driver.cuCtxSetLimit(driver.CUlimit.CU_LIMIT_PERSISTING_L2_CACHE_SIZE, 0)
        self.stream = check(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        self.info = self._describe(ordinal)
        self.stuck = False  # a launch outran its limit: freeing or unloading anything would wait for it

    def _attribute(self, name: str) -> int:
        attr = getattr(driver.CUdevice_attribute, name)
        return int(check(driver.cuDeviceGetAttribute(attr, self.device), f"cuDeviceGetAttribute({name})"))

    def _describe(self, ordinal: int) -> DeviceInfo:
        raw_name = check(driver.cuDeviceGetName(256, self.device), "cuDeviceGetName")
        a = self._attribute
        return DeviceInfo(
            ordinal=ordinal,
            name=raw_name.split(b"\0", 1)[0].decode(errors="replace"),
            compute_capability=(a("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR"),
                                a("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR")),
            sm_count=a("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"),
            l2_bytes=a("CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE"),
            max_shared_per_block_optin=a("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
            shared_bytes_per_block=a("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK"),
            shared_bytes_per_sm=a("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"),
            reserved_shared_bytes_per_block=a("CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK"),
            registers_per_block=a("CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK"),
            registers_per_sm=a("CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR"),
            warp_size=a("CU_DEVICE_ATTRIBUTE_WARP_SIZE"),
            max_threads_per_block=a("CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK"),
            max_threads_per_sm=a("CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR"),
            max_blocks_per_sm=a("CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR"),
            sm_clock_khz=a("CU_DEVICE_ATTRIBUTE_CLOCK_RATE"),
            memory_clock_khz=a("CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE"),
            memory_bus_bits=a("CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH"),
            total_memory_bytes=int(check(driver.cuDeviceTotalMem(self.device), "cuDeviceTotalMem")),
            driver_version=int(check(driver.cuDriverGetVersion(), "cuDriverGetVersion")),
        )

    def pci_bus_id(self) -> str | None:
        """The device's PCI bus id, by which NVML finds the same device; None where the driver cannot tell."""
        err, raw = driver.cuDeviceGetPCIBusId(64, self.device)
        if err != driver.CUresult.CUDA_SUCCESS:
            return None
        raw = raw if isinstance(raw, bytes) else bytes(raw)
        return raw.split(b"\0", 1)[0].decode(errors="replace") or None

    def uuid(self) -> str | None:
        """The device's UUID as NVML and nvidia-smi write it (GPU-8-4-4-4-12 hex digits): the name every process
        on the host knows the device by (the parent's GPU lease is keyed by it); None where the driver cannot tell."""
        call = getattr(driver, "cuDeviceGetUuid_v2", None) or getattr(driver, "cuDeviceGetUuid", None)
        if call is None:
            return None
        err, raw = call(self.device)
        if err != driver.CUresult.CUDA_SUCCESS:
            return None
        return format_uuid(bytes(raw.bytes))

    def synchronize(self) -> None:
        check(driver.cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    def wait(self, limit_s: float | None, what: str) -> None:
        """The stream's work done. With `limit_s`, polled: still running after it, TooSlow (and the context
        is marked stuck), so that a spinning kernel is stopped before more launches queue up behind it."""
        if limit_s is None:
            self.synchronize()
            return
        self.wait_until(lambda: _query(driver.cuStreamQuery(self.stream)[0], "cuStreamQuery"), limit_s, what)

    def wait_until(self, done, limit_s: float, what: str) -> None:
        """Poll `done()` until it is true; past `limit_s`, the context is stuck and TooSlow is raised."""
        started, pause_s = time.monotonic(), 1e-4
        while not done():
            if time.monotonic() - started > limit_s:
                self.stuck = True
                raise TooSlow(f"{what} was still running after {limit_s:.3g} s")
            time.sleep(pause_s)
            pause_s = min(2 * pause_s, 0.005)


def _query(result, call: str) -> bool:
    """Whether the work a query asks about is done (CUDA_ERROR_NOT_READY: not yet); any error raised."""
    if result == driver.CUresult.CUDA_ERROR_NOT_READY:
        return False
    check((result,), call)
    return True


def format_uuid(raw: bytes) -> str:
    """16 bytes as NVML writes a GPU's UUID: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx."""
    h = bytes(raw[:16]).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class Allocation:
    """Device memory owned by one job; freed with the job."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.ptr = int(check(driver.cuMemAlloc(max(nbytes, 1)), "cuMemAlloc"))

    def free(self) -> None:
        if self.ptr:
            driver.cuMemFree(self.ptr)  # best effort: freeing after a sticky error fails harmlessly
            self.ptr = 0


class GuardedBuffer:
    """An array's device memory between two guard bands holding a canary pattern.

    The guard size is a multiple of 256 so the data pointer keeps the allocator's alignment
    (vector loads in a candidate stay legal); a large array starts on a boundary where cuMemAlloc
    would put it, with its head guard band just before it (harness/jobs.py array_alignment).
    """

    def __init__(self, nbytes: int, guard_bytes: int, head: np.ndarray, tail: np.ndarray):
        self.nbytes = nbytes
        self.guard_bytes = guard_bytes
        align = array_alignment(nbytes)
        self.allocation = Allocation(guarded_bytes(nbytes, guard_bytes))
        self.ptr = _round_up(self.allocation.ptr + guard_bytes, align) if align else self.allocation.ptr + guard_bytes
        self.base = self.ptr - guard_bytes  # the head guard band
        upload(self.base, head)
        upload(self.ptr + nbytes, tail)

    def rearm(self, head: np.ndarray, tail: np.ndarray) -> None:
        """New canaries in both guard bands (a buffer kept from one job for the next)."""
        upload(self.base, head)
        upload(self.ptr + self.nbytes, tail)

    def guards(self) -> tuple[np.ndarray, np.ndarray]:
        return download(self.base, self.guard_bytes), download(self.ptr + self.nbytes, self.guard_bytes)

    def free(self) -> None:
        self.allocation.free()


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def upload(ptr: int, array: np.ndarray) -> None:
    """Host bytes to the device, landed before anything else runs. cuMemcpyHtoD from pageable memory
    returns once the bytes are staged, not when they arrive, and it runs on the legacy stream, which
    the job's non-blocking stream does not wait for: without the synchronize, a kernel could read an
    input still in flight."""
    data = np.ascontiguousarray(array)
    if data.nbytes:
        check(driver.cuMemcpyHtoD(ptr, data.ctypes.data, data.nbytes), "cuMemcpyHtoD")
        check(driver.cuCtxSynchronize(), "cuCtxSynchronize")


def download(ptr: int, nbytes: int) -> np.ndarray:
    host = np.empty(nbytes, dtype=np.uint8)
    if nbytes:
        check(driver.cuMemcpyDtoH(host.ctypes.data, ptr, nbytes), "cuMemcpyDtoH")
    return host


def download_into(ptr: int, host: np.ndarray) -> None:
    """Device bytes into an existing contiguous uint8 array."""
    if host.nbytes:
        check(driver.cuMemcpyDtoH(host.ctypes.data, ptr, host.nbytes), "cuMemcpyDtoH")


def copy(destination: int, source: int, nbytes: int, stream) -> None:
    if nbytes:
        check(driver.cuMemcpyDtoDAsync(destination, source, nbytes, stream), "cuMemcpyDtoDAsync")


def completed(event) -> bool:
    """Whether the work before `event` has finished (without waiting)."""
    return _query(driver.cuEventQuery(event)[0], "cuEventQuery")


def fill(ptr: int, byte: int, nbytes: int, stream) -> None:
    if nbytes:
        check(driver.cuMemsetD8Async(ptr, byte, nbytes, stream), "cuMemsetD8Async")


class Module:
    """A CUBIN loaded for one job, so that `__device__` state cannot outlive the job."""

    def __init__(self, cubin: bytes):
        self._image = bytes(cubin)  # keep the bytes alive while the driver reads them (a view would not do)
        self.handle = check(driver.cuModuleLoadData(self._image), "cuModuleLoadData")

    def function(self, name: str):
        return check(driver.cuModuleGetFunction(self.handle, name.encode()), f"cuModuleGetFunction({name})")

    def global_address(self, name: str) -> tuple[int, int] | None:
        """(device address, bytes) of a module variable, or None where the driver does not find the name."""
        result = driver.cuModuleGetGlobal(self.handle, name.encode())
        return (int(result[1]), int(result[2])) if result[0] == driver.CUresult.CUDA_SUCCESS else None

    def unload(self) -> None:
        if self.handle is not None:
            driver.cuModuleUnload(self.handle)
            self.handle = None


def parameter_sizes(function) -> list[int] | None:
    """The byte size of each kernel parameter, or None where the driver cannot tell."""
    if not hasattr(driver, "cuFuncGetParamInfo"):
        return None
    sizes = []
    for index in range(256):
        result = driver.cuFuncGetParamInfo(function, index)
        if result[0] != driver.CUresult.CUDA_SUCCESS:
            if index == 0 and result[0] == driver.CUresult.CUDA_ERROR_NOT_SUPPORTED:
                return None
            break
        sizes.append(int(result[2]))
    return sizes


def allow_dynamic_shared(function, shared_bytes: int) -> None:
    """Above 48 KiB a kernel must opt in before launch."""
    if shared_bytes > 48 * 1024:
        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(driver.cuFuncSetAttribute(function, attr, shared_bytes), "cuFuncSetAttribute(max dynamic shared)")


def kernel_arguments(values: list[tuple[str, object]]) -> tuple[tuple, tuple]:
    """(values, ctypes) for cuLaunchKernel from ("ptr", address) or (dtype, scalar) pairs."""
    args, types = [], []
    for dtype, value in values:
        if dtype == "ptr":
            args.append(int(value))
            types.append(ctypes.c_void_p)
        elif dtype in ("float16", "bfloat16"):
            args.append(int(np.asarray(value, dtype=_HALF_DTYPES[dtype]).view(np.uint16)))
            types.append(ctypes.c_uint16)
        else:
            args.append(value)
            types.append(_SCALAR_CTYPES[dtype])
    return tuple(args), tuple(types)


def launch(function, grid, block, shared_bytes: int, stream, arguments) -> None:
    check(driver.cuLaunchKernel(function, *grid, *block, shared_bytes, stream, arguments, 0), "cuLaunchKernel")


class EventPair:
    def __init__(self):
        self.start = check(driver.cuEventCreate(0), "cuEventCreate")
        self.end = check(driver.cuEventCreate(0), "cuEventCreate")

    def elapsed_ms(self) -> float:
        return float(check(driver.cuEventElapsedTime(self.start, self.end), "cuEventElapsedTime"))

    def destroy(self) -> None:
        driver.cuEventDestroy(self.start)
        driver.cuEventDestroy(self.end)


def record(event, stream) -> None:
    check(driver.cuEventRecord(event, stream), "cuEventRecord")


def reset_persisting_l2() -> None:
    check(driver.cuCtxResetPersistingL2Cache(), "cuCtxResetPersistingL2Cache")
