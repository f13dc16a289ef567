"""A tool call's deadline bounds every job it sends, and a candidate launch far longer than the baseline's
is stopped as too_slow: in the pool (tests/fake_worker.py) and in the referee, whose workers are CPU
stand-ins (tests/fake_gpu_worker.py) that spin in real time on performance-sized cases."""

import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from harness.call_limits import MIN_LAUNCH_LIMIT_S, TOO_SLOW_FACTOR, CallLimits, OutOfTime, call_limits
from harness.referee import Referee
from harness.results import ReasonCode
from harness.settings import CompiledKernel, TimingSettings
from harness.task import load_task
from sandbox.deadline import Deadline
from sandbox.pool import JobTimeout, Worker

REPO = Path(__file__).resolve().parents[1]
FAKE = (sys.executable, str(Path(__file__).with_name("fake_worker.py")))
FAKE_GPU = (sys.executable, str(Path(__file__).with_name("fake_gpu_worker.py")))
HONEST = b"\x7fELF" + bytes(60)  # never loaded: the stand-in emulates the kernel
SMALL_PERFORMANCE_DIMS = {"square-2048": "m = 128, n = 128, k = 128", "rect-2000x1500x1000": "m = 160, n = 120, k = 100"}


def small_matmul(folder: Path) -> Path:
    """cases/matmul_f32 with performance cases small enough for numpy (and still performance-sized for the
    stand-in's spinning kernels: m * n * k of a million or more)."""
    shutil.copytree(REPO / "cases" / "matmul_f32", folder)
    manifest = folder / "task.toml"
    text = manifest.read_text()
    for name, dims in SMALL_PERFORMANCE_DIMS.items():
        text = re.sub(rf'(name = "{name}"\nrole = "performance"\ndims = {{ )[^}}]*( }})', rf"\g<1>{dims}\g<2>", text)
    manifest.write_text(text)
    return folder


def spinning(seconds: float, how: str = "spin") -> bytes:
    """A stand-in CUBIN whose launches take `seconds` each on performance-sized cases."""
    return b"\x7fELF" + f"fake: {how}_s={seconds:g}".encode() + bytes(32)


# -- the deadline and the limits ---------------------------------------------------------------------------
def test_a_deadline_counts_down_from_its_start_and_caps_what_is_asked_of_it():
    deadline = Deadline(0.3)
    assert 0.2 < deadline.remaining() <= 0.3 and not deadline.expired
    assert deadline.cap(10.0) <= 0.3 and deadline.cap(0.1) == 0.1
    time.sleep(0.35)
    assert deadline.expired and deadline.remaining() == 0.0 and deadline.cap(10.0) == 0.0
    assert not Deadline.never().expired and Deadline.never().cap(10.0) == 10.0


def test_the_launch_limit_is_20_times_the_baseline_on_the_case_and_at_least_1_s(tmp_path):
    task = load_task(REPO / "cases" / "matmul_f32")
    limits = call_limits(task, Deadline(55), {"square-2048": 2.153, "rect-2000x1500x1000": 80.0})
    assert (TOO_SLOW_FACTOR, MIN_LAUNCH_LIMIT_S) == (20.0, 1.0)
    assert limits.launch_s["square-2048"] == 1.0  # 43 ms: the floor
    assert limits.launch_s["rect-2000x1500x1000"] == pytest.approx(1.6)  # 20 x 80 ms
    # the cases the baseline is not timed on: its time scaled by their flops, from the longest estimate
    odd = 2 * 31 * 37 * 29
    assert limits.baseline_ms["odd-31x37x29"] == pytest.approx(80.0 * odd / (2 * 2000 * 1500 * 1000))
    assert limits.launch_s["odd-31x37x29"] == 1.0 and limits.launch_s["holdout-97x83x61"] == 1.0
    assert "20 times the baseline's launch (80.000 ms) and at least 1 s" in limits.too_slow_note("rect-2000x1500x1000")
    assert call_limits(task, Deadline(55), {}).launch_s == {}  # no baseline timing yet: no launch limits


# -- the pool ----------------------------------------------------------------------------------------------
def test_a_job_never_waits_past_the_calls_deadline_even_when_its_own_is_longer():
    with Worker("test", command=FAKE, startup_timeout_s=30) as worker:
        worker.call({"op": "run", "behaviour": "echo"}, [], 10, 1 << 20)
        started = time.monotonic()
        with pytest.raises(JobTimeout):
            worker.call({"op": "run", "behaviour": "hang"}, [], 30, 1 << 20, within=Deadline(0.5))
        assert time.monotonic() - started < 3
        assert not worker.alive  # killed, not left running
        with pytest.raises(JobTimeout, match="did not start before the call's deadline"):
            worker.call({"op": "run", "behaviour": "echo"}, [], 30, 1 << 20, within=Deadline(0))


