"""The shape rule inside the real timing protocol (harness/timing_protocol.py), with the stand-in GPU worker
(tests/fake_gpu_worker.py): a case whose launches fall into two modes is measured again in one more job and
refused as timing_modes only if that job's launches do too; one whose first job alone did is timed on the job
measured again."""

from __future__ import annotations

import pytest

from harness.nvml import GpuState, GpuWatch
from harness.results import ReasonCode
from harness.timing_shape import shape_of
from tests.test_referee_cpu import _time, referee, reference_worker, task  # noqa: F401 - fixtures


@pytest.mark.parametrize("referee", ["two_mode_timing"], indirect=True)
def test_launches_in_two_modes_are_measured_again_and_refused_as_timing_modes(referee, task):
    referee.settings = referee.settings.model_copy(update={"max_iterations": 40})
    timing = _time(referee, task)
    assert not timing.passed and timing.score_ms is None
    assert [t.case for t in timing.cases] == [c.name for c in task.performance_cases]
    for case in timing.cases:
        assert [r.code for r in case.reasons] == [ReasonCode.TIMING_MODES], case.reasons
        assert "55% of them below a gap" in case.reasons[0].detail
        # two jobs of 20 (the interval stays wide, to the cap of 40), then one more: judged alone
        assert case.batches == 3 and case.launches == 20 and shape_of(case.samples_ms).has_modes


@pytest.mark.parametrize("referee", ["modes_once_timing"], indirect=True)
def test_modes_in_the_first_job_only_are_timed_on_the_job_measured_again(referee, task):
    referee.settings = referee.settings.model_copy(update={"max_iterations": 40})
    timing = _time(referee, task)
    assert timing.passed, timing.reasons
    first, *others = timing.cases
    assert first.launches == 20 and first.batches == 1 and not shape_of(first.samples_ms).has_modes
    assert first.stats.median_ms < 0.06  # the honest job's 0.05 ms, none of the padded 0.075 ms launches
    assert any("measured again in one more job" in w for w in first.warnings), first.warnings
    assert all(not any("measured again" in w for w in case.warnings) for case in others)


class BusyGpu:
    """NVML's readings around a timing: other processes (pids 4242 on) on the GPU, more than the referee's own."""

    def read(self):
        return GpuState(sm_clock_mhz=1980, max_sm_clock_mhz=1980, processes=list(range(4242, 4250)))


@pytest.mark.parametrize("referee", ["two_mode_timing"], indirect=True)
def test_a_case_refused_for_its_shape_keeps_nvmls_readings(referee, task):
    """A yardstick refused for its shape alone is taken as measured (shape_waived): the readings go with it, so a
    guard round timed beside another process is still set aside."""
    referee.settings = referee.settings.model_copy(update={"max_iterations": 40})
    referee.nvml = BusyGpu()
    timing = _time(referee, task)
    assert not timing.passed
    for case in timing.cases:
        assert [r.code for r in case.reasons] == [ReasonCode.TIMING_MODES]
        assert case.gpu is not None and 4242 in GpuWatch.model_validate(case.gpu).other_processes, case.gpu
