"""The check and timing protocols on the H200 with matmul_f32: honest kernels pass, each cheat
is rejected for its own reason, and faults leave the next job working."""

import re

import pytest

from harness.settings import TimingSettings
from harness.task_model import LaunchSpec
from harness.results import ReasonCode
from tests.gpu.conftest import build

pytestmark = pytest.mark.gpu

BODY = """
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= m || col >= n) return;
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) sum += a[row * k + i] * b[i * n + col];
"""
SIGNATURE = 'extern "C" __global__ void matmul_f32(const float* a, const float* b, float* c, int m, int n, int k)'


def kernel(body_end: str, prelude: str = "", signature: str = SIGNATURE) -> str:
    return f"{prelude}\n{signature} {{\n{BODY}\n{body_end}\n}}\n"


def codes(report) -> set:
    return {r.code for r in report.reasons}


def all_cases(task):
    return list(task.visible_cases) + list(task.holdout_cases)


@pytest.mark.parametrize("which", ["reference", "initial"])
def test_shipped_kernels_pass_check_and_timing(referee, matmul_task, arch, which):
    k = build(matmul_task.source(which), matmul_task, arch)
    check = referee.check(k, all_cases(matmul_task))
    assert check.passed, check.reasons
    assert all(c.agreement == "identical" for c in check.cases)
    timing = referee.time(k, list(matmul_task.performance_cases))
    assert timing.passed, timing.reasons
    assert timing.score_ms > 0
    for case in timing.cases:
        assert case.stats.n == 40 * case.batches and case.stats.median_ms > 0
        assert case.achieved_gbps > 0 and case.achieved_tflops > 0
        assert 0 < case.event_overhead_ms < 0.02
        assert case.host_kept_up and not [w for w in case.warnings if "queue" in w], case.warnings


def test_naive_reference_is_slower_than_tiled_baseline(referee, matmul_task, arch):
    cases = list(matmul_task.performance_cases)
    naive = referee.time(build(matmul_task.source("reference"), matmul_task, arch), cases)
    tiled = referee.time(build(matmul_task.source("initial"), matmul_task, arch), cases)
    for slow, fast in zip(naive.cases, tiled.cases):
        assert slow.stats.ci_low_ms > fast.stats.ci_high_ms, (slow.stats, fast.stats)


@pytest.mark.parametrize("offset", ["m * n", "-1"])
def test_write_outside_the_output_is_out_of_bounds(referee, matmul_task, arch, offset):
    source = kernel(f"c[row * n + col] = sum; if (row == 0 && col == 0) c[{offset}] = 1.0f;")
    check = referee.check(build(source, matmul_task, arch), list(matmul_task.visible_cases))
    assert not check.passed
    assert codes(check) == {ReasonCode.OUT_OF_BOUNDS_WRITE}
    detail = check.reasons[0].detail
    # The float's 4 bytes, less any that the random canary already held (1 in 256 for each byte).
    assert re.match(r"c: [1-4] bytes changed", detail), detail
    assert ("after the end" if offset == "m * n" else "before the start") in detail


def test_write_into_an_input_is_rejected(referee, matmul_task, arch):
    source = kernel("c[row * n + col] = sum; if (row == 0 && col == 0) ((float*)a)[0] = 0.0f;")
    check = referee.check(build(source, matmul_task, arch), list(matmul_task.visible_cases))
    assert ReasonCode.INPUT_MODIFIED in codes(check)
    assert "a" in check.cases[0].reasons[0].detail


def test_kernel_that_never_returns_is_killed_and_the_next_job_runs(referee, matmul_task, arch):
    source = kernel("c[row * n + col] = sum; while (clock64() >= 0) { }")
    worker = referee.pool.candidate
    starts = worker.starts
    referee.settings = TimingSettings(warmups=3, iterations=40, run_deadline_s=3)
    try:
        check = referee.check(build(source, matmul_task, arch), list(matmul_task.visible_cases))
    finally:
        referee.settings = TimingSettings(warmups=3, iterations=40)
    assert codes(check) == {ReasonCode.TIMEOUT}
    assert len(check.cases) == 1  # stops at the first timeout
    good = referee.check(build(matmul_task.source("initial"), matmul_task, arch), list(matmul_task.visible_cases))
    assert good.passed
    assert worker.starts == starts + 1


