"""bench/large_case.py's task takes the large-case path and fits an H200 host, and both large-case benches say
plainly when there is no GPU to measure on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.large_case import long_softmax_task

from harness.device import gpu_absent_reason
from harness.drawn_inputs import case_draws
from harness.footprint import host_need, outputs_on_device, run_disk_bytes, shortfalls
from harness.settings import TimingSettings
from harness.task import load_task
from tests.test_job_deadlines import H200_FACTS

ROOT = Path(__file__).resolve().parents[1]


def test_the_bench_task_is_drawn_and_judged_on_the_device_and_fits(tmp_path):
    task, settings = load_task(long_softmax_task(tmp_path / "task")), TimingSettings()
    assert [c.name for c in task.performance_cases] == ["long-4096x393216"]
    assert task.own_launch("reference").block[0] == "1024"
    assert "double" in task.source("reference")
    large = task.case("long-4096x393216")
    assert sum(task.nbytes(large.dims).values()) == 2 * 4096 * 393216 * 4  # 6.4 GB each way
    assert case_draws(task, large, settings.draw_inputs_from_bytes) is not None
    assert outputs_on_device(task, large, settings)
    assert host_need(task, large, settings, serving=True) == (0, 0)
    assert sum(run_disk_bytes(task, settings).values()) < 100e6
    assert shortfalls(task, settings, H200_FACTS) == []


@pytest.mark.skipif(gpu_absent_reason() is None, reason="a GPU is here: the benches would measure")
@pytest.mark.parametrize("script", ["large_case.py", "device_judging.py"])
def test_without_a_gpu_the_benches_say_so(script):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("no GPU to measure on: "), done.stdout + done.stderr
