"""Job deadlines scale with a case's bytes and flops and the device's peaks, from the settings' floors; the
shipped tasks keep the floors."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.job_deadlines import (DEADLINE_MARGIN, HOST_BYTES_PER_S, ROOFLINE_SLACK, case_work, run_deadline_s,
                                   time_deadline_s)
from harness.settings import TimingSettings
from harness.task import load_task
from tests.test_footprint import H200, huge_saxpy

CASES = Path(__file__).resolve().parents[1] / "cases"
# An H200's facts as its worker reports them: memory clock and bus give about 4.9 TB/s.
H200_FACTS = {**H200, "memory_clock_khz": 3_200_000, "memory_bus_bits": 6144, "sm_count": 132,
              "sm_clock_khz": 1_980_000, "compute_capability": [9, 0]}


@pytest.mark.parametrize("task_dir", sorted(p for p in CASES.iterdir() if (p / "task.toml").exists()),
                         ids=lambda p: p.name)
def test_the_shipped_tasks_keep_the_floors(task_dir):
    task, settings = load_task(task_dir), TimingSettings()
    for case in task.cases:
        work = case_work(task, case, settings, H200_FACTS)
        assert run_deadline_s(work, settings) == settings.run_deadline_s
        assert time_deadline_s(work, settings) == settings.time_deadline_s


def test_a_large_case_gets_what_its_bytes_need(tmp_path):
    task, settings = load_task(huge_saxpy(tmp_path, 2**28)), TimingSettings(device_judging_from_bytes=None)
    case = next(c for c in task.cases if c.name == "large")
    work = case_work(task, case, settings, H200)
    # two 1 GiB inputs sent, the output read back after each of the two runs
    assert work.check_host_bytes == 4 * 2**30
    assert run_deadline_s(work, settings) >= DEADLINE_MARGIN * work.check_host_bytes / HOST_BYTES_PER_S
    assert run_deadline_s(work, settings) > settings.run_deadline_s
    on_device = case_work(task, case, settings, H200, outputs_on_device=True)
    assert on_device.check_host_bytes == 2 * 2**30
    assert run_deadline_s(on_device, settings) < run_deadline_s(work, settings)
    assert time_deadline_s(work, settings) > settings.time_deadline_s


def test_the_roofline_counts_the_devices_peaks(tmp_path):
    """saxpy moves 12 bytes per element: at the H200's 4.9 TB/s, 1 GiB arrays take about 0.67 ms a launch;
    without the device's facts, no launch time is assumed."""
    task, settings = load_task(huge_saxpy(tmp_path, 2**28)), TimingSettings()
    case = next(c for c in task.cases if c.name == "large")
    seconds = case_work(task, case, settings, H200_FACTS).roofline_s
    assert 0.5e-3 < seconds < 0.8e-3
    assert case_work(task, case, settings, None).roofline_s == 0.0
    assert ROOFLINE_SLACK * seconds < settings.run_deadline_s
