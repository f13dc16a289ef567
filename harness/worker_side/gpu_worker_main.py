"""The GPU worker: one process, one CUDA context, jobs read from a dedicated pipe.

Started by sandbox/pool.py as
`python -m harness.worker_side.gpu_worker_main JOBS_FD ANSWERS_FD DEVICE [--confine=JSON] [--shm=JOBS_MEMFD,ANSWERS_MEMFD,BYTES]`:
with --shm, large blobs travel through the two shared regions (sandbox/wire.py), and 'ready' says so.
Its stdout is not the protocol (device printf writes there). It answers every job, and exits after a
sticky CUDA error so the parent starts a clean one.

With --confine (a sandbox.confine.Confinement as JSON) the worker confines itself before anything
else: numpy and the CUDA driver start threads, and Landlock only restricts the thread that applies
it, so harness.worker_side.execute and harness.worker_side.gpu are imported only afterwards.
"""

from __future__ import annotations

import os
import sys
import traceback

from sandbox import wire
from harness.worker_side.cuda_check import CudaError
from sandbox import confine

MAX_JOB_BYTES = 1 << 36
EXIT_STICKY = 3
EXIT_STARTUP = 4


def _start(ordinal: int):
    from harness.worker_side import execute, gpu
    from harness.worker_side.nvrtc import arch_for, compile_kernel
    from harness.worker_side.kernel_clock import KernelClock

    clock = KernelClock()  # enabled before the context exists, so that it sees all of it
    context = gpu.Context(ordinal)
    arch = arch_for(*context.info.compute_capability)
    compiled = compile_kernel(execute.UTILITY_SOURCE, "referee_empty", arch=arch)
    if not compiled.ok:
        raise RuntimeError(f"the referee's own kernels did not compile: {compiled.log}")
    return context, execute.Utilities(context, compiled.cubin, clock)


def _answer(context, utilities, header: dict, blobs: list[bytes]):
    from harness.worker_side import execute, timed_loop

    op = header.get("op")
    if op == "run":
        return execute.run(context, header, blobs, utilities)
    if op == "time":
        return timed_loop.time(context, utilities, header, blobs)
    if op == "draw_run":
        return execute.draw_run(context, header, blobs, utilities)
    if op in ("vendor_time", "peaks"):  # cuBLAS and the device peaks (harness/worker_side/cublas.py)
        from harness.worker_side import cublas as vendor

        return vendor.answer(context, utilities, header, blobs)
    return {"status": "error", "error": "UNKNOWN_OP", "detail": f"unknown op {op!r}"}, []


def _cuda_error_answer(exc: CudaError) -> dict:
    """Sticky errors end the worker; running out of device memory is nobody's verdict and says how much was left."""
    from harness.worker_side import gpu

    if gpu.is_sticky(exc):
        return {"status": "fault", "error": exc.name, "detail": str(exc)}
    if gpu.is_out_of_memory(exc):
        return {"status": "out_of_memory", "error": exc.name, "detail": f"{exc} ({gpu.memory_note()})"}
    return {"status": "launch_error", "error": exc.name, "detail": str(exc)}


def _context_healthy() -> bool:
    from cuda.bindings import driver

    return driver.cuCtxSynchronize()[0] == driver.CUresult.CUDA_SUCCESS


def serve(jobs, answers, ordinal: int, confined: dict, regions=(None, None)) -> int:
    try:
        context, utilities = _start(ordinal)
    except Exception as exc:  # noqa: BLE001 - any startup failure is reported, then we exit
        name = exc.name if isinstance(exc, CudaError) else type(exc).__name__
        wire.send(answers, {"status": "startup_error", "error": name, "detail": str(exc)})
        return EXIT_STARTUP
    from harness.worker_side import execute  # already loaded by _start, after the confinement
    from harness.worker_side.nvrtc import arch_for

    arch = arch_for(*context.info.compute_capability)
    wire.send(answers, {"status": "ready", "device": context.info.as_dict(), "arch": arch,
                        "event_overhead_ms": utilities.event_overhead_ms, "pid": os.getpid(),
                        "kernel_clock": {"available": utilities.clock is not None, "note": utilities.clock_note,
                                         "cupti_version": utilities.clock.version if utilities.clock else None,
                                         "tracing": utilities.clock.tracing if utilities.clock else None,
                                         "empty_kernel_ms": utilities.kernel_floor_ms},
                        "pci_bus_id": context.pci_bus_id(), "shared_regions": regions[0] is not None, **confined})
    while True:
        try:
            header, blobs = wire.receive(jobs, MAX_JOB_BYTES, regions[0])
        except wire.PeerClosed:
            return 0
        if header.get("op") == "exit":
            return 0
        try:
            answer, out = _answer(context, utilities, header, blobs)
        except execute.JobFailed as failed:
            answer, out = {"status": failed.status, "error": failed.error, "detail": failed.detail}, []
        except execute.ResidentMissing as missing:
            answer, out = {"status": "resident_missing", "error": "RESIDENT_MISSING",
                           "detail": f"input {missing} is no longer held; send it"}, []
        except CudaError as exc:
            answer, out = _cuda_error_answer(exc), []
        except Exception as exc:  # noqa: BLE001 - a worker bug is reported to the parent, not hidden
            answer, out = {"status": "error", "error": type(exc).__name__,
                           "detail": traceback.format_exc(limit=5)}, []
        if answer["status"] != "ok" and answer["status"] != "fault" and not _context_healthy():
            answer["status"] = "fault"
        if answer["status"] != "ok":
            utilities.resident.clear()  # after a failed job, nothing kept is vouched for
        wire.send(answers, answer, out, regions[1])
        del blobs, out  # views into the jobs region end with the job
        if answer["status"] == "fault":
            return EXIT_STICKY


def confine_from_argv(argv: list[str]) -> dict:
    """Apply the --confine=JSON spec if one is given; the facts for the 'ready' message.

    Raises ConfinementError (or ValueError for a malformed spec) when it cannot be applied.
    """
    specs = [a.split("=", 1)[1] for a in argv if a.startswith("--confine=")]
    if not specs:
        return {"confined": False, "confinement_notes": []}
    notes = confine.apply(confine.Confinement.from_json(specs[-1]))
    return {"confined": True, "confinement_notes": notes}


def regions_from_argv(argv: list[str]) -> tuple:
    """The (jobs, answers) shared regions that --shm names, or (None, None)."""
    specs = [a.split("=", 1)[1] for a in argv if a.startswith("--shm=")]
    if not specs:
        return None, None
    jobs_fd, answers_fd, size = (int(x) for x in specs[-1].split(","))
    return wire.Region(jobs_fd, size), wire.Region(answers_fd, size)


def main(argv: list[str]) -> int:
    positional = [a for a in argv[1:] if not a.startswith("--")]
    jobs_fd, answers_fd, ordinal = int(positional[0]), int(positional[1]), int(positional[2])
    with os.fdopen(jobs_fd, "rb") as jobs, os.fdopen(answers_fd, "wb") as answers:
        try:
            confined = confine_from_argv(argv)
        except (confine.ConfinementError, ValueError, TypeError, OSError) as exc:
            wire.send(answers, {"status": "startup_error", "error": "ConfinementError",
                                "detail": f"the worker could not be confined: {exc}"})
            return EXIT_STARTUP
        return serve(jobs, answers, ordinal, confined, regions_from_argv(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
