"""The GPU worker: one process, one CUDA context, jobs read from a dedicated pipe.

Started by sandbox/pool.py as `python -m sandbox.worker JOBS_FD ANSWERS_FD DEVICE`. Its stdout is
not the protocol (device printf writes there). It answers every job, and exits after a sticky CUDA
error so the parent starts a clean one.
"""

from __future__ import annotations

import os
import sys
import traceback

from harness import execute, gpu, wire
from harness.compile import arch_for, compile_kernel
from harness.cuda_check import CudaError

MAX_JOB_BYTES = 1 << 36
EXIT_STICKY = 3
EXIT_STARTUP = 4


def _start(ordinal: int) -> tuple[gpu.Context, execute.Utilities]:
    context = gpu.Context(ordinal)
    arch = arch_for(*context.info.compute_capability)
    compiled = compile_kernel(execute.UTILITY_SOURCE, "referee_empty", arch=arch)
    if not compiled.ok:
        raise RuntimeError(f"the referee's own kernels did not compile: {compiled.log}")
    return context, execute.Utilities(context, compiled.cubin)


def _answer(context: gpu.Context, utilities: execute.Utilities, header: dict, blobs: list[bytes]):
    op = header.get("op")
    if op == "run":
        return execute.run(context, header, blobs)
    if op == "time":
        return execute.time(context, utilities, header, blobs)
    return {"status": "error", "error": "UNKNOWN_OP", "detail": f"unknown op {op!r}"}, []


def _context_healthy() -> bool:
    from cuda.bindings import driver

    return driver.cuCtxSynchronize()[0] == driver.CUresult.CUDA_SUCCESS


def serve(jobs, answers, ordinal: int) -> int:
    try:
        context, utilities = _start(ordinal)
    except Exception as exc:  # noqa: BLE001 - any startup failure is reported, then we exit
        name = exc.name if isinstance(exc, CudaError) else type(exc).__name__
        wire.send(answers, {"status": "startup_error", "error": name, "detail": str(exc)})
        return EXIT_STARTUP
    arch = arch_for(*context.info.compute_capability)
    wire.send(answers, {"status": "ready", "device": context.info.as_dict(), "arch": arch,
                        "event_overhead_ms": utilities.event_overhead_ms, "pid": os.getpid()})
    while True:
        try:
            header, blobs = wire.receive(jobs, MAX_JOB_BYTES)
        except wire.PeerClosed:
            return 0
        if header.get("op") == "exit":
            return 0
        try:
            answer, out = _answer(context, utilities, header, blobs)
        except execute.JobFailed as failed:
            answer, out = {"status": failed.status, "error": failed.error, "detail": failed.detail}, []
        except CudaError as exc:
            status = "fault" if gpu.is_sticky(exc) else "launch_error"
            answer, out = {"status": status, "error": exc.name, "detail": str(exc)}, []
        except Exception as exc:  # noqa: BLE001 - a worker bug is reported to the parent, not hidden
            answer, out = {"status": "error", "error": type(exc).__name__,
                           "detail": traceback.format_exc(limit=5)}, []
        if answer["status"] != "ok" and answer["status"] != "fault" and not _context_healthy():
            answer["status"] = "fault"
        wire.send(answers, answer, out)
        if answer["status"] == "fault":
            return EXIT_STICKY


def main(argv: list[str]) -> int:
    jobs_fd, answers_fd, ordinal = int(argv[1]), int(argv[2]), int(argv[3])
    with os.fdopen(jobs_fd, "rb") as jobs, os.fdopen(answers_fd, "wb") as answers:
        return serve(jobs, answers, ordinal)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
