"""The Referee's judgements end to end, with CPU stand-ins for the GPU workers.

The reference worker and the candidate worker are real sandbox.pool.Worker processes running
tests/fake_gpu_worker.py, which emulates matmul_f32 with numpy and misbehaves on request. Every
verdict below is reached by the parent from the raw bytes those workers send back.
"""

import re
import sys
from pathlib import Path

import pytest

from harness.referee import Referee
from harness.settings import CompiledKernel, TimingSettings
from harness.task import load_task
from harness.results import ReasonCode
from sandbox.pool import Worker

MATMUL = Path(__file__).resolve().parents[1] / "cases" / "matmul_f32"
FAKE_GPU = (sys.executable, str(Path(__file__).with_name("fake_gpu_worker.py")))
CUBIN = b"\x7fELF" + bytes(60)  # never loaded: the fake worker emulates the kernel


class _Pool:
    def __init__(self, reference: Worker, candidate: Worker):
        self.reference = reference
        self.candidate = candidate


def _worker(name: str, behaviour: str) -> Worker:
    return Worker(name, command=FAKE_GPU + (f"--behaviour={behaviour}",), confine=False, startup_timeout_s=30)


@pytest.fixture(scope="module")
def task():
    return load_task(MATMUL)


@pytest.fixture(scope="module")
def reference_worker():
    worker = _worker("reference", "honest")
    try:
        yield worker
    finally:
        worker.stop()
    assert not worker.alive


@pytest.fixture
def referee(request, task, reference_worker):
    """A referee whose candidate worker behaves as the parameter says; "rotated:NAME" times on the rotated
    fixed input sets instead of fresh inputs."""
    protocol, _, behaviour = request.param.rpartition(":")
    candidate = _worker("candidate", behaviour)
    pool = _Pool(reference_worker, candidate)
    kernel = CompiledKernel("reference", CUBIN, task.kernel_name, task.launch)
    try:
        # The stand-in reference computes 2048^3 products on the CPU: a loaded machine needs more than the 10 s
        # a GPU job gets, and no test here is about that deadline.
        # 3 audits per job, not the default 10: each costs the fake a float64 matmul (tests/test_audit_bound.py
        # checks the default count). These stand-ins share no outputs (no --ipc-dir): the audits travel to the host
        # and are compared there, the path this file tests (tests/test_device_checks.py tests the device's).
        settings = TimingSettings(warmups=2, iterations=20, fresh_inputs=protocol != "rotated", run_deadline_s=60.0,
                                  min_checked_launches=3, device_audits=False)
        yield Referee(task, pool, kernel, settings)
    finally:
        candidate.stop()
    assert not candidate.alive


def _candidate(task) -> CompiledKernel:
    return CompiledKernel("candidate", CUBIN, "matmul_f32", task.launch)


def _codes(report) -> set[ReasonCode]:
    return {r.code for r in report.reasons}


def _check(referee, task):
    return referee.check(_candidate(task), list(task.visible_cases))


def _time(referee, task):
    return referee.time(_candidate(task), list(task.performance_cases))


@pytest.mark.parametrize("referee", ["honest"], indirect=True)
def test_an_honest_kernel_passes_check_and_timing(referee, task):
    report = _check(referee, task)
    assert report.passed and not report.reasons
    assert [c.case for c in report.cases] == [c.name for c in task.visible_cases]
    assert all(c.passed and c.agreement == "identical" and not c.warnings for c in report.cases)
    assert all(o.passed and o.mismatches == 0 for c in report.cases for o in c.outputs)

    timing = _time(referee, task)
    assert timing.passed and not timing.reasons
    assert timing.score_ms is not None and 0.04 < timing.score_ms < 0.06
    assert [t.case for t in timing.cases] == [c.name for c in task.performance_cases]
    for case in timing.cases:
        # batches of 20 until the median is known to +-0.5% (the fake's spread needs a few)
        assert case.launches == 20 * case.batches and len(case.samples_ms) == case.stats.n == case.launches
        assert 1 <= case.batches <= 20 and case.median_rel_halfwidth <= 0.005
        # min_checked_launches audited per batch, each on its own fresh inputs
        assert case.checked_launches == case.audited_launches == 3 * case.batches and case.inputs == "fresh"
        assert case.audit_jobs == [[20, 3]] * case.batches
        assert case.unwritten_launches == 0
        assert case.achieved_gbps is not None and case.achieved_gbps > 0
        assert case.achieved_tflops is not None and case.achieved_tflops > 0
        assert case.host_kept_up is True and not case.warnings
        assert case.event_overhead_ms == pytest.approx(0.002)
    assert referee.pool.candidate.starts == 1 and referee.pool.candidate.hello["confined"] is False


