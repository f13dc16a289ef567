"""The kernel-only clock: CUPTI's activity records, the clock the profilers read.

A pair of CUDA events around a launch also measures the launch: the front end's latency between
the start event and the kernel's first block, about 2 us on an H200 (an empty kernel reads 3.5 us).
CUPTI records each kernel's own start and end on the GPU, as the profilers' timelines show them.
Its records also give the GPU's busy time: the union of every kernel, copy and memset interval.

Kernels are traced as CUPTI_ACTIVITY_KIND_KERNEL, not CONCURRENT_KERNEL. For the concurrent kind
CUPTI instruments each kernel's code to take its timestamps, and that code runs in every block: on
an H200 it made a layernorm of 32768 short blocks 7% slower (115 us against 107 us, by the events
too), where the serial kind leaves the kernel's code alone and only keeps kernels from overlapping
across streams, which a worker's one stream never does (docs/timing.md, "The clock").

libcupti (the nvidia-cuda-cupti wheel) has no Python bindings: it is loaded with ctypes from the
file cuda.pathfinder finds, inside a GPU worker only, after its confinement. Where it is missing or
refuses, the worker times by events alone and says why (`KernelClock.failure`).

Which launch a kernel belongs to is told by an external correlation id, pushed before the launch and
popped after it: CUPTI then writes, for each driver or runtime call made in between, a record that
ties the call's correlation id to ours, and a kernel's record carries the correlation id of the call
that launched it. A launch made of several kernels (a library call) spans from its first kernel's
start to its last one's end.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass

from cuda import pathfinder

# CUpti_ActivityKind values (cupti_activity.h)
KIND_MEMCPY, KIND_MEMSET, KIND_KERNEL, KIND_DRIVER, KIND_RUNTIME = 1, 2, 3, 4, 5
KIND_CONCURRENT_KERNEL, KIND_EXTERNAL_CORRELATION = 10, 39
# API records (driver, runtime) must be on for external correlation records to be written.
OTHER_KINDS = (KIND_MEMCPY, KIND_MEMSET, KIND_DRIVER, KIND_RUNTIME, KIND_EXTERNAL_CORRELATION)
KERNEL_KINDS = {"serial": KIND_KERNEL, "concurrent": KIND_CONCURRENT_KERNEL}
GPU_KINDS = (KIND_KERNEL, KIND_CONCURRENT_KERNEL, KIND_MEMCPY, KIND_MEMSET)
EXTERNAL_KIND_CUSTOM0 = 3
FLUSH_FORCED = 1
CUPTI_SUCCESS = 0
BUFFER_BYTES = 8 << 20
# Every record of these kinds starts with its kind (uint32), then 12 bytes of kind-specific fields,
# then its start and end in ns (uint64 each); a kernel's correlation id is at byte 92. These offsets
# are the same in every version of the kernel, memcpy and memset records since CUDA 11. An external
# correlation record holds our id at byte 8 (uint64) and the call's correlation id at byte 16.
_START, _END, _KERNEL_CORRELATION = 16, 24, 92
# A kernel record's grid and block (six int32 from byte 52) and its name (a char pointer at byte 104),
# the same in CUpti_ActivityKernel4 to 10 (cupti_activity.h of CUDA 13.0).
_GRID, _NAME = 52, 104
_EXTERNAL_ID, _EXTERNAL_CORRELATION = 8, 16

_BufferRequested = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.POINTER(ctypes.c_uint8)),
                                    ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t))
_BufferCompleted = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint8),
                                    ctypes.c_size_t, ctypes.c_size_t)


@dataclass(frozen=True)
class Activity:
    kind: int
    start_ns: int
    end_ns: int
    correlation: int  # a kernel's or an external correlation's; 0 for copies and memsets
    external: int = 0  # an external correlation's id (ours)
    name: str = ""     # a kernel's function name
    grid: tuple[int, int, int] = (0, 0, 0)
    block: tuple[int, int, int] = (0, 0, 0)

    @property
    def is_kernel(self) -> bool:
        return self.kind in (KIND_KERNEL, KIND_CONCURRENT_KERNEL)


def launch_spans_ms(activities: list[Activity], tags: list[int]) -> list[float] | None:
    """Each tagged launch's kernels, first start to last end, in ms. None if a launch has no kernel or
    a record's timestamps are not ordered: the clock cannot be trusted for that job."""
    owner = {a.correlation: a.external for a in activities if a.kind == KIND_EXTERNAL_CORRELATION}
    kernels: dict[int, list[Activity]] = {}
    for a in activities:
        if a.is_kernel and a.correlation in owner:
            kernels.setdefault(owner[a.correlation], []).append(a)
    spans = []
    for tag in tags:
        inside = kernels.get(tag)
        if not inside or any(a.end_ns < a.start_ns for a in inside):
            return None
        spans.append((max(a.end_ns for a in inside) - min(a.start_ns for a in inside)) * 1e-6)
    return spans


