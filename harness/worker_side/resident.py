"""Memory a GPU worker keeps between jobs: input buffers the parent need not send again, and host
staging for read-backs."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from harness.worker_side import gpu
from harness.worker_side.cuda_check import CudaError

RESIDENT_MAX_BYTES = 8 << 30  # and a tenth of the device's memory at most


class Resident:
    """Input buffers kept on the device from job to job, by "NAME:SHA256" of their bytes: the parent
    need not send inputs the worker holds. A buffer is kept only if its bytes still hash to its key
    after the job, with a host copy of those bytes: the next job's check compares the device's bytes
    with it instead of hashing them again. The least recently used go first beyond `cap_bytes`, and
    all of them after a job that failed (the worker then says it holds none)."""

    def __init__(self, cap_bytes: int):
        self.cap_bytes = cap_bytes
        self._buffers: OrderedDict[str, tuple[gpu.GuardedBuffer, np.ndarray]] = OrderedDict()

    def take(self, key: str) -> tuple[gpu.GuardedBuffer, np.ndarray] | None:
        """(the buffer, the host copy of the bytes that hash to `key`), no longer held here; or None."""
        return self._buffers.pop(key, None)

    def keep(self, key: str, buffer: gpu.GuardedBuffer, host: np.ndarray) -> None:
        self._buffers[key] = (buffer, host)
        while self._buffers and sum(b.nbytes for b, _ in self._buffers.values()) > self.cap_bytes:
            self._buffers.popitem(last=False)[1][0].free()

    def clear(self) -> None:
        while self._buffers:
            self._buffers.popitem()[1][0].free()

    def making_room(self, allocate: Callable, *args):
        """allocate(*args); out of device memory, again once the buffers kept here are freed: the
        referee's own keeping must never be why a job runs out."""
        try:
            return allocate(*args)
        except CudaError as exc:
            if not gpu.is_out_of_memory(exc) or not self._buffers:
                raise
            self.clear()
            return allocate(*args)

    def keys(self) -> list[str]:
        return sorted(self._buffers)


class ResidentMissing(Exception):
    """The job names an input as held by the worker, which no longer holds it."""


class Staging:
    """Host memory reused from job to job for read-backs: fresh memory costs a page fault per 4 KiB."""

    def __init__(self):
        self._buffer = np.empty(0, dtype=np.uint8)

    def take(self, nbytes: int) -> np.ndarray:
        if self._buffer.nbytes < nbytes:
            self._buffer = np.empty(nbytes, dtype=np.uint8)
        return self._buffer[:nbytes]
