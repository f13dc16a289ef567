"""The evidence context: a second CUDA context on the worker's device that holds what proves a timed launch
right, out of the candidate's sight.

No kernel of the candidate is given an address in this context, and its allocations are not beside the candidate's
buffers: a kernel that probes for them faults where nothing is mapped (a sticky error: the job fails). It is sight,
not reach: the contexts of one process share its unified address space, so a kernel handed one of these addresses
can write it (measured on an H100, driver 580; docs/security.md). The timed loop
(harness/worker_side/timed_loop.py) keeps there, per timed launch, the count of output elements left unwritten
and of drawn input elements changed, and the snapshots of the audited launches' outputs. Each launch's counts
are made by the referee's kernels in a small scratch of the candidate's context, right after the launch, then
moved here with cuMemcpyPeerAsync on the same stream, with the audited outputs: in stream order, before the
candidate's next launch runs. A later launch that found them could still write them: so each launch's record is
sealed with a keyed MAC before the next launch (harness/worker_side/evidence_mac.py), and a repair is detected. The
snapshots are what device judging exports to the reference's worker (harness/worker_side/device_judging.py); the
only kernel that runs in this context is the referee's MAC, which checks the snapshots against their seals.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
from cuda.bindings import driver

from harness.worker_side import evidence_mac, gpu
from harness.worker_side.cuda_check import check

# The evidence context runs only the MAC kernel (no printf, no heap, little stack): the least printf FIFO and heap
# the driver takes, so that it costs the device little beyond its own bookkeeping.
_SMALL_LIMITS = {"CU_LIMIT_PRINTF_FIFO_SIZE": 4096, "CU_LIMIT_MALLOC_HEAP_SIZE": 4096, "CU_LIMIT_STACK_SIZE": 1024}


class EvidenceContext:
    """The second context, made once per worker by its first timing (of_worker), destroyed with the worker."""

    def __init__(self, context: gpu.Context, cubin: bytes | None = None):
        self.candidate, self.cubin, self.mac_module, self.mac_kernel = context.context, cubin, None, None
        self.sm_count = context.info.sm_count
        # cuCtxCreate makes the new context current: popped at once, the candidate's stays the thread's own.
        self.handle = check(driver.cuCtxCreate(None, 0, context.device), "cuCtxCreate")
        try:
            for name, value in _SMALL_LIMITS.items():
                driver.cuCtxSetLimit(getattr(driver.CUlimit, name), value)  # best effort: smaller is only cheaper
        finally:
            check(driver.cuCtxPopCurrent(), "cuCtxPopCurrent")

    @contextmanager
    def current(self):
        """The evidence context made current for the calls within (allocations, frees, exports, reads)."""
        check(driver.cuCtxPushCurrent(self.handle), "cuCtxPushCurrent")
        try:
            yield
        finally:
            check(driver.cuCtxPopCurrent(), "cuCtxPopCurrent")

    def allocate(self, nbytes: int) -> EvidenceAllocation:
        return EvidenceAllocation(self, nbytes)

    def take(self, destination: int, source: int, nbytes: int, stream) -> None:
        """Queue on the candidate's `stream` a copy of its bytes at `source` into this context at `destination`."""
        if nbytes:
            check(driver.cuMemcpyPeerAsync(destination, self.handle, source, self.candidate, nbytes, stream),
                  "cuMemcpyPeerAsync")

    def download(self, ptr: int, nbytes: int) -> np.ndarray:
        with self.current():
            return gpu.download(ptr, nbytes)

    def download_into(self, ptr: int, host: np.ndarray) -> None:
        with self.current():
            gpu.download_into(ptr, host)

    def macs(self, groups: list[list[tuple[int, int, int, int]]]) -> list[int]:
        """Per group, the sum of the MACs of its (address, bytes, key, k2) parts, computed in this context by the
        referee's MAC kernel (its module loaded here on first use): the snapshots never cross the host."""
        if self.cubin is None:
            raise RuntimeError("no MAC kernel for the evidence context")
        with self.current():
            if self.mac_kernel is None:
                self.mac_module = gpu.Module(self.cubin)
                self.mac_kernel = self.mac_module.function("referee_mac")
            sums = gpu.Allocation(8 * len(groups))
            try:
                check(driver.cuMemsetD8(sums.ptr, 0, sums.nbytes), "cuMemsetD8")
                for g, group in enumerate(groups):
                    for ptr, nbytes, key, k2 in group:
                        evidence_mac.launch_mac(self.mac_kernel, ptr, nbytes, key, k2, sums.ptr + 8 * g,
                                                driver.CUstream(0), self.sm_count)
                check(driver.cuCtxSynchronize(), "cuCtxSynchronize")
                return [int(v) for v in gpu.download(sums.ptr, sums.nbytes).view(np.uint64)]
            finally:
                sums.free()

    def destroy(self) -> None:
        if self.handle is not None:
            driver.cuCtxDestroy(self.handle)
            self.handle = None


class EvidenceAllocation(gpu.Allocation):
    """Device memory of the evidence context."""

    def __init__(self, evidence: EvidenceContext, nbytes: int):
        self.evidence = evidence
        with evidence.current():
            super().__init__(nbytes)

    def free(self) -> None:
        """Best effort, as gpu.Allocation's: after a sticky error the free fails harmlessly."""
        if self.ptr and self.evidence.handle is not None:
            pushed = driver.cuCtxPushCurrent(self.evidence.handle)[0] == driver.CUresult.CUDA_SUCCESS
            driver.cuMemFree(self.ptr)
            if pushed:
                driver.cuCtxPopCurrent()
        self.ptr = 0


def of_worker(utilities) -> EvidenceContext:
    """The worker's evidence context, made on first use (a reference's worker that never times has none)."""
    if utilities.evidence is None:
        utilities.evidence = EvidenceContext(utilities.context, utilities.cubin)
    return utilities.evidence
