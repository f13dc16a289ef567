"""The worker pool's life cycle with a stand-in worker: deadlines, kills, crashes, restarts."""

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.device import gpu_absent_reason
from harness.gpu_workers import GPU_WORKER_COMMAND
from sandbox.pool import JobTimeout, Worker, WorkerCrashed, WorkerError

FAKE = (sys.executable, str(Path(__file__).with_name("fake_worker.py")))


@pytest.fixture
def worker():
    with Worker("test", command=FAKE, startup_timeout_s=30) as w:
        yield w


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); read its state
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_round_trip_returns_blobs(worker):
    answer, blobs = worker.call({"op": "run", "behaviour": "echo"}, [b"one", b"two" * 1000], 10, 1 << 20)
    assert answer["status"] == "ok"
    assert blobs == [b"two" * 1000, b"one"]
    assert worker.starts == 1


def test_a_job_is_in_flight_from_its_sending_until_its_answer_or_the_workers_death(worker):
    assert not worker.in_flight
    worker.call({"op": "run", "behaviour": "echo"}, [], 10, 1 << 20)
    assert not worker.in_flight
    seen = []
    watcher = threading.Thread(target=lambda: (time.sleep(0.3), seen.append(worker.in_flight), worker.interrupt()))
    watcher.start()
    with pytest.raises(WorkerCrashed):
        worker.call({"op": "run", "behaviour": "hang"}, [], 10, 1 << 20)
    watcher.join()
    assert seen == [True]
    assert not worker.in_flight


def test_hang_is_killed_at_the_deadline_and_the_next_job_gets_a_fresh_worker(worker):
    first = worker.call({"op": "run", "behaviour": "echo"}, [], 10, 1 << 20)[0]["pid"]
    started = time.monotonic()
    with pytest.raises(JobTimeout):
        worker.call({"op": "run", "behaviour": "hang"}, [], 0.5, 1 << 20)
    assert time.monotonic() - started < 5
    assert not _alive(first)
    second = worker.call({"op": "run", "behaviour": "echo"}, [], 10, 1 << 20)[0]["pid"]
    assert second != first
    assert worker.starts == 2


def test_the_whole_process_group_dies_at_the_deadline(worker):
    with pytest.raises(JobTimeout):
        # the fake answers once (with its child's pid) then hangs; the second read times out
        answer, _ = worker.call({"op": "run", "behaviour": "spawn-and-hang"}, [], 10, 1 << 20)
        child = answer["child"]
        worker._receive(time.monotonic() + 0.3, 1 << 20)
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_a_crash_is_reported_with_how_the_worker_died(worker):
    with pytest.raises(WorkerCrashed, match="exit code 9"):
        worker.call({"op": "run", "behaviour": "crash"}, [], 10, 1 << 20)
    assert worker.call({"op": "run", "behaviour": "echo"}, [], 10, 1 << 20)[0]["status"] == "ok"


def test_a_fault_answer_retires_the_worker(worker):
    answer, _ = worker.call({"op": "run", "behaviour": "fault"}, [], 10, 1 << 20)
    assert answer["status"] == "fault"
    assert not worker.alive
    worker.call({"op": "run", "behaviour": "echo"}, [], 10, 1 << 20)
    assert worker.starts == 2


def test_an_oversized_answer_is_refused(worker):
    with pytest.raises(WorkerError, match="exceeds the limit"):
        worker.call({"op": "run", "behaviour": "echo"}, [b"x" * 5000], 10, 1000)
    assert not worker.alive


def test_a_start_failure_names_the_cause():
    w = Worker("test", command=FAKE + ("--fail-start",), startup_timeout_s=30)
    with pytest.raises(WorkerError, match="CUDA_ERROR_NO_DEVICE"):
        w.start()


def test_secrets_do_not_reach_the_worker(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-secret")
    monkeypatch.setenv("KERNEL_REFEREE_TOKEN", "secret")
    with Worker("test", command=FAKE, startup_timeout_s=30) as w:
        env = w.ensure_started()["env"]
    assert "ANTHROPIC_API_KEY" not in env and "KERNEL_REFEREE_TOKEN" not in env
    assert "HOME" in env


@pytest.mark.skipif(gpu_absent_reason() is None, reason="this machine has a GPU")
def test_the_real_worker_without_a_gpu_says_why():
    with pytest.raises(WorkerError, match="could not start"):
        Worker("candidate", command=GPU_WORKER_COMMAND, startup_timeout_s=60).start()


def test_large_blobs_travel_through_the_shared_regions_both_ways(worker):
    big = os.urandom(3 << 20)
    answer, blobs = worker.call({"op": "run", "behaviour": "echo"}, [b"small", big], 10, 1 << 30)
    assert worker.hello["shared_regions"] is True
    assert answer["in_region"] is True  # the worker read the big blob in place, from the jobs region
    assert blobs == [big, b"small"]
    assert all(isinstance(b, bytes) for b in blobs)  # copied out of the answers region


def test_a_worker_that_ignores_the_regions_gets_everything_by_pipe():
    with Worker("test", command=FAKE + ("--pipe-only",), startup_timeout_s=30) as w:
        big = os.urandom(3 << 20)
        answer, blobs = w.call({"op": "run", "behaviour": "echo"}, [big], 10, 1 << 30)
        assert w.hello["shared_regions"] is False
        assert answer["in_region"] is False
        assert blobs == [big]


def test_an_answer_pointing_outside_its_region_is_malformed_and_the_worker_replaced(worker):
    with pytest.raises(WorkerError, match="region"):
        worker.call({"op": "run", "behaviour": "bad-region"}, [], 10, 1 << 50)
    assert not worker.alive
    answer, _ = worker.call({"op": "run", "behaviour": "echo"}, [], 10, 1 << 20)
    assert answer["status"] == "ok" and worker.starts == 2
