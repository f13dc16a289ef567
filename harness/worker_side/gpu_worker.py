"""The GPU worker's serving loop: one CUDA context, jobs read from a pipe, every job answered.

Imported by gpu_worker_main.py only once the process is confined: this module loads CUDA, numpy and
the referee's kernels, which start threads. It exits after a sticky CUDA error so the parent starts a
clean worker.
"""

from __future__ import annotations

import os
import traceback

from cuda.bindings import driver

from harness.worker_side import cublas, device_judging, execute, gpu, timed_loop, utility_kernels
from harness.worker_side.compile_policy import arch_for
from harness.worker_side.cuda_check import CudaError
from harness.worker_side.job import JobFailed
from harness.worker_side.kernel_clock import KernelClock
from harness.worker_side.nvrtc import compile_kernel
from harness.worker_side.resident import ResidentMissing
from sandbox import wire
from sandbox.answers import Status

MAX_JOB_BYTES = 1 << 36
EXIT_STICKY = 3
EXIT_STARTUP = 4
EXIT_TOO_SLOW = 5


def _start(ordinal: int):
    clock = KernelClock()  # enabled before the context exists, so that it sees all of it
    context = gpu.Context(ordinal)
    arch = arch_for(*context.info.compute_capability)
    compiled = compile_kernel(utility_kernels.UTILITY_SOURCE, "referee_empty", arch=arch)
    if not compiled.ok:
        raise RuntimeError(f"the referee's own kernels did not compile: {compiled.log}")
    return context, utility_kernels.Utilities(context, compiled.cubin, clock)


def _answer(context, utilities, header: dict, blobs: list[bytes]):
    op = header.get("op")
    if op != "judge":
        utilities.held.release()  # the last job's outputs, judged by now
    if op == "judge":  # the reference's worker: a candidate's held outputs against the expected ones
        return device_judging.judge_job(context, header, utilities)
    if op == "run":
        return execute.run_job(context, header, blobs, utilities)
    if op == "time":
        return timed_loop.time_job(context, utilities, header, blobs)
    if op == "draw_run":
        return execute.draw_run_job(context, header, blobs, utilities)
    if op in ("vendor_time", "peaks"):  # cuBLAS and the device peaks (harness/worker_side/cublas.py)
        return cublas.answer(context, utilities, header, blobs)
    return {"status": Status.ERROR, "error": "UNKNOWN_OP", "detail": f"unknown op {op!r}"}, []


def _cuda_error_answer(exc: CudaError) -> dict:
    """Sticky errors end the worker; running out of device memory is nobody's verdict and says how much was left."""
    if gpu.is_sticky(exc):
        return {"status": Status.FAULT, "error": exc.name, "detail": str(exc)}
    if gpu.is_out_of_memory(exc):
        return {"status": Status.OUT_OF_MEMORY, "error": exc.name, "detail": f"{exc} ({gpu.memory_note()})"}
    return {"status": Status.LAUNCH_ERROR, "error": exc.name, "detail": str(exc)}


def _context_healthy() -> bool:
    return driver.cuCtxSynchronize()[0] == driver.CUresult.CUDA_SUCCESS


def serve(jobs, answers, ordinal: int, confined: dict, regions=(None, None)) -> int:
    try:
        context, utilities = _start(ordinal)
    except Exception as exc:  # noqa: BLE001 - any startup failure is reported, then we exit
        name = exc.name if isinstance(exc, CudaError) else type(exc).__name__
        wire.send(answers, {"status": Status.STARTUP_ERROR, "error": name, "detail": str(exc)})
        return EXIT_STARTUP
    arch = arch_for(*context.info.compute_capability)
    wire.send(answers, {"status": Status.READY, "device": context.info.as_dict(), "arch": arch,
                        "event_overhead_ms": utilities.event_overhead_ms, "pid": os.getpid(),
                        "kernel_clock": {"available": utilities.clock is not None, "note": utilities.clock_note,
                                         "cupti_version": utilities.clock.version if utilities.clock else None,
                                         "tracing": utilities.clock.tracing if utilities.clock else None,
                                         "empty_kernel_ms": utilities.kernel_floor_ms},
                        "pci_bus_id": context.pci_bus_id(), "gpu_uuid": context.uuid(),
                        "shared_regions": regions[0] is not None, **confined})
    while True:
        try:
            header, blobs = wire.receive(jobs, MAX_JOB_BYTES, regions[0])
        except wire.PeerClosed:
            return 0
        if header.get("op") == "exit":
            return 0
        try:
            answer, out = _answer(context, utilities, header, blobs)
        except gpu.TooSlow as slow:
            # The kernel still runs: no health check, no freeing (each would wait for it). Answer and end;
            # the parent kills the process group at once, which ends the context and the kernel with it.
            wire.send(answers, {"status": Status.TOO_SLOW, "error": "TOO_SLOW", "detail": str(slow)}, [], regions[1])
            return EXIT_TOO_SLOW
        except JobFailed as failed:
            answer, out = {"status": failed.status, "error": failed.error, "detail": failed.detail}, []
        except device_judging.ExpectedMissing as missing:
            answer, out = {"status": Status.EXPECTED_MISSING, "error": "EXPECTED_MISSING",
                           "detail": f"expected outputs {missing} are no longer kept; keep them again"}, []
        except ResidentMissing as missing:
            answer, out = {"status": Status.RESIDENT_MISSING, "error": "RESIDENT_MISSING",
                           "detail": f"input {missing} is no longer held; send it"}, []
        except CudaError as exc:
            answer, out = _cuda_error_answer(exc), []
        except Exception as exc:  # noqa: BLE001 - a worker bug is reported to the parent, not hidden
            answer, out = {"status": Status.ERROR, "error": type(exc).__name__,
                           "detail": traceback.format_exc(limit=5)}, []
        if answer["status"] != Status.OK and answer["status"] != Status.FAULT and not _context_healthy():
            answer["status"] = Status.FAULT
        if answer["status"] != Status.OK:
            utilities.resident.clear()  # after a failed job, nothing kept is vouched for
        try:
            wire.send(answers, answer, out, regions[1])
        except wire.Unsendable as unsendable:  # a worker bug: said, not a dead worker (nothing was written)
            answer = {"status": Status.ERROR, "error": "Unsendable", "detail": str(unsendable)}
            utilities.resident.clear()
            wire.send(answers, answer, [], regions[1])
        del blobs, out  # views into the jobs region end with the job
        if answer["status"] == Status.FAULT:
            return EXIT_STICKY