def _answers(worker: Worker) -> list[tuple[dict, list]]:
    """Record every (answer, blobs) the worker gives from now on."""
    seen, call = [], worker.call

    def recorded(*args, **kwargs):
        answer, blobs = call(*args, **kwargs)
        seen.append((answer, blobs))
        return answer, blobs

    worker.call = recorded
    return seen


@pytest.mark.parametrize("referee", ["quiet_timing"], indirect=True)
def test_every_audited_output_of_fresh_inputs_travels_and_is_compared(referee, task):
    answers = _answers(referee.pool.candidate)
    timing = _time(referee, task)
    assert timing.passed
    batches = [c.batches for c in timing.cases]
    assert len(answers) == sum(batches)
    assert all(a["outputs_sent"] == 3 and len(a["output_sha256"]) == 3 for a, _ in answers)
    assert all(len(a["changed_inputs"]) == referee.settings.iterations for a, _ in answers)
    keys = [a for a, _ in answers]
    assert len({tuple(a["output_sha256"]) for a in keys}) == len(keys)  # no two batches drew the same inputs


@pytest.mark.parametrize("referee", ["rotated:quiet_timing"], indirect=True)
def test_outputs_found_right_are_not_sent_again_and_distinct_ones_once(referee, task):
    answers = _answers(referee.pool.candidate)
    first = _time(referee, task)
    again = _time(referee, task)
    assert first.passed and again.passed
    sets = referee.settings.rotation_sets
    # the first timing of each case sends each set's output once (the 3 re-checked and 4 last ones repeat them)
    assert [a["outputs_sent"] for a, _ in answers] == [sets] * len(first.cases) + [0] * len(again.cases)
    assert all(len(a["output_sha256"]) == 3 + sets for a, _ in answers)
    assert [c.checked_launches for c in again.cases] == [c.checked_launches for c in first.cases]
    check = _answers(referee.pool.candidate)
    assert _check(referee, task).passed
    assert all(a["outputs_sent"] == 1 for a, _ in check)  # the two poisoned runs agree: their output travels once


@pytest.mark.parametrize("referee", ["quiet_timing"], indirect=True)
def test_a_quiet_kernel_stops_after_its_first_batch(referee, task):
    for case in _time(referee, task).cases:
        assert case.passed and case.batches == 1 and case.launches == 20
        assert case.median_rel_halfwidth <= 0.005 and not case.warnings


@pytest.mark.parametrize("referee", ["noisy_timing"], indirect=True)
def test_a_noisy_kernel_is_sampled_up_to_the_cap_and_says_it_missed_the_target(referee, task):
    referee.settings = referee.settings.model_copy(update={"max_iterations": 60})
    for case in _time(referee, task).cases:
        assert case.passed and case.batches == 3 and case.launches == 60 == len(case.samples_ms)
        assert case.median_rel_halfwidth > 0.005
        assert any("short of the +-0.50% target" in w for w in case.warnings), case.warnings


@pytest.mark.parametrize("referee, where", [("oob_after", "after the end"), ("oob_before", "before the start")],
                         indirect=["referee"])
def test_a_write_outside_the_output_is_an_out_of_bounds_write(referee, task, where):
    report = _check(referee, task)
    assert not report.passed
    assert len(report.cases) == len(task.visible_cases)
    for case in report.cases:
        assert [r.code for r in case.reasons] == [ReasonCode.OUT_OF_BOUNDS_WRITE]
        detail = case.reasons[0].detail
        assert detail.startswith("c: 1 bytes changed") and where in detail and "nearest 1 bytes away" in detail


@pytest.mark.parametrize("referee", ["modify_input"], indirect=True)
def test_a_changed_input_is_input_modified(referee, task):
    report = _check(referee, task)
    assert not report.passed
    for case in report.cases:
        assert [r.code for r in case.reasons] == [ReasonCode.INPUT_MODIFIED]
        assert case.reasons[0].detail.endswith(": a")


