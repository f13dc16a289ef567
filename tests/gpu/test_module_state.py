"""A module's constant bank on the GPU: a kernel that writes into it through generic addresses (cvta.const)
finds it as loaded at every launch, padding and patched pointers included; and a kernel that calls the device
heap under a task that does not allow it is refused before any job reaches the worker."""

from pathlib import Path

import pytest

from harness.results import ReasonCode
from tests.gpu.conftest import build

pytestmark = pytest.mark.gpu

KERNELS = Path(__file__).parent / "kernels"


def test_constant_bytes_written_through_cvta_const_are_restored_before_every_launch(referee, matmul_task, arch):
    # Every case runs twice with a restore before each launch; a launch that sees the bank as the previous one
    # left it (or whose stores were dropped) writes a wrong c[0]: mismatch or race.
    k = build((KERNELS / "constant_writes.cu").read_text(), matmul_task, arch)
    check = referee.check(k, list(matmul_task.visible_cases))
    assert check.passed, check.reasons
    timing = referee.time(k, list(matmul_task.performance_cases))  # every timed launch audited or scanned too
    assert timing.passed, timing.reasons


def test_a_kernel_calling_the_device_heap_is_refused_before_any_job(referee, matmul_task, arch):
    worker = referee.pool.candidate
    starts = worker.starts
    source = (Path(__file__).parents[1] / "exploits" / "malloc_flood.cu").read_text()
    check = referee.check(build(source, matmul_task, arch), list(matmul_task.visible_cases))
    assert [r.code for r in check.reasons] == [ReasonCode.DEVICE_HEAP], check.reasons
    assert "malloc" in check.reasons[0].detail
    assert worker.starts == starts  # nothing faulted, no worker was replaced
