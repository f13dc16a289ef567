"""Sending a job to a GPU worker and reading its answer: what the candidate did wrong becomes a Reason,
what the infrastructure did wrong stays an exception."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from harness import jobs
from harness.call_limits import OutOfTime
from harness.results import Reason, ReasonCode
from harness.settings import CompiledKernel, Unavailable
from harness.task_model import Case
from harness.worker_side import buffers
from sandbox.answers import Status
from sandbox.deadline import Deadline
from sandbox.pool import JobTimeout, Worker, WorkerCrashed

# Answer statuses that are the candidate's failure, with the reason each one is.
_FAILURES = {Status.FAULT: ReasonCode.CUDA_FAULT, Status.LAUNCH_ERROR: ReasonCode.LAUNCH_ERROR,
             Status.OUT_OF_MEMORY: ReasonCode.OUT_OF_MEMORY, Status.TOO_SLOW: ReasonCode.TOO_SLOW}
# Failures after which a check or a timing runs no further case: the worker was lost or stopped (or the
# device is full), and the next case would only spend the call's time the same way; or the kernel may not run
# at all (device_heap), which every case would say again.
STOPS_A_SEQUENCE = frozenset({ReasonCode.CUDA_FAULT, ReasonCode.TIMEOUT, ReasonCode.WORKER_CRASHED,
                              ReasonCode.OUT_OF_MEMORY, ReasonCode.TOO_SLOW, ReasonCode.DEVICE_HEAP})


def call_worker(worker: Worker, build: Callable[[frozenset[str]], tuple[dict, list]], deadline_s: float,
                max_bytes: int, case: str, within: Deadline | None = None):
    """(answer, blobs, None) or (None, None, the candidate's failure as a Reason).
    `build(resident)` makes the job, leaving out the inputs the worker says it holds; if it no
    longer holds one, the job goes again with all of them. `within`: the tool call's deadline, which
    the job inherits; once it has passed, OutOfTime (a job it cut short had its worker killed)."""
    within = within or Deadline.never()
    if within.expired:
        raise OutOfTime(f"the call's {within.seconds:g} s ran out before the job on case {case} could start")
    header, blobs = build(worker.resident_inputs)
    try:
        answer, answer_blobs = worker.call(header, blobs, deadline_s, max_bytes + (1 << 20), within)
        if answer.get("status") == Status.RESIDENT_MISSING:
            worker.resident_inputs = frozenset()
            header, blobs = build(worker.resident_inputs)
            answer, answer_blobs = worker.call(header, blobs, deadline_s, max_bytes + (1 << 20), within)
    except JobTimeout:
        worker.resident_inputs = frozenset()
        if within.expired:
            raise OutOfTime(f"the call's {within.seconds:g} s ran out during the job on case {case}; "
                            "the worker was killed") from None
        return None, None, Reason(code=ReasonCode.TIMEOUT, case=case,
                                  detail=f"still running after {deadline_s:g} s; the worker was killed")
    except WorkerCrashed as exc:
        worker.resident_inputs = frozenset()
        return None, None, Reason(code=ReasonCode.WORKER_CRASHED, case=case, detail=str(exc))
    worker.resident_inputs = frozenset(answer.get("resident_inputs") or ())
    return read_answer(answer, answer_blobs, case)


def read_answer(answer: dict, answer_blobs: list, case: str):
    status = answer.get("status")
    if status == Status.OK:
        return answer, answer_blobs, None
    detail = f"{answer.get('error')}: {answer.get('detail')}"
    if status in _FAILURES:
        return None, None, Reason(code=_FAILURES[status], case=case, detail=detail)
    if status == Status.UNAVAILABLE:
        raise Unavailable(detail)
    if status == Status.EXPECTED_MISSING:
        raise ExpectedMissing(detail)
    raise RuntimeError(f"worker error on case {case}: {detail}")


class ExpectedMissing(Exception):
    """The reference's worker no longer keeps the expected outputs a judging job names (harness/device_checks.py)."""


class Refused(Exception):
    """The job cannot be made for this case (its launch geometry does not hold there)."""

    def __init__(self, reason: Reason):
        super().__init__(reason.detail)
        self.reason = reason


@dataclass
class RunResult:
    layout: jobs.Layout
    runs: list[dict[str, np.ndarray]] | None = None
    integrity: jobs.Integrity | None = None
    failure: Reason | None = None
    answer: dict | None = None  # the worker's answer, where the outputs stayed on the device
    digests: list | None = None  # each output's OutputDigest, where it was judged on the device


def run_ahead(produce: Callable) -> Iterator:
    """The items `produce(put, stopped)` puts, yielded as they come while it runs on in a thread, at
    most one item ahead. If the consumer stops early, the producer is told (`stopped()`), drained and
    joined before this returns: nothing it started is left running. Its exception is raised here."""
    items: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def run() -> None:
        try:
            produce(lambda item: _put_unless(items, stop, item), stop.is_set)
            items.put(_End(None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            items.put(_End(exc))

    thread = threading.Thread(target=run, name="check-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item = items.get()
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():
            try:
                items.get(timeout=0.1)
            except queue.Empty:
                pass
        thread.join()


@dataclass(frozen=True)
class _End:
    """The producer is done, or failed with `error`."""

    error: BaseException | None


def _put_unless(items: queue.Queue, stop: threading.Event, item) -> None:
    while not stop.is_set():
        try:
            items.put(item, timeout=0.1)
            return
        except queue.Full:
            continue


# A launch's kernels run between its two events: their span can exceed the events' only by the two
# clocks' resolution. Beyond this, the kernel clock has lost track of the launches.
CLOCK_SLACK_MS, CLOCK_SLACK_REL = 0.002, 0.01


def clocked_samples(answer: dict, iterations: int) -> tuple[str, list[float], list[float] | None]:
    """(clock, the samples on it, the event samples where the clock is "kernel")."""
    events = [float(x) for x in answer.get("samples_ms") or []]
    if len(events) != iterations:
        raise jobs.AnswerError("timing answer has the wrong number of samples")
    kernel = answer.get("kernel_samples_ms")
    if kernel is None:
        return "events", events, None
    kernel = [float(x) for x in kernel]
    if len(kernel) != iterations:
        raise jobs.AnswerError("timing answer has the wrong number of kernel-clock samples")
    late = [i for i, (k, e) in enumerate(zip(kernel, events)) if not 0 < k <= e * (1 + CLOCK_SLACK_REL) + CLOCK_SLACK_MS]
    if late:
        i = late[0]
        raise jobs.AnswerError(f"the kernel clock disagrees with the events on {len(late)} launches "
                               f"(first: launch {i}, {kernel[i]:.4f} ms against {events[i]:.4f} ms)")
    return "kernel", kernel, events


def launch_geometry(kernel: CompiledKernel, case: Case):
    """The launch for this case, or the candidate's failure: its expressions may not hold on a case
    it was never checked against (a holdout shape)."""
    try:
        return kernel.launch.resolve(case), None
    except ValueError as exc:
        return None, Reason(code=ReasonCode.LAUNCH_ERROR, case=case.name,
                            detail=f"the launch geometry is invalid for this case: {exc}")


def guard_bytes_of(layout: jobs.Layout, sets: int) -> int:
    return 2 * buffers.GUARD_BYTES * len(layout.arrays) * sets

