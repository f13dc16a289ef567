"""The kernel clock in a confined worker on the GPU: it loads, it reads each launch's own time (below
its event pair, by about the launch latency), it counts the GPU's busy time, and vendor launches of
several kernels are clocked too."""

import pytest

from harness.vendor_yardstick import gemm_call
from harness.settings import TimingSettings, Unavailable
from harness.task_model import Case
from tests.gpu.conftest import build

pytestmark = pytest.mark.gpu

SMALL = Case(name="clock-256", role="performance", dims={"m": 256, "n": 256, "k": 256}, seed=7)
LARGE = Case(name="clock-1024", role="performance", dims={"m": 1024, "n": 1024, "k": 1024}, seed=8)


def test_the_confined_worker_has_the_kernel_clock(pool):
    hello = pool.candidate.ensure_started()
    assert hello["confined"] is True
    clock = hello["kernel_clock"]
    assert clock["available"], clock["note"]
    assert clock["cupti_version"] >= 13
    # An empty kernel: a microsecond or two on its own clock, several between events.
    assert 0 < clock["empty_kernel_ms"] < hello["event_overhead_ms"]


@pytest.mark.parametrize("case", [SMALL, LARGE], ids=lambda c: c.name)
def test_each_launch_reads_its_own_time_just_under_its_events(referee, matmul_task, arch, case):
    timing = referee.time(build(matmul_task.source("reference"), matmul_task, arch), [case]).cases[0]
    assert timing.passed, timing.reasons
    assert timing.clock == "kernel"
    assert len(timing.event_samples_ms) == len(timing.samples_ms) == timing.launches
    for kernel_ms, event_ms in zip(timing.samples_ms, timing.event_samples_ms):
        assert 0 < kernel_ms <= event_ms * 1.01 + 0.002
    gap_ms = timing.event_median_ms - timing.stats.median_ms
    assert 0 < gap_ms < 0.010  # the launch latency, not a share of the kernel
    # Busy: at least every timed launch (the flushes, scans and copies come on top).
    assert timing.gpu_busy_ms > sum(timing.samples_ms)


def test_events_alone_when_asked(matmul_task, pool, arch):
    from harness.referee import Referee

    reference = build(matmul_task.source("reference"), matmul_task, arch, label="reference")
    referee = Referee(matmul_task, pool, reference, TimingSettings(warmups=2, iterations=20, clock="events"))
    timing = referee.time(reference, [SMALL]).cases[0]
    assert timing.passed, timing.reasons
    assert timing.clock == "events" and timing.event_samples_ms is None


def test_a_vendor_call_is_clocked_from_its_first_kernel_to_its_last(referee, matmul_task):
    try:
        report = referee.time_vendor([LARGE], lambda case: gemm_call(matmul_task, case))
    except Unavailable as exc:
        pytest.skip(f"cuBLAS is not available here: {exc}")
    timing = report.cases[0]
    assert timing.passed, timing.reasons
    assert timing.clock == "kernel"
    assert 0 < timing.stats.median_ms < timing.event_median_ms
