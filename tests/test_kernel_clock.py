"""The kernel clock's bookkeeping (no GPU): which kernels belong to which launch, the GPU's busy time,
the parent's reading of both clocks, and a run never mixing them."""

import numpy as np
import pytest

from harness import jobs
from harness.worker_calls import clocked_samples
from harness.worker_side.kernel_clock import (KIND_CONCURRENT_KERNEL, KIND_DRIVER, KIND_EXTERNAL_CORRELATION, KIND_MEMCPY,
                                  KIND_MEMSET, Activity, KernelClock, busy_ms, launch_spans_ms)
from harness.results import CaseTiming, TimingReport
from harness.side_by_side import time_side_by_side
from server.executor import _clock_facts


def kernel(correlation, start, end):
    return Activity(KIND_CONCURRENT_KERNEL, start, end, correlation)


def tagged(correlation, tag):
    return Activity(KIND_EXTERNAL_CORRELATION, 0, 0, correlation, tag)


def test_each_launch_spans_its_own_kernels_from_first_start_to_last_end():
    records = [tagged(5, 1), kernel(5, 1_000, 21_000),
               tagged(8, 2), kernel(8, 30_000, 40_000), tagged(9, 2), kernel(9, 41_000, 52_000),
               kernel(7, 22_000, 29_000)]  # the flush between them: launched outside any tag
    assert launch_spans_ms(records, [1, 2]) == pytest.approx([0.020, 0.022])


def test_a_launch_without_a_kernel_or_with_a_backward_record_makes_the_clock_untrustworthy():
    records = [tagged(5, 1), kernel(5, 1_000, 2_000)]
    assert launch_spans_ms(records, [1, 2]) is None
    assert launch_spans_ms([tagged(5, 1), kernel(5, 3_000, 2_000)], [1]) is None
    assert launch_spans_ms(records, []) == []


def test_busy_time_is_the_union_of_gpu_intervals_and_ignores_host_api_records():
    records = [kernel(1, 0, 10_000), Activity(KIND_MEMSET, 5_000, 15_000, 0),  # overlap: 15 us together
               Activity(KIND_MEMCPY, 20_000, 30_000, 0), kernel(2, 22_000, 25_000),  # inside: 10 us
               Activity(KIND_DRIVER, 0, 1_000_000, 0), tagged(1, 1), kernel(3, 40_000, 40_000)]
    assert busy_ms(records) == pytest.approx(0.025)
    assert busy_ms([]) == 0.0


def test_a_clock_that_cannot_load_says_why_and_is_not_used(tmp_path):
    clock = KernelClock(str(tmp_path / "libcupti.so.missing"))
    assert not clock.available
    assert "libcupti.so.missing" in clock.failure


def test_kernels_are_traced_serially_unless_asked_otherwise_and_nothing_else_is_accepted(tmp_path):
    assert KernelClock(str(tmp_path / "libcupti.so.missing")).tracing == "serial"
    assert KernelClock(str(tmp_path / "libcupti.so.missing"), tracing="concurrent").tracing == "concurrent"
    with pytest.raises(ValueError, match="tracing must be one of"):
        KernelClock(str(tmp_path / "libcupti.so.missing"), tracing="sampled")


def answer(events, kernel_samples=None):
    return {"samples_ms": events, "kernel_samples_ms": kernel_samples}


def test_the_parent_reads_the_kernel_clock_where_the_worker_has_it_and_keeps_the_events_beside():
    assert clocked_samples(answer([0.5, 0.6]), 2) == ("events", [0.5, 0.6], None)
    assert clocked_samples(answer([0.5, 0.6], [0.498, 0.597]), 2) == ("kernel", [0.498, 0.597], [0.5, 0.6])


@pytest.mark.parametrize("bad", [
    answer([0.5]),                          # too few samples
    answer([0.5, 0.6], [0.49]),             # too few kernel-clock samples
    answer([0.5, 0.6], [0.49, 0.65]),       # a kernel longer than its own events
    answer([0.5, 0.6], [0.49, 0.0]),        # a kernel that took no time
])
def test_samples_that_do_not_add_up_are_refused(bad):
    with pytest.raises(jobs.AnswerError):
        clocked_samples(bad, 2)


def test_side_by_side_timings_on_two_clocks_are_refused():
    clocks = iter(["kernel", "events"])

    def time(kernel, cases):
        return TimingReport(passed=True, cases=[CaseTiming(case="c", passed=True, samples_ms=[1.0], clock=next(clocks))])

    with pytest.raises(RuntimeError, match="different clocks"):
        time_side_by_side(time, {"candidate": None, "baseline": None}, [type("C", (), {"name": "c"})()], 1)


def test_the_run_records_which_clock_it_reads_and_why():
    kernel = _clock_facts({"available": True, "cupti_version": 130001, "tracing": "serial", "empty_kernel_ms": 0.0012},
                          "kernel")
    assert kernel["clock"] == "kernel" and "130001" in kernel["clock_note"] and kernel["kernel_floor_ms"] == 0.0012
    assert "serial kernel tracing" in kernel["clock_note"]
    # a worker from before the tracing was named traced concurrently: the note says so
    assert "concurrent kernel tracing" in _clock_facts({"available": True, "cupti_version": 130001}, "kernel")["clock_note"]
    missing = _clock_facts({"available": False, "note": "OSError: libcupti.so.13: cannot open"}, "kernel")
    assert missing["clock"] == "events" and "libcupti.so.13" in missing["clock_note"]
    assert _clock_facts({"available": True}, "events") == {"clock": "events", "clock_note": "asked for in the settings",
                                                            "kernel_floor_ms": None}


