"""A result flagged as too good, honest, counts on a real GPU: softmax_f32's initial kernel over its reference
launched as a candidate (about 47 times faster on an H100) is re-checked and re-timed in a fresh worker, and its
two timings agree within what two honest jobs differ by (server/suspicion.py RETIMING_TOLERANCE). Under the 0.5%
noise floor it was rejected as `retiming_disagrees` (bench/recorded/h100-2026-12-07-b)."""

import shutil
from pathlib import Path

import pytest

from harness.settings import TimingSettings
from harness.task import load_task
from server.attempt import record_attempt
from server.executor import GpuExecutor
from server.lifecycle import new_run
from server.run import RunSettings

pytestmark = pytest.mark.gpu

SOFTMAX = Path(__file__).resolve().parents[2] / "cases" / "softmax_f32"


def test_an_honest_kernel_flagged_as_too_good_is_timed_again_and_counts(tmp_path):
    task_dir = tmp_path / "softmax_f32"
    shutil.copytree(SOFTMAX, task_dir, ignore=shutil.ignore_patterns("__pycache__"))
    (task_dir / "initial.cu").write_text((SOFTMAX / "reference.cu").read_text())  # the reference is the baseline
    timing = TimingSettings(warmups=5, iterations=40)
    executor = GpuExecutor(load_task(task_dir), timing)
    try:
        run = new_run(task_dir, tmp_path / "results", RunSettings(max_attempts=3, timing=timing), executor)
        try:
            answer = record_attempt(run, run.candidate(None, (SOFTMAX / "initial.cu").read_text()), "fast rows",
                                    None, None)
            entry = run.history[-1]
        finally:
            run.close()
    finally:
        executor.close()
    assert entry.reverification is not None, "10 times the baseline or more: flagged and re-verified"
    assert answer.verdict == "valid-faster", answer.reasons
    assert entry.reverification["passed"] is True and answer.best_attempt == 1