def test_a_worker_that_answers_too_slow_is_killed_at_once():
    with Worker("test", command=FAKE, startup_timeout_s=30) as worker:
        started = time.monotonic()
        answer, _ = worker.call({"op": "run", "behaviour": "too_slow"}, [], 30, 1 << 20)
        assert answer["status"] == "too_slow"
        assert not worker.alive and time.monotonic() - started < 5  # its "kernel" would have run for an hour
        assert worker.call({"op": "run", "behaviour": "echo"}, [], 10, 1 << 20)[0]["status"] == "ok"
        assert worker.starts == 2


# -- the referee -------------------------------------------------------------------------------------------
class _Pool:
    def __init__(self, reference: Worker, candidate: Worker):
        self.reference, self.candidate = reference, candidate


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return load_task(small_matmul(tmp_path_factory.mktemp("task") / "matmul_small"))


@pytest.fixture
def referee(task):
    workers = [Worker(name, command=FAKE_GPU, confine=False, startup_timeout_s=30) for name in ("reference", "candidate")]
    kernel = CompiledKernel("reference", HONEST, task.kernel_name, task.launch)
    try:
        yield Referee(task, _Pool(*workers), kernel, TimingSettings(warmups=2, iterations=20))
    finally:
        for worker in workers:
            worker.stop()


def _kernel(task, cubin: bytes) -> CompiledKernel:
    return CompiledKernel("candidate", cubin, "matmul_f32", task.launch)


def _limits(task, seconds: float, launch_s: float | None = 0.5) -> CallLimits:
    per_case = {c.name: launch_s for c in task.cases} if launch_s is not None else {}
    return CallLimits(Deadline(seconds), per_case, {c.name: 0.01 for c in task.cases})


def test_a_spinning_kernel_is_too_slow_on_its_first_performance_case_and_its_worker_replaced(referee, task):
    visible = list(task.visible_cases)
    with referee.within(_limits(task, 30)):
        started = time.monotonic()
        report = referee.check(_kernel(task, spinning(30)), visible)
        elapsed = time.monotonic() - started
        assert not report.passed and elapsed < 10  # one launch of 0.5 s, not 30
        assert [c.case for c in report.cases] == ["odd-31x37x29", "square-2048"]  # stopped there
        (reason,) = report.reasons
        assert reason.code is ReasonCode.TOO_SLOW and reason.case == "square-2048"
        assert "still running after 0.5 s" in reason.detail and "20 times the baseline's launch" in reason.detail
        assert not referee.pool.candidate.alive  # its kernel no longer holds the GPU
        assert referee.check(_kernel(task, HONEST), visible).passed  # a fresh worker serves the next job
    assert referee.pool.candidate.starts == 2


def test_a_kernel_too_slow_under_timing_is_stopped_there(referee, task):
    with referee.within(_limits(task, 30)):
        timing = referee.time(_kernel(task, spinning(30)), list(task.performance_cases))
    assert not timing.passed
    assert [r.code for r in timing.reasons] == [ReasonCode.TOO_SLOW]
    assert not referee.pool.candidate.alive


def test_the_reference_has_no_launch_limit(referee, task):
    referee.reference = _kernel(task, spinning(0.3))  # slower than the limit below, and the task's own
    with referee.within(_limits(task, 30, launch_s=0.1)):
        assert referee.check(_kernel(task, HONEST), [task.case("square-2048")]).passed


def test_jobs_that_each_fit_cannot_add_up_past_the_calls_deadline(referee, task):
    """Each check job of a stall kernel takes 2 x 0.7 s, well inside the job's own 10 s deadline; the second
    performance case's job is cut at the call's 2.5 s and its worker killed."""
    visible = list(task.visible_cases)
    assert referee.check(_kernel(task, HONEST), visible).passed  # workers started, expected outputs made
    with referee.within(_limits(task, 2.5, launch_s=None)):
        started = time.monotonic()
        with pytest.raises(OutOfTime, match="the call's 2.5 s ran out during the job on case rect-2000x1500x1000"):
            referee.check(_kernel(task, spinning(0.7, "stall")), visible)
        assert time.monotonic() - started < 4
    assert not referee.pool.candidate.alive
    assert referee.limits is None  # the call is over