def test_run_ahead_yields_in_order_at_most_one_ahead_and_stops_its_producer():
    import threading

    from harness.worker_calls import run_ahead

    made, done = [], threading.Event()

    def produce(put, stopped):
        for i in range(100):
            if stopped():
                break
            made.append(i)
            put(i)
        done.set()

    got = []
    for item in run_ahead(produce):
        got.append(item)
        assert len(made) <= len(got) + 2  # one in the queue, one in the producer's hand
        if item == 3:
            break
    assert got == [0, 1, 2, 3]
    assert done.is_set() and len(made) <= 6  # told to stop, and finished before run_ahead returned


def test_run_ahead_raises_the_producers_error_after_what_it_made():
    from harness.worker_calls import run_ahead

    def produce(put, stopped):
        put("first")
        raise ValueError("the reference failed")

    items = []
    with pytest.raises(ValueError, match="the reference failed"):
        for item in run_ahead(produce):
            items.append(item)
    assert items == ["first"]


class _Buffer:
    def __init__(self, nbytes):
        self.nbytes, self.freed = nbytes, False

    def free(self):
        self.freed = True


def test_resident_inputs_are_kept_least_recently_used_first_out_within_their_cap():
    from harness.worker_side.resident import Resident

    store = Resident(cap_bytes=100)
    first, second, third = _Buffer(40), _Buffer(40), _Buffer(40)
    copy = np.zeros(40, dtype=np.uint8)
    store.keep("a:1", first, copy)
    store.keep("b:2", second, copy)
    assert store.keys() == ["a:1", "b:2"]
    taken = store.take("a:1")
    assert taken[0] is first and taken[1] is copy and store.take("a:1") is None  # taken for a job: no longer held
    store.keep("a:1", first, copy)
    store.keep("c:3", third, copy)  # 120 bytes: the oldest, b:2, goes
    assert store.keys() == ["a:1", "c:3"] and second.freed and not first.freed
    store.clear()
    assert store.keys() == [] and first.freed and third.freed


def test_a_job_naming_an_input_the_worker_lost_goes_again_with_every_input():
    from harness.worker_calls import call_worker

    class Worker:
        resident_inputs = frozenset({"a:1"})

        def __init__(self):
            self.jobs = []

        def call(self, header, blobs, deadline_s, max_bytes, within=None):
            self.jobs.append(sorted(self.resident_inputs))
            if len(self.jobs) == 1:
                return {"status": "resident_missing", "error": "RESIDENT_MISSING", "detail": "a:1"}, []
            return {"status": "ok", "resident_inputs": ["a:1", "b:2"]}, [b"x"]

    worker, built = Worker(), []
    answer, blobs, failure = call_worker(worker, lambda resident: built.append(resident) or ({}, []), 1.0, 0, "c")
    assert failure is None and answer["status"] == "ok" and blobs == [b"x"]
    assert built == [frozenset({"a:1"}), frozenset()]  # the second build sends everything
    assert worker.resident_inputs == frozenset({"a:1", "b:2"})


def test_an_allocation_out_of_memory_is_tried_again_once_the_kept_inputs_are_freed():
    from harness.worker_side.cuda_check import CudaError
    from harness.worker_side.resident import Resident

    store, kept, calls = Resident(cap_bytes=100), _Buffer(40), []
    store.keep("a:1", kept, np.zeros(40, dtype=np.uint8))

    def allocate(nbytes):
        calls.append(nbytes)
        if len(calls) == 1:
            raise CudaError("cuMemAlloc", 2, "CUDA_ERROR_OUT_OF_MEMORY")
        return "memory"

    assert store.making_room(allocate, 64) == "memory" and calls == [64, 64] and kept.freed
    with pytest.raises(CudaError):  # nothing left to free: the error is the job's
        store.making_room(lambda n: (_ for _ in ()).throw(CudaError("cuMemAlloc", 2, "CUDA_ERROR_OUT_OF_MEMORY")), 64)


def test_side_by_side_calls_its_hook_once_before_each_kernel_s_first_timing_and_stops_where_it_raises():
    seen: list[str] = []

    def time(kernel, cases):
        seen.append(f"time {kernel}")
        return TimingReport(passed=True, cases=[CaseTiming(case="c", passed=True, samples_ms=[1.0], clock="kernel")])

    case = type("C", (), {"name": "c"})()
    timed = time_side_by_side(time, {"baseline": "b", "candidate": "k"}, [case], 2, lambda label: seen.append(label))
    assert seen == ["baseline", "time b", "candidate", "time k", "time b", "time k"]
    assert timed.samples == {"baseline": {"c": [1.0, 1.0]}, "candidate": {"c": [1.0, 1.0]}}

    def refuse(label):
        if label == "candidate":
            raise LookupError("refused before its first timing")

    seen.clear()
    with pytest.raises(LookupError):
        time_side_by_side(time, {"baseline": "b", "candidate": "k"}, [case], 2, refuse)
    assert seen == ["time b"]  # the candidate never timed
