"""cuBLAS as the vendor baseline and the device peaks, on the GPU: the results match the reference
on every case, cuBLAS is timed by the candidates' protocol, a wrong mapping is caught, the peaks
are plausible for the device and cached per fingerprint, and check / the executor show them."""

import json
from pathlib import Path

import pytest

from harness import vendor_yardstick as baselines
from harness.vendor_yardstick import cublas_wheel_libraries, gemm_call
from harness.referee import Referee
from harness.settings import TimingSettings
from harness.peaks import device_peaks
from harness.task import load_task
from harness.results import ReasonCode
from server.cli import main
from server.executor import GpuExecutor
from tests.gpu.conftest import MATMUL, build

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cublas_wheel_libraries(), reason=(
    "no nvidia-cublas wheel in this Python's site-packages (pip install nvidia-cublas)"))]
MATMUL_BF16 = MATMUL.parent / "matmul_bf16"
ITERATIONS = 40


@pytest.fixture(scope="module")
def bf16_task():
    return load_task(MATMUL_BF16)


@pytest.fixture(scope="module")
def bf16_referee(bf16_task, pool, arch):
    reference = build(bf16_task.source("reference"), bf16_task, arch, label="reference",
                      launch=bf16_task.reference_launch)
    return Referee(bf16_task, pool, reference, TimingSettings(warmups=3, iterations=ITERATIONS))


def every_case(task):
    return list(task.visible_cases) + list(task.holdout_cases)


def _assert_matches_the_reference(timing, task):
    """Every audited timed output (a secret subset of launches, each on its own fresh inputs) was compared
    with the reference's output for those inputs with the task's tolerance: passed means cuBLAS computed the
    task's result."""
    assert timing.passed, timing.reasons
    assert [t.case for t in timing.cases] == [c.name for c in every_case(task)]
    for case in timing.cases:
        assert case.reasons == [] and case.unwritten_launches == 0
        assert case.inputs == "fresh" and case.audited_launches >= 3 * case.batches
        assert case.stats.n == ITERATIONS * case.batches


def test_cublas_float32_matches_the_reference_on_every_case(referee, matmul_task):
    timing = referee.time_vendor(every_case(matmul_task), lambda case: gemm_call(matmul_task, case))
    _assert_matches_the_reference(timing, matmul_task)


def test_cublas_bf16_matches_the_reference_on_every_case(bf16_referee, bf16_task):
    timing = bf16_referee.time_vendor(every_case(bf16_task), lambda case: gemm_call(bf16_task, case))
    _assert_matches_the_reference(timing, bf16_task)


def test_cublas_loads_in_a_confined_worker(referee, matmul_task):
    report = baselines.time_vendor(referee, [matmul_task.correctness_cases[0]])
    assert report.available and report.notes == [], report.notes
    assert referee.pool.reference.hello["confined"] is True  # Landlock let it read the wheel's library


def test_cublas_is_timed_with_the_candidates_protocol_and_beats_the_baseline(bf16_referee, bf16_task, arch):
    cases = list(bf16_task.performance_cases)
    report = baselines.time_vendor(bf16_referee, cases)
    assert report.available and report.timing.passed, report.notes
    for case in report.timing.cases:
        assert case.launches == ITERATIONS * case.batches == len(case.samples_ms)
        assert case.host_kept_up is True and not [w for w in case.warnings if "queue" in w]
        assert 0 < case.event_overhead_ms < 0.02
        assert case.achieved_tflops > 10 and case.achieved_gbps > 0
    baseline = bf16_referee.time(build(bf16_task.source("initial"), bf16_task, arch), cases)
    assert baseline.passed, baseline.reasons
    for vendor, mine in zip(report.timing.cases, baseline.cases):
        assert vendor.stats.ci_high_ms < mine.stats.ci_low_ms, (vendor.case, vendor.stats, mine.stats)


def test_a_wrong_mapping_is_caught_by_the_recheck(referee, matmul_task):
    unswapped = lambda case: dict(gemm_call(matmul_task, case), a_param="a", b_param="b")  # noqa: E731 - B·A
    square = next(c for c in matmul_task.visible_cases if len(set(c.dims.values())) == 1)  # the operands still fit
    timing = referee.time_vendor([square], unswapped)
    assert not timing.passed
    assert {r.code for r in timing.reasons} == {ReasonCode.TIMED_OUTPUT_MISMATCH}


def test_peaks_are_plausible_and_cached(pool, tmp_path):
    device = pool.candidate.ensure_started()["device"]
    first, notes = device_peaks(pool.reference, device, tmp_path)
    assert notes == [] and first is not None and first.source == "measured" and first.notes == []
    assert min(first.copy_bytes) >= 4 * device["l2_bytes"] and first.gemm_size == 8192
    assert first.fp32_tflops < first.tensor_bf16_tflops
    if "H200" in device["name"]:
        assert 2000 < first.memory_gbps < 6000, first
        assert first.tensor_bf16_tflops > 300 and first.fp32_tflops > 20, first
    else:
        assert first.memory_gbps > 100 and first.fp32_tflops > 1, first
    assert len(list(tmp_path.glob("peaks-*.json"))) == 1
    second, notes = device_peaks(pool.reference, device, tmp_path)
    assert notes == [] and second.source == "cache"
    assert second.model_dump(exclude={"source"}) == first.model_dump(exclude={"source"})


def test_the_executor_records_peaks_and_every_timing_states_its_roofline(matmul_task, monkeypatch, tmp_path):
    monkeypatch.setenv("KERNEL_REFEREE_CACHE_DIR", str(tmp_path))
    executor = GpuExecutor(matmul_task, TimingSettings(warmups=3, iterations=20))
    try:
        facts = executor.start()
        assert facts["peaks"]["memory_gbps"] > 0 and facts["peaks_notes"] == []
        report = executor.time_vendor(list(matmul_task.performance_cases))
        assert report.available and report.timing.passed, report.notes
        for case in report.timing.cases:
            assert case.roofline_ms > 0 and 0 < case.roofline_fraction < 1.2
    finally:
        executor.close()


def test_check_shows_the_peaks_and_cublas_beside_the_kernels(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KERNEL_REFEREE_CACHE_DIR", str(tmp_path / "cache"))
    report = tmp_path / "check.json"
    assert main(["check", str(MATMUL), "--iterations", "20", "--warmups", "3", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "device peaks (measured):" in out and "GB/s copy" in out and "roof %" in out
    assert "== cuBLAS (vendor baseline" in out and "initial vs cuBLAS:" in out and "reference vs cuBLAS:" in out
    assert out.count("PASS; score") == 2
    document = json.loads(report.read_text())
    assert document["peaks"]["memory_gbps"] > 0
    assert document["vendor"]["available"] and document["vendor"]["timing"]["passed"]
    for kernel in document["kernels"]:
        assert all(c["roofline_fraction"] > 0 for c in kernel["timing"]["cases"])
    assert Path(tmp_path / "cache").is_dir()