def launch_records(activities: list[Activity], tags: list[int]) -> list[list[list]]:
    """Each tagged launch's kernels as [name, grid, block]: what the GPU ran for it, to be compared with
    what was declared."""
    owner = {a.correlation: a.external for a in activities if a.kind == KIND_EXTERNAL_CORRELATION}
    kernels: dict[int, list[list]] = {}
    for a in activities:
        if a.is_kernel and a.correlation in owner:
            kernels.setdefault(owner[a.correlation], []).append([a.name, list(a.grid), list(a.block)])
    return [kernels.get(tag, []) for tag in tags]


def busy_ms(activities: list[Activity]) -> float:
    """The GPU's busy time: the union of every activity's interval, in ms."""
    total, reach = 0, None
    for a in sorted((a for a in activities if a.kind in GPU_KINDS), key=lambda a: a.start_ns):
        if a.end_ns <= a.start_ns:
            continue
        if reach is None or a.start_ns > reach:
            total += a.end_ns - a.start_ns
            reach = a.end_ns
        elif a.end_ns > reach:
            total += a.end_ns - reach
            reach = a.end_ns
    return total * 1e-6


class KernelClock:
    """CUPTI activity tracing for this process: kernels, copies and memsets, read per job."""

    def __init__(self, library_path: str | None = None, tracing: str = "serial"):
        """`tracing`: "serial" (the referee's: the kernels' code untouched) or "concurrent" (CUPTI
        instruments every kernel; the bench compares the two)."""
        if tracing not in KERNEL_KINDS:
            raise ValueError(f"tracing must be one of {sorted(KERNEL_KINDS)}, not {tracing!r}")
        self.tracing = tracing
        self.failure: str | None = None
        self.version: int | None = None
        self._lock = threading.Lock()
        self._buffers: dict[int, ctypes.Array] = {}
        self._activities: list[Activity] = []
        self._popped = ctypes.c_uint64()
        try:
            self.lib = ctypes.CDLL(library_path or _library_path())
            self._bind()
            version = ctypes.c_uint32()
            self._check(self.lib.cuptiGetVersion(ctypes.byref(version)), "cuptiGetVersion")
            self.version = version.value
            # Kept on the instance: CUPTI calls them for as long as the process lives.
            self._requested, self._completed = _BufferRequested(self._on_request), _BufferCompleted(self._on_complete)
            self._check(self.lib.cuptiActivityRegisterCallbacks(self._requested, self._completed),
                        "cuptiActivityRegisterCallbacks")
            for kind in (KERNEL_KINDS[tracing], *OTHER_KINDS):
                self._check(self.lib.cuptiActivityEnable(kind), f"cuptiActivityEnable({kind})")
        except Exception as exc:  # noqa: BLE001 - missing library, old driver, refused: events alone, said why
            self.failure = f"{type(exc).__name__}: {exc}"

    @property
    def available(self) -> bool:
        return self.failure is None

    def tag(self, value: int) -> None:
        """What this thread launches from now until untag() belongs to `value` (> 0)."""
        self._check(self.lib.cuptiActivityPushExternalCorrelationId(EXTERNAL_KIND_CUSTOM0, value),
                    "cuptiActivityPushExternalCorrelationId")

    def untag(self) -> None:
        self._check(self.lib.cuptiActivityPopExternalCorrelationId(EXTERNAL_KIND_CUSTOM0, ctypes.byref(self._popped)),
                    "cuptiActivityPopExternalCorrelationId")

    def collect(self) -> list[Activity]:
        """Every record since the last collect, once the work is done (synchronize first)."""
        self._check(self.lib.cuptiActivityFlushAll(FLUSH_FORCED), "cuptiActivityFlushAll")
        with self._lock:
            activities, self._activities = self._activities, []
        return activities

    # -- CUPTI's side --------------------------------------------------------------------------
    def _bind(self) -> None:
        lib = self.lib
        lib.cuptiGetResultString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        lib.cuptiActivityGetNextRecord.argtypes = [ctypes.POINTER(ctypes.c_uint8), ctypes.c_size_t,
                                                   ctypes.POINTER(ctypes.c_void_p)]
        lib.cuptiActivityFlushAll.argtypes = [ctypes.c_uint32]
        lib.cuptiActivityEnable.argtypes = [ctypes.c_int]
        lib.cuptiActivityPushExternalCorrelationId.argtypes = [ctypes.c_int, ctypes.c_uint64]
        lib.cuptiActivityPopExternalCorrelationId.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)]

    def _check(self, status: int, call: str) -> None:
        if status != CUPTI_SUCCESS:
            text = ctypes.c_char_p()
            self.lib.cuptiGetResultString(status, ctypes.byref(text))
            raise RuntimeError(f"{call} failed: {(text.value or b'').decode(errors='replace') or status}")

    def _on_request(self, buffer, size, max_records) -> None:
        memory = (ctypes.c_uint8 * BUFFER_BYTES)()
        address = ctypes.addressof(memory)
        with self._lock:
            self._buffers[address] = memory
        buffer[0] = ctypes.cast(memory, ctypes.POINTER(ctypes.c_uint8))
        size[0] = BUFFER_BYTES
        max_records[0] = 0

    def _on_complete(self, context, stream, buffer, size, valid) -> None:
        address = ctypes.addressof(buffer.contents)
        found = []
        record = ctypes.c_void_p()
        while self.lib.cuptiActivityGetNextRecord(buffer, valid, ctypes.byref(record)) == CUPTI_SUCCESS:
            base = record.value
            kind = ctypes.c_uint32.from_address(base).value
            if kind == KIND_EXTERNAL_CORRELATION:
                found.append(Activity(kind, 0, 0, ctypes.c_uint32.from_address(base + _EXTERNAL_CORRELATION).value,
                                      ctypes.c_uint64.from_address(base + _EXTERNAL_ID).value))
            elif kind in GPU_KINDS:
                start, end = (ctypes.c_uint64.from_address(base + at).value for at in (_START, _END))
                if kind in (KIND_KERNEL, KIND_CONCURRENT_KERNEL):
                    found.append(_kernel_activity(kind, base, start, end))
                else:
                    found.append(Activity(kind, start, end, 0))
        with self._lock:
            self._activities += found
            self._buffers.pop(address, None)


def _kernel_activity(kind: int, base: int, start: int, end: int) -> Activity:
    shape = [ctypes.c_int32.from_address(base + _GRID + 4 * i).value for i in range(6)]
    name = ctypes.c_char_p.from_address(base + _NAME).value or b""
    return Activity(kind, start, end, ctypes.c_uint32.from_address(base + _KERNEL_CORRELATION).value,
                    name=name.decode(errors="replace"), grid=tuple(shape[:3]), block=tuple(shape[3:]))


def _library_path() -> str:
    path = pathfinder.load_nvidia_dynamic_lib("cupti").abs_path
    if not path:
        raise OSError("cuda.pathfinder loaded CUPTI but cannot say from where")
    return os.path.realpath(path)