@pytest.mark.parametrize("referee", ["modify_input"], indirect=True)
def test_a_drawn_input_changed_during_a_timed_launch_is_input_modified(referee, task):
    timing = _time(referee, task)
    assert not timing.passed
    for case in timing.cases:
        assert [r.code for r in case.reasons] == [ReasonCode.INPUT_MODIFIED]
        assert case.reasons[0].detail.startswith("inputs changed by the kernel during 1 of 20 timed launches")


@pytest.mark.parametrize("referee", ["unwritten"], indirect=True)
def test_an_unwritten_row_is_unwritten_output_not_a_race(referee, task):
    report = _check(referee, task)
    assert not report.passed
    for case, spec in zip(report.cases, task.visible_cases):
        codes = {r.code for r in case.reasons}
        assert codes == {ReasonCode.UNWRITTEN_OUTPUT, ReasonCode.MISMATCH}
        assert ReasonCode.RACE not in codes and case.agreement == "identical"
        n = spec.dims["n"]
        unwritten = next(r for r in case.reasons if r.code is ReasonCode.UNWRITTEN_OUTPUT).detail
        assert f"{n} of {spec.dims['m'] * n} elements were never written" in unwritten
        # the position is read as numbers: the detail currently writes numpy scalars (np.int64(30))
        first = re.search(r"first at \[(.*?)\]\)", unwritten).group(1)
        assert [int(x) for x in re.findall(r"\d+(?=\)?(?:,|$))", first)] == [spec.dims["m"] - 1, 0]
        mismatch = next(r for r in case.reasons if r.code is ReasonCode.MISMATCH).detail
        assert mismatch.startswith(f"c: {n} of {spec.dims['m'] * n} elements beyond tolerance")


@pytest.mark.parametrize("referee", ["race"], indirect=True)
def test_runs_that_disagree_are_a_race(referee, task):
    report = _check(referee, task)
    assert not report.passed
    for case in report.cases:
        assert [r.code for r in case.reasons] == [ReasonCode.RACE]
        assert case.agreement == "differs"
        assert all(o.passed for o in case.outputs)  # the first run alone is correct


@pytest.mark.parametrize("referee", ["stale_timing"], indirect=True)
def test_audited_outputs_that_repeat_an_earlier_launch_are_caught(referee, task):
    assert _check(referee, task).passed  # single runs are correct
    timing = _time(referee, task)
    assert not timing.passed and timing.score_ms is None
    for case in timing.cases:
        assert [r.code for r in case.reasons] == [ReasonCode.TIMED_OUTPUT_MISMATCH]
        assert case.unwritten_launches == 0
        # the first audited launch's output is its own; the two others repeat it
        assert "2 of 3 audited timed launches gave wrong outputs for their own fresh inputs" in case.reasons[0].detail


@pytest.mark.parametrize("referee", ["rotated:stale_timing"], indirect=True)
def test_timed_outputs_that_repeat_an_earlier_set_are_caught(referee, task):
    assert _check(referee, task).passed  # single runs are correct
    timing = _time(referee, task)
    assert not timing.passed and timing.score_ms is None
    for case in timing.cases:
        assert [r.code for r in case.reasons] == [ReasonCode.TIMED_OUTPUT_MISMATCH]
        assert case.unwritten_launches == 0
        assert "re-checked timed outputs are wrong" in case.reasons[0].detail
        assert "(input set " in case.reasons[0].detail or "last output of input set " in case.reasons[0].detail
        assert "of input set 0" not in case.reasons[0].detail  # set 0's own results are right


@pytest.mark.parametrize("referee", ["skip_timing"], indirect=True)
def test_timed_launches_that_skip_work_are_unwritten_output(referee, task):
    assert _check(referee, task).passed
    timing = _time(referee, task)
    assert not timing.passed
    for case in timing.cases:
        assert [r.code for r in case.reasons] == [ReasonCode.UNWRITTEN_OUTPUT]
        assert case.unwritten_launches == 5  # launches 0, 4, 8, 12, 16 of 20
        assert "5 of 20 timed launches" in case.reasons[0].detail
        assert "first: launch 0, 10 elements" in case.reasons[0].detail


