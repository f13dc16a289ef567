"""Checks judged on the device reach the host path's verdicts, case for case, and fall back to it where the
device path cannot run. CPU stand-ins (tests/fake_gpu_worker.py) emulate the protocol: held outputs are files
in a shared folder, the judging is the host rule reported as the judging kernels' totals. The rule itself,
kernel against host, is tests/test_judge_kernels.py's."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.referee import Referee
from harness.results import CaseCheck, CheckReport
from harness.settings import CompiledKernel, ReferenceFailed, TimingSettings
from harness.task import load_task
from sandbox.pool import Worker
from server.check import _print_where_judged

MATMUL = Path(__file__).resolve().parents[1] / "cases" / "matmul_f32"
FAKE_GPU = (sys.executable, str(Path(__file__).with_name("fake_gpu_worker.py")))
CUBIN = b"\x7fELF" + bytes(60)
BEHAVIOURS = ["honest", "unwritten", "race", "oob_after", "modify_input"]


class _Pool:
    def __init__(self, reference: Worker, candidate: Worker):
        self.reference, self.candidate = reference, candidate


def _worker(name: str, *flags: str) -> Worker:
    return Worker(name, command=FAKE_GPU + flags, confine=False, startup_timeout_s=30)


@pytest.fixture(scope="module")
def task():
    return load_task(MATMUL)


@pytest.fixture
def workers(tmp_path):
    """start(behaviour, *reference flags, ipc=True) -> a referee's pool; every worker stopped after the test."""
    started = []

    def start(behaviour: str, *reference_flags: str, ipc: bool = True) -> _Pool:
        folder = (f"--ipc-dir={tmp_path}",) if ipc else ()
        pool = _Pool(_worker("reference", *folder, *reference_flags),
                     _worker("candidate", f"--behaviour={behaviour}", *folder))
        started.extend([pool.reference, pool.candidate])
        return pool

    yield start
    for worker in started:
        worker.stop()


def _referee(task, pool, device: bool) -> Referee:
    settings = TimingSettings(run_deadline_s=60.0, device_judging_from_bytes=0 if device else None)
    return Referee(task, pool, CompiledKernel("reference", CUBIN, task.kernel_name, task.launch), settings)


def _check(referee, task, cases=None):
    kernel = CompiledKernel("candidate", CUBIN, "matmul_f32", task.launch)
    return referee.check(kernel, cases or [task.visible_cases[0]])


def _verdict(report) -> list:
    return [c.model_dump_json(exclude={"judged_on"}) for c in report.cases]  # as JSON: a reported NaN equals itself


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_the_device_path_reaches_the_host_paths_verdict(task, workers, behaviour):
    on_host = _check(_referee(task, workers(behaviour), device=False), task)
    device_referee = _referee(task, workers(behaviour), device=True)
    on_device = _check(device_referee, task)
    assert device_referee.device_off is None and device_referee.judged_on_device == 1
    assert _verdict(on_device) == _verdict(on_host)
    assert on_device.passed is (behaviour == "honest")
    assert {c.judged_on for c in on_device.cases} == {"device"} and {c.judged_on for c in on_host.cases} == {"host"}


def test_without_ipc_the_check_falls_back_to_the_host_and_says_why(task, workers):
    referee = _referee(task, workers("unwritten", ipc=False), device=True)
    report = _check(referee, task)
    assert "could not be shared" in referee.device_off and "NOT_SUPPORTED" in referee.device_off
    assert not report.passed and {r.code.value for r in report.reasons} == {"mismatch", "unwritten_output"}
    assert not referee.judges_on_device(task.visible_cases[0])  # said once, then the host's way at once
    assert referee.judged_on_device == 0


def test_expected_outputs_the_worker_no_longer_keeps_are_kept_again(task, workers):
    referee = _referee(task, workers("honest", "--forget-kept"), device=True)
    first, second = _check(referee, task), _check(referee, task)
    assert first.passed and second.passed
    assert referee.device_off is None and referee.judged_on_device == 2


def test_locked_expected_outputs_bind_the_kept_ones(task, workers):
    """Expected outputs the parent holds (a run's locked ones) that are not the bytes the reference's worker
    kept: that case is judged on the host, against the locked bytes."""
    referee = _referee(task, workers("honest"), device=True)
    case = task.visible_cases[0]
    locked = {name: array.copy() for name, array in referee.expected(case, case.seed).items()}
    locked["c"].reshape(-1)[0] += np.float32(1000.0)
    referee.preload(case, case.seed, locked)
    report = _check(referee, task, [case])
    assert not report.passed and {r.code.value for r in report.reasons} == {"mismatch"}
    assert referee.judged_on_device == 0


def test_a_nondeterministic_reference_fails_on_the_device_as_on_the_host(task, workers):
    for device in (False, True):
        pool = _Pool(_worker("reference", "--behaviour=race"), _worker("candidate"))
        try:
            with pytest.raises(ReferenceFailed, match="not deterministic"):
                _check(_referee(task, pool, device=device), task)
        finally:
            pool.reference.stop()
            pool.candidate.stop()


def test_small_outputs_stay_on_the_host_by_default(task):
    referee = Referee(task, _Pool(None, None), CompiledKernel("reference", CUBIN, task.kernel_name, task.launch))
    assert all(not referee.judges_on_device(case) for case in task.cases)


