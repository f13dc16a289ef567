"""Device peaks without a GPU: the roofline arithmetic, the cache keyed by the device's fingerprint,
reading a worker's timings, and where the roofline fraction shows up."""

import json
import sys
from pathlib import Path

import pytest

from harness import peaks
from harness.referee import Referee
from harness.settings import CompiledKernel, TimingSettings
from harness.peaks import DevicePeaks, PeaksUnavailable, roofline_fraction, roofline_ms
from harness.task import load_task
from sandbox.pool import Worker
from server.suspicion import peak_bandwidth_bytes_per_s
from tests.fake_gpu_worker import DEVICE, FAKE_PEAKS
from tests.test_task import valid_task, write_task

FAKE_GPU = (sys.executable, str(Path(__file__).with_name("fake_gpu_worker.py")))
H200 = DevicePeaks(memory_gbps=4000.0, fp32_tflops=50.0, tensor_bf16_tflops=800.0)


# -- roofline ----------------------------------------------------------------------------------------
def test_a_memory_bound_case_is_bounded_by_bandwidth():
    # 4 GB at 4000 GB/s is 1 ms; 1 GFLOP at 50 TFLOP/s is 0.02 ms
    assert roofline_ms(H200, 4e9, 1e9, "fp32") == pytest.approx(1.0)
    assert roofline_fraction(1.0, 4.0) == pytest.approx(0.25)


def test_a_compute_bound_case_is_bounded_by_the_tasks_compute_peak():
    flops, moved = 2 * 4096.0 ** 3, 3 * 4096 ** 2 * 4.0  # a big fp32 matmul
    assert roofline_ms(H200, moved, flops, "fp32") == pytest.approx(flops / 50e12 * 1e3)
    assert roofline_ms(H200, moved, flops, "tensor_bf16") == pytest.approx(flops / 800e12 * 1e3)


def test_missing_numbers_leave_only_what_is_known():
    no_compute = DevicePeaks(memory_gbps=4000.0)
    assert roofline_ms(no_compute, 4e9, 1e15, "fp32") == pytest.approx(1.0)
    assert roofline_ms(H200, None, 1e9, "fp32") == pytest.approx(0.02)
    assert roofline_ms(H200, None, None, "fp32") is None
    assert roofline_ms(None, 4e9, 1e9, "fp32") is None
    assert roofline_fraction(None, 1.0) is None and roofline_fraction(1.0, None) is None


# -- fingerprint and cache ---------------------------------------------------------------------------
VERSIONS = {"nvidia-driver": "580.159.04", "cuda-bindings": "13.3.1", "nvidia-cublas": "13.1.0"}


def test_the_fingerprint_holds_device_clocks_driver_and_versions():
    print_ = peaks.fingerprint(DEVICE, VERSIONS)
    assert print_["name"] == DEVICE["name"] and print_["driver_version"] == DEVICE["driver_version"]
    assert (print_["sm_clock_khz"], print_["memory_clock_khz"]) == (DEVICE["sm_clock_khz"], DEVICE["memory_clock_khz"])
    assert print_["cuda-bindings_version"] == "13.3.1" and print_["protocol"] == peaks.PROTOCOL_VERSION
    assert "ordinal" not in print_  # two identical GPUs share their peaks


def test_the_cache_is_hit_for_the_same_fingerprint_only(tmp_path):
    print_ = peaks.fingerprint(DEVICE, VERSIONS)
    path = peaks.write_cache(tmp_path, print_, H200)
    assert path.name.startswith("peaks-") and path.suffix == ".json"
    hit = peaks.read_cache(tmp_path, print_)
    assert hit.memory_gbps == 4000.0 and hit.tensor_bf16_tflops == 800.0 and hit.source == "cache"
    for change in ({"sm_clock_khz": 1410000}, {"driver_version": 13000}, {"name": "NVIDIA H100"}):
        assert peaks.read_cache(tmp_path, peaks.fingerprint({**DEVICE, **change}, VERSIONS)) is None, change
    assert peaks.read_cache(tmp_path, peaks.fingerprint(DEVICE, {**VERSIONS, "cuda-bindings": "13.5.0"})) is None
    # another driver build of the same CUDA version measures again
    assert peaks.read_cache(tmp_path, peaks.fingerprint(DEVICE, {**VERSIONS, "nvidia-driver": "580.95.05"})) is None