@pytest.mark.parametrize("referee", ["tampered_timing", "rotated:tampered_timing"], indirect=True)
def test_a_worker_s_tampered_evidence_is_evidence_tampered(referee, task):
    timing = _time(referee, task)
    assert not timing.passed
    for case in timing.cases:
        assert [r.code for r in case.reasons] == [ReasonCode.EVIDENCE_TAMPERED]
        assert "first: launch 3: its audited outputs" in case.reasons[0].detail


@pytest.mark.parametrize("referee", ["batched_timing", "rotated:batched_timing"], indirect=True)
def test_launches_that_do_each_others_work_are_uneven_launches(referee, task):
    timing = _time(referee, task)
    assert not timing.passed
    for case in timing.cases:
        assert [r.code for r in case.reasons] == [ReasonCode.UNEVEN_LAUNCHES]
        assert "is 5.75 times the median one" in case.reasons[0].detail


@pytest.mark.parametrize("referee", ["fault"], indirect=True)
def test_a_fault_stops_the_check_and_the_worker_is_replaced(referee, task):
    candidate = referee.pool.candidate
    report = _check(referee, task)
    assert not report.passed
    assert len(report.cases) == 1  # stopped after the first case
    (reason,) = report.cases[0].reasons
    assert reason.code is ReasonCode.CUDA_FAULT and "CUDA_ERROR_ILLEGAL_ADDRESS" in reason.detail
    assert not candidate.alive and candidate.starts == 1

    again = _check(referee, task)
    assert not again.passed and len(again.cases) == 1
    assert again.cases[0].reasons[0].code is ReasonCode.CUDA_FAULT
    assert candidate.starts == 2
    assert referee.pool.reference.starts == 1  # the reference worker is never touched by a fault


@pytest.mark.parametrize("referee", ["out_of_memory"], indirect=True)
def test_device_memory_running_out_is_its_own_reason_and_the_worker_stays(referee, task):
    candidate = referee.pool.candidate
    report = _check(referee, task)
    assert not report.passed and len(report.cases) == 1  # stopped after the first case
    (reason,) = report.cases[0].reasons
    assert reason.code is ReasonCode.OUT_OF_MEMORY and "MiB free" in reason.detail
    timing = _time(referee, task)
    assert not timing.passed and timing.cases[0].reasons[0].code is ReasonCode.OUT_OF_MEMORY
    assert candidate.alive and candidate.starts == 1  # not a sticky error: the same worker goes on


@pytest.mark.parametrize("referee", ["honest"], indirect=True)
def test_a_launch_that_cannot_be_made_for_a_timed_case_is_refused_before_any_job(referee, task):
    from harness.task_model import LaunchSpec

    before = referee.pool.candidate.starts
    launch = LaunchSpec.model_validate({"grid": ["ceil_div(n, 16) - 200", "ceil_div(m, 16)"], "block": [16, 16]})
    timing = referee.time(CompiledKernel("candidate", CUBIN, "matmul_f32", launch), [task.case("rect-2000x1500x1000")])
    assert not timing.passed
    assert [(r.code, r.case) for r in timing.reasons] == [(ReasonCode.LAUNCH_ERROR, "rect-2000x1500x1000")]
    assert "invalid for this case" in timing.reasons[0].detail
    assert referee.pool.candidate.starts == before  # no worker was needed to say so


@pytest.mark.parametrize("referee", ["honest"], indirect=True)
def test_inputs_prepared_ahead_are_used_by_the_check_and_made_once(referee, task, monkeypatch):
    import harness.referee as evaluate

    made = []
    real = evaluate.make_inputs
    monkeypatch.setattr(evaluate, "make_inputs", lambda t, dims, seed: made.append(seed) or real(t, dims, seed))
    cases = list(task.visible_cases)
    referee.prepare(cases, {c.name: 1000 + i for i, c in enumerate(cases)})  # dropped: replaced below
    seeds = {c.name: 2000 + i for i, c in enumerate(cases)}
    referee.prepare(cases, seeds)
    report = referee.check(_candidate(task), cases, seeds)
    assert report.passed
    later = [s for s in made if s >= 2000]
    assert sorted(later) == sorted(seeds.values())  # each secret seed's inputs made once, ahead
    assert referee._preparing == {}