@pytest.mark.parametrize("device", [True, False], ids=["on-the-device", "on-the-host"])
def test_outputs_that_do_not_hash_to_the_locked_trees_are_refused(task, workers, device):
    """A resumed run's locked sha256-trees bind the reference's outputs computed again, whichever path judges."""
    referee = _referee(task, workers("honest"), device=device)
    case = task.visible_cases[0]
    referee.lock_trees(case, case.seed, {"c": "0" * 64})
    with pytest.raises(ReferenceFailed, match="not the ones the run locked"):
        _check(referee, task, [case])


def test_the_trees_of_kept_outputs_are_those_of_the_host_outputs(task, workers):
    referee = _referee(task, workers("honest"), device=True)
    case = task.visible_cases[0]
    trees = referee.expected_trees(case, case.seed)
    assert trees == referee.host_trees(case, case.seed, referee.expected(case, case.seed))
    referee.lock_trees(case, case.seed, trees)
    assert _check(referee, task, [case]).passed
    assert _referee(task, workers("honest"), device=False).expected_trees(case, case.seed) is None


# Audited outputs wrong for their own inputs (stale), launches that leave outputs unwritten (skip): the audited
# launches are a secret draw, so the two timings agree on the reasons, not on which launch a detail names.
TIMING_BEHAVIOURS = ["honest", "stale_timing", "skip_timing"]


def _timing_referee(task, pool, device: bool) -> Referee:
    settings = TimingSettings(warmups=2, iterations=20, run_deadline_s=60.0, min_checked_launches=3,
                              device_judging_from_bytes=0 if device else None, device_audits=device)
    return Referee(task, pool, CompiledKernel("reference", CUBIN, task.kernel_name, task.launch), settings)


def _codes(report) -> list:
    return [sorted(r.code.value for r in case.reasons) for case in report.cases]


@pytest.mark.parametrize("behaviour", TIMING_BEHAVIOURS)
def test_a_timings_audits_judged_on_the_device_give_the_hosts_reasons(task, workers, behaviour):
    case = task.performance_cases[-1]  # the smaller one: the stand-ins multiply on the CPU
    kernel = CompiledKernel("candidate", CUBIN, "matmul_f32", task.launch)
    on_host = _timing_referee(task, workers(behaviour), device=False).time(kernel, [case])
    device = _timing_referee(task, workers(behaviour), device=True)
    on_device = device.time(kernel, [case])
    assert device.device_off is None and device.audits_on_device >= device.settings.checked_launches
    assert on_device.passed == on_host.passed == (behaviour == "honest")
    assert _codes(on_device) == _codes(on_host)
    if behaviour == "stale_timing":
        assert on_device.cases[0].reasons[0].detail.split("(first:")[0] == \
               on_host.cases[0].reasons[0].detail.split("(first:")[0]


def test_a_small_cases_audits_are_judged_on_the_device_and_its_checks_on_the_host(task, workers):
    """The default settings: outputs far below device_judging_from_bytes, audits on the device all the same; each
    timing job's audits judged in one job of the reference's worker."""
    case = task.performance_cases[-1]
    settings = TimingSettings(warmups=2, iterations=20, run_deadline_s=60.0, min_checked_launches=3)
    referee = Referee(task, workers("honest"), CompiledKernel("reference", CUBIN, task.kernel_name, task.launch),
                      settings)
    judge_jobs = _judge_jobs(referee.pool.reference)
    kernel = CompiledKernel("candidate", CUBIN, "matmul_f32", task.launch)
    assert referee.check(kernel, [case]).passed and referee.judged_on_device == 0
    report = referee.time(kernel, [case])
    assert report.passed and referee.device_off is None
    assert referee.audits_on_device == report.cases[0].audited_launches == 3 * report.cases[0].batches
    assert [len(header["launches"]) for header in judge_jobs] == [3] * report.cases[0].batches


def _judge_jobs(worker) -> list[dict]:
    """The headers of every judging job the worker is sent from now on."""
    seen, call = [], worker.call

    def recorded(header, *args, **kwargs):
        if header.get("op") == "judge":
            seen.append(header)
        return call(header, *args, **kwargs)

    worker.call = recorded
    return seen


def test_a_timing_whose_outputs_cannot_be_shared_is_audited_on_the_host(task, workers):
    case = task.performance_cases[-1]
    referee = _timing_referee(task, workers("honest", ipc=False), device=True)
    report = referee.time(CompiledKernel("candidate", CUBIN, "matmul_f32", task.launch), [case])
    assert report.passed and "could not be shared" in referee.device_off and referee.audits_on_device == 0


def test_check_says_which_cases_were_judged_on_the_gpu_and_why_not():
    report = CheckReport(passed=True, cases=[CaseCheck(case="small", role="correctness", passed=True),
                                             CaseCheck(case="large", role="performance", passed=True,
                                                       judged_on="device")])
    out = io.StringIO()
    _print_where_judged(report, None, out)
    assert out.getvalue() == "   judged on the GPU (outputs compared where they lie): large\n"
    out = io.StringIO()
    _print_where_judged(CheckReport(passed=True, cases=report.cases[:1]), "the candidate's outputs could not be "
                        "shared with the judging worker (CUDA_ERROR_NOT_SUPPORTED)", out)
    assert out.getvalue() == ("   judged on the host instead of the GPU: the candidate's outputs could not be shared "
                              "with the judging worker (CUDA_ERROR_NOT_SUPPORTED)\n")