@pytest.mark.parametrize("fault, error", [
    ("c[row * n + col] = sum; if (row == 0 && col == 0) *(volatile float*)(0x10) = 1.0f;", "CUDA_ERROR_ILLEGAL_ADDRESS"),
    ("c[row * n + col] = sum; if (row == 1) __trap();", "CUDA_ERROR_"),
    ("c[row * n + col] = sum; if (col == 3) reinterpret_cast<float2*>(c + 1)[0] = make_float2(sum, sum);",
     "CUDA_ERROR_MISALIGNED_ADDRESS"),
])
def test_sticky_faults_are_rejected_and_the_worker_restarts(referee, matmul_task, arch, fault, error):
    worker = referee.pool.candidate
    starts = worker.starts
    check = referee.check(build(kernel(fault), matmul_task, arch), list(matmul_task.visible_cases))
    assert codes(check) == {ReasonCode.CUDA_FAULT}
    assert check.reasons[0].detail.startswith(error)
    good = referee.check(build(matmul_task.source("initial"), matmul_task, arch), list(matmul_task.visible_cases))
    assert good.passed
    assert worker.starts == starts + 1


CACHED = """
__device__ float cache[2048 * 2048];  // the largest visible case's m * n
__device__ unsigned int blocks_seen = 0;
"""


def test_result_cached_in_device_state_is_never_replayed(referee, matmul_task, arch):
    # Every block counts itself in; once a whole launch has been seen, later launches copy the
    # first launch's result instead of computing. The counter and the cache are `__device__` state, put back
    # to zero before every launch: no launch ever sees a whole earlier launch, and every one computes.
    source = kernel("""
    __shared__ unsigned int seen;
    if (threadIdx.x == 0 && threadIdx.y == 0) seen = atomicAdd(&blocks_seen, 1u);
    __syncthreads();
    if (seen >= gridDim.x * gridDim.y) { c[row * n + col] = cache[row * n + col]; return; }
    c[row * n + col] = sum; cache[row * n + col] = sum;
    """, prelude=CACHED)
    k = build(source, matmul_task, arch)
    assert referee.check(k, list(matmul_task.visible_cases)).passed
    timing = referee.time(k, list(matmul_task.performance_cases))
    assert timing.passed, timing.reasons  # audited on fresh inputs: the outputs were computed
    honest = referee.time(build(kernel("c[row * n + col] = sum;"), matmul_task, arch),
                          list(matmul_task.performance_cases))
    for cached, computed in zip(timing.cases, honest.cases):  # and no faster than computing them
        assert cached.stats.median_ms >= computed.stats.median_ms * 0.97, (cached.stats, computed.stats)


EVERY_FOURTH = "__device__ unsigned int launches = 0;"


def test_computing_only_every_fourth_launch_is_rejected(referee, matmul_task, arch):
    source = kernel("""
    __shared__ unsigned int ticket;
    if (threadIdx.x == 0 && threadIdx.y == 0) {
        ticket = launches;
        __threadfence();
    }
    __syncthreads();
    if (ticket % 4 == 0) c[row * n + col] = sum;
    if (row == 0 && col == 0) atomicAdd(&launches, 1u);  /* counts launches, roughly */
    """, prelude=EVERY_FOURTH)
    k = build(source, matmul_task, arch)
    check = referee.check(k, list(matmul_task.visible_cases))
    assert not check.passed  # the second of the two check runs is skipped
    timing = referee.time(k, list(matmul_task.performance_cases))
    assert ReasonCode.UNWRITTEN_OUTPUT in codes(timing)


def test_large_dynamic_shared_memory_is_enabled_and_oversized_refused(referee, matmul_task, arch):
    source = kernel("extern __shared__ float scratch[]; scratch[threadIdx.x] = sum; c[row * n + col] = sum;")
    k = build(source, matmul_task, arch)
    big = k.__class__(k.label, k.cubin, k.symbol, LaunchSpec(grid=matmul_task.launch.grid,
                                                             block=matmul_task.launch.block, shared_bytes="96 * 1024"))
    assert referee.check(big, list(matmul_task.visible_cases)).passed
    huge = k.__class__(k.label, k.cubin, k.symbol, LaunchSpec(grid=matmul_task.launch.grid,
                                                              block=matmul_task.launch.block, shared_bytes="1024 * 1024"))
    check = referee.check(huge, list(matmul_task.visible_cases))
    assert codes(check) == {ReasonCode.LAUNCH_ERROR}
    assert "dynamic shared memory" in check.reasons[0].detail


def test_wrong_signature_is_refused_before_launch(referee, matmul_task, arch):
    source = 'extern "C" __global__ void matmul_f32(const float* a, const float* b, float* c, int m, int n) {}'
    check = referee.check(build(source, matmul_task, arch), list(matmul_task.visible_cases))
    assert codes(check) == {ReasonCode.LAUNCH_ERROR}
    assert "SIGNATURE_MISMATCH" in check.reasons[0].detail


def test_race_from_missing_syncthreads_is_rejected(referee, matmul_task, arch):
    source = matmul_task.source("initial").replace("__syncthreads();", "", 1)
    check = referee.check(build(source, matmul_task, arch), list(matmul_task.visible_cases))
    assert not check.passed
    assert codes(check) & {ReasonCode.RACE, ReasonCode.MISMATCH}
