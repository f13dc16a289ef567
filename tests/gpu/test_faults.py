"""Faults on the GPU side of a real run: a worker killed mid-attempt, device memory exhausted by
another process, a case too large for the device. Each leaves the run folder verifiable, the
attempt counted exactly once, and the next attempt working."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.settings import TimingSettings
from harness.task import load_task
from server.attempt import record_attempt
from server.verify import verify_run
from server.executor import GpuExecutor
from server.lifecycle import new_run
from server.run import Run, RunSettings, TaskDoesNotFit
from tests.test_cli import MATMUL
from tests.test_footprint import huge_saxpy

pytestmark = pytest.mark.gpu
KERNELS = Path(__file__).with_name("kernels")
TIMING = "timing side by side"

# Holds (nearly) all free device memory until its stdin closes; prints the bytes left free.
HOG = r"""
import sys
from cuda.bindings import driver as d
d.cuInit(0)
ctx = d.cuDevicePrimaryCtxRetain(d.cuDeviceGet(0)[1])[1]
d.cuCtxSetCurrent(ctx)
held, chunk = [], 1 << 34
while chunk >= 1 << 16:
    err, ptr = d.cuMemAlloc(chunk)
    if err == d.CUresult.CUDA_SUCCESS:
        held.append(ptr)
    else:
        chunk //= 2
print(d.cuMemGetInfo()[1], flush=True)
sys.stdin.read()
"""


@pytest.fixture
def run(tmp_path):
    timing = TimingSettings(warmups=3, iterations=30, run_deadline_s=10)
    executor = GpuExecutor(load_task(MATMUL), timing, compile_deadline_s=15)
    run = new_run(MATMUL, tmp_path, RunSettings(max_attempts=20, timing=timing), executor)
    yield run
    executor.close()
    run.close()


def attempt(run: Run, source: str, progress=None):
    candidate = run.candidate(None, source, None, None)
    return record_attempt(run, candidate, "fault test", None, progress)


def wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def attempt_recorded(run: Run, number: int) -> dict:
    (entry,) = [e for e in run.history if e.attempt == number]
    return entry


def assert_next_attempt_works(run: Run) -> None:
    answer = attempt(run, MATMUL.joinpath("initial.cu").read_text())
    assert answer.verdict.startswith("valid"), answer.reasons
    assert verify_run(run.dir).ok


def test_a_gpu_worker_killed_mid_attempt_rejects_it_once_and_the_next_attempt_works(run):
    used = run.attempts_used
    timing_started = threading.Event()
    outcome: dict = {}

    def progress(done, total, message):
        if message.startswith(TIMING):
            timing_started.set()

    def record():
        try:
            outcome["answer"] = attempt(run, (KERNELS / "slow_tiled.cu").read_text(), progress)
        except Exception as exc:  # noqa: BLE001 - an error is an outcome the test inspects
            outcome["error"] = exc

    thread = threading.Thread(target=record)
    thread.start()
    assert timing_started.wait(120), "the attempt never reached its timing"
    worker = run.executor.pool.candidate
    # The timing job is sent once the case's input sets are made; each of its 33 launches lasts >= 50 ms.
    assert wait_for(lambda: worker.in_flight, 60), "the timing job was never sent"
    pid = worker.pid
    threading.Event().wait(0.5)  # well inside the slow kernel's timing job
    assert worker.in_flight
    os.kill(pid, signal.SIGKILL)
    thread.join(120)
    assert not thread.is_alive()

    assert run.attempts_used == used + 1
    entry = attempt_recorded(run, used + 1)
    assert entry.verdict == "rejected"
    assert {r.code for r in entry.reasons} == {"worker_crashed"}, entry.reasons
    assert "error" not in outcome, outcome.get("error")
    assert outcome["answer"].verdict == "rejected"
    assert run.executor.pool.candidate.pid != pid or not run.executor.pool.candidate.alive
    assert verify_run(run.dir).ok
    assert_next_attempt_works(run)
    assert run.attempts_used == used + 2


def test_device_memory_taken_by_another_process_rejects_the_attempt_once_then_it_works_again(run):
    used = run.attempts_used
    # A new candidate worker holds no inputs from earlier jobs: none it could give back to make room,
    # so its first allocation meets the hog.
    run.executor.fresh_worker()
    run.executor.pool.candidate.ensure_started()
    hog = subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        left = int(hog.stdout.readline())
        # The driver keeps a few MiB it will not hand out (4 MiB on an H200); what is left must be
        # less than one array of the attempt's 2048 x 2048 cases (16 MiB), which then cannot run.
        assert left < 16 << 20, f"the hog left {left} bytes free"
        try:
            answer = attempt(run, (KERNELS / "tiled32.cu").read_text())
            reasons = [r.model_dump(mode="json") for r in answer.reasons]
        except Exception:  # noqa: BLE001 - the reference's own job may be the one that ran out
            reasons = attempt_recorded(run, used + 1)["reasons"]
    finally:
        hog.stdin.close()
        hog.wait(60)
    assert run.attempts_used == used + 1
    entry = attempt_recorded(run, used + 1)
    assert entry.verdict == "rejected"
    assert any("CUDA_ERROR_OUT_OF_MEMORY" in r["detail"] for r in reasons), reasons
    assert verify_run(run.dir).ok
    assert run.executor.pool.candidate.alive  # out of memory is not sticky: the worker goes on
    assert_next_attempt_works(run)


def test_a_case_too_large_for_the_device_is_refused_before_a_run_starts(tmp_path):
    folder = huge_saxpy(tmp_path, 2**31 - 1)  # 8 GiB per array: one set (x, y, out) fits, timing's do not
    task = load_task(folder)
    # 6 sets of 24 GiB and 3 output snapshots of 8 GiB (a case past 2 GiB audits fewer launches per job): 168 GiB,
    # more than an H200 offers too
    timing = TimingSettings(checked_fraction=0.1, rotation_sets=6)
    executor = GpuExecutor(task, timing, compile_deadline_s=15)
    try:
        with pytest.raises(TaskDoesNotFit,
                           match=r"case large needs 168\.0 GiB of device memory \(6 input sets and 3 output snapshots"):
            new_run(folder, tmp_path / "results", RunSettings(timing=timing), executor)
    finally:
        executor.close()
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())