def test_the_software_versions_name_the_driver_build(monkeypatch):
    monkeypatch.setattr(peaks, "driver_build", lambda: "580.159.04")
    found = peaks.software_versions()
    assert found["nvidia-driver"] == "580.159.04" and set(found) == {"nvidia-driver", "cuda-bindings", "nvidia-cublas"}


@pytest.mark.parametrize("content", ["{not json", "[]", '{"fingerprint": {}, "peaks": {}}', "",
                                     '{"peaks": {"memory_gbps": -1}}'])
def test_a_corrupt_cache_file_is_ignored(tmp_path, content):
    print_ = peaks.fingerprint(DEVICE, VERSIONS)
    peaks.cache_path(tmp_path, print_).write_text(content)
    assert peaks.read_cache(tmp_path, print_) is None


def test_a_file_of_another_fingerprint_under_this_name_is_ignored(tmp_path):
    print_ = peaks.fingerprint(DEVICE, VERSIONS)
    other = dict(print_, sm_clock_khz=1)
    peaks.cache_path(tmp_path, print_).write_text(json.dumps({"fingerprint": other, "peaks": H200.model_dump()}))
    assert peaks.read_cache(tmp_path, print_) is None


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(peaks.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert peaks.cache_dir() == tmp_path / "xdg" / "kernel-referee"
    monkeypatch.setenv(peaks.CACHE_ENV, str(tmp_path / "mine"))
    assert peaks.cache_dir() == tmp_path / "mine"


# -- measuring -----------------------------------------------------------------------------------
def test_rates_come_from_the_best_run():
    answer = {"status": "ok", "gemm_size": 1000, "notes": [],
              "copies": [{"bytes": 10**9, "ms": [1.0, 0.5, 0.8]}, {"bytes": 2 * 10**9, "ms": [2.0]}],
              "gemm": {"fp32": [0.1, 0.04], "tensor_bf16": [0.004]}}
    measured = peaks.peaks_from_answer(answer)
    assert measured.memory_gbps == pytest.approx(4000.0)  # 2 x 1 GB (read + written) in 0.5 ms
    assert measured.fp32_tflops == pytest.approx(50.0) and measured.tensor_bf16_tflops == pytest.approx(500.0)
    assert measured.copy_bytes == [10**9, 2 * 10**9] and measured.gemm_size == 1000 and measured.source == "measured"
    without = peaks.peaks_from_answer(dict(answer, gemm={}, notes=["no compute peaks: no cuBLAS"]))
    assert without.fp32_tflops is None and without.notes == ["no compute peaks: no cuBLAS"]


@pytest.mark.parametrize("answer", [{"status": "launch_error", "error": "X", "detail": "y"},
                                    {"status": "ok", "copies": []}])
def test_an_answer_without_timings_is_refused(answer):
    with pytest.raises(PeaksUnavailable):
        peaks.peaks_from_answer(answer)


def test_the_job_sizes_copies_well_above_the_l2():
    job = peaks.peaks_job(60 * 2**20)
    assert job["op"] == "peaks" and min(job["copy_bytes"]) >= 4 * 60 * 2**20 and len(job["copy_bytes"]) >= 3
    assert job["gemm_size"] == 8192


class _CountingWorker:
    """Answers peaks jobs like the fake GPU worker, counting calls."""

    def __init__(self, fail: bool = False):
        self.calls, self.fail = 0, fail

    def call(self, header, blobs, deadline_s, max_bytes):
        self.calls += 1
        if self.fail:
            raise RuntimeError("worker could not start")
        from tests.fake_gpu_worker import _peaks

        return _peaks(header, "honest")


def test_device_peaks_measure_once_then_hit_the_cache(tmp_path):
    worker = _CountingWorker()
    first, notes = peaks.device_peaks(worker, DEVICE, tmp_path)
    assert notes == [] and first.source == "measured" and worker.calls == 1
    assert first.memory_gbps == pytest.approx(FAKE_PEAKS["memory_gbps"])
    second, _ = peaks.device_peaks(worker, DEVICE, tmp_path)
    assert second.source == "cache" and worker.calls == 1 and second.memory_gbps == first.memory_gbps
    peaks.device_peaks(worker, {**DEVICE, "sm_clock_khz": 1500000}, tmp_path)
    assert worker.calls == 2 and len(list(tmp_path.glob("peaks-*.json"))) == 2


def test_a_corrupt_cache_is_measured_again_and_rewritten(tmp_path):
    worker = _CountingWorker()
    print_ = peaks.fingerprint(DEVICE, peaks.software_versions())
    peaks.cache_path(tmp_path, print_).write_text("garbage")
    measured, _ = peaks.device_peaks(worker, DEVICE, tmp_path)
    assert worker.calls == 1 and measured.source == "measured"
    assert peaks.read_cache(tmp_path, print_).memory_gbps == measured.memory_gbps


def test_peaks_that_cannot_be_measured_are_a_note(tmp_path):
    measured, notes = peaks.device_peaks(_CountingWorker(fail=True), DEVICE, tmp_path)
    assert measured is None and notes == ["device peaks could not be measured: RuntimeError: worker could not start"]
    assert list(tmp_path.iterdir()) == []


def test_peaks_from_a_worker_process(tmp_path):
    for behaviour, has_compute in (("honest", True), ("no_cublas", False)):
        with Worker("reference", command=FAKE_GPU + (f"--behaviour={behaviour}",), confine=False,
                    startup_timeout_s=30) as worker:
            hello = worker.ensure_started()
            measured = peaks.measure(worker, hello["device"])
        assert measured.memory_gbps == pytest.approx(4000.0)
        assert (measured.tensor_bf16_tflops == pytest.approx(800.0)) if has_compute else (
            measured.tensor_bf16_tflops is None and "no compute peaks" in measured.notes[0])


# -- where the fraction shows up ---------------------------------------------------------------------
class _Pool:
    def __init__(self, reference: Worker, candidate: Worker):
        self.reference, self.candidate = reference, candidate


def test_every_timed_case_states_its_roofline_fraction(tmp_path):
    task = load_task(write_task(tmp_path, valid_task()))  # a 256^3 matmul: quick to emulate
    workers = [Worker(n, command=FAKE_GPU + ("--behaviour=honest",), confine=False, startup_timeout_s=30)
               for n in ("reference", "candidate")]
    try:
        referee = Referee(task, _Pool(*workers), CompiledKernel("reference", b"\x7fELF", task.kernel_name, task.launch),
                          TimingSettings(warmups=2, iterations=20))
        kernel = CompiledKernel("candidate", b"\x7fELF", task.kernel_name, task.launch)
        assert all(t.roofline_fraction is None for t in referee.time(kernel, list(task.performance_cases)).cases)
        referee.peaks = H200
        for timing in referee.time(kernel, list(task.performance_cases)).cases:
            dims = task.case(timing.case).dims
            bound = max(task.bytes_moved(dims) / 4000e9, task.flops(dims) / 50e12) * 1e3
            assert timing.roofline_ms == pytest.approx(bound)
            assert timing.roofline_fraction == pytest.approx(bound / timing.stats.median_ms)
    finally:
        for worker in workers:
            worker.stop()


def test_the_roofline_suspicion_uses_the_measured_bandwidth():
    theoretical = {"memory_clock_khz": 2619000, "memory_bus_bits": 5120}
    assert peak_bandwidth_bytes_per_s(theoretical) == pytest.approx(2619e6 * 2 * 640)
    assert peak_bandwidth_bytes_per_s({**theoretical, "peaks": {"memory_gbps": 4300.0}}) == pytest.approx(4300e9)
    assert peak_bandwidth_bytes_per_s({**theoretical, "peaks": None}) == pytest.approx(2619e6 * 2 * 640)
