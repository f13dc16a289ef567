"""The status of every message a worker sends back (sandbox/wire.py carries it): one name for each
outcome, read and written by both sides through this enum."""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    READY = "ready"  # the worker started; the message says what it is
    STARTUP_ERROR = "startup_error"  # it could not start (confinement, CUDA, NVRTC)
    OK = "ok"
    FAULT = "fault"  # a sticky CUDA error: the worker exits after answering
    LAUNCH_ERROR = "launch_error"  # the candidate could not be launched or ran into an error
    OUT_OF_MEMORY = "out_of_memory"
    TOO_SLOW = "too_slow"  # a launch ran past the job's launch limit: the kernel still runs, the worker ends
    UNAVAILABLE = "unavailable"  # an optional library (cuBLAS) does not load there
    RESIDENT_MISSING = "resident_missing"  # the job names a kept input the worker no longer holds
    EXPECTED_MISSING = "expected_missing"  # the judge job names expected outputs the worker no longer keeps
    REFUSED = "refused"  # the compile worker's policy refused the request
    ERROR = "error"  # a bug or an unknown op, with its traceback


def status_of(answer: dict) -> Status | None:
    """The answer's status, or None for a message that names none the protocol knows."""
    try:
        return Status(answer.get("status"))
    except ValueError:
        return None


def failed(status: Status, error: str, detail: str) -> dict:
    return {"status": status, "error": error, "detail": detail}
