"""The vendor baseline without a GPU: the cuBLAS argument mapping, the [vendor] manifest table, the
timing protocol through CPU stand-in workers, and what check, summary and describe_task show."""

import io
import os
import site
import sys
from pathlib import Path

import numpy as np
import pytest
from cuda.bindings import runtime

from harness import vendor_yardstick as baselines
from harness.worker_side import cublas_api
from harness.vendor_yardstick import VendorReport, describe_view, gemm_call, vendor_summary
from harness.referee import Referee
from harness.settings import CompiledKernel, TimingSettings
from harness.peaks import DevicePeaks
from harness.stats import summarize
from harness.task_model import TaskError
from harness.task import load_task
from harness.results import CaseTiming, ReasonCode, TimingReport
from sandbox.grants import python_paths
from sandbox.pool import Worker
from server.check import Target, print_vendor
from tests.fake_gpu_worker import cublas_gemm
from tests.server_support import client, executor, kernel, ok
from tests.test_task import edited, load_error, valid_task, write_task
from server.lifecycle import new_run
from server.run import RunSettings

REPO = Path(__file__).resolve().parents[1]
MATMUL, MATMUL_BF16 = REPO / "cases" / "matmul_f32", REPO / "cases" / "matmul_bf16"
FAKE_GPU = (sys.executable, str(Path(__file__).with_name("fake_gpu_worker.py")))
CUBIN = b"\x7fELF" + bytes(60)
VENDOR = {"library": "cublas", "op": "gemm", "a": "a", "b": "b", "c": "c", "m": "m", "n": "n", "k": "k"}


# -- the mapping ---------------------------------------------------------------------------------
def test_the_constants_are_cudas_own():
    assert cublas_api.CUDA_R_32F == int(runtime.cudaDataType.CUDA_R_32F)
    assert cublas_api.CUDA_R_16F == int(runtime.cudaDataType.CUDA_R_16F)
    assert cublas_api.CUDA_R_16BF == int(runtime.cudaDataType.CUDA_R_16BF)
    assert cublas_api.CUDA_R_64F == int(runtime.cudaDataType.CUDA_R_64F)
    # cublas_api.h: CUBLAS_COMPUTE_32F = 68 (77 would allow TF32), CUBLAS_OP_N = 0, CUBLAS_GEMM_DEFAULT = -1
    assert (cublas_api.CUBLAS_COMPUTE_32F, cublas_api.CUBLAS_OP_N, cublas_api.CUBLAS_GEMM_DEFAULT) == (68, 0, -1)


def test_row_major_a_times_b_is_column_major_b_times_a_for_cublas():
    task = load_task(MATMUL)
    call = gemm_call(task, task.case("odd-31x37x29"))  # m = 31, n = 37, k = 29
    assert call == {"library": "cublas", "op": "gemm", "transa": 0, "transb": 0, "m": 37, "n": 31, "k": 29,
                    "a_param": "b", "a_type": 0, "lda": 37, "b_param": "a", "b_type": 0, "ldb": 29,
                    "c_param": "c", "c_type": 0, "ldc": 37, "compute_type": 68, "algo": -1,
                    "alpha": 1.0, "beta": 0.0}


def test_bf16_inputs_with_float32_output_and_arithmetic():
    task = load_task(MATMUL_BF16)
    call = gemm_call(task, task.case("ragged-257x131x67"))
    assert (call["m"], call["n"], call["k"], call["lda"], call["ldb"], call["ldc"]) == (131, 257, 67, 131, 67, 131)
    assert (call["a_type"], call["b_type"], call["c_type"], call["compute_type"]) == (14, 14, 0, 68)
    assert task.cost.compute == "tensor_bf16" and load_task(MATMUL).cost.compute == "fp32"


@pytest.mark.parametrize("m, n, k", [(31, 37, 29), (1, 5, 3), (7, 1, 1), (4, 4, 4), (2, 9, 1)])
def test_what_cublas_computes_from_the_mapping_is_the_row_major_product(tmp_path, m, n, k):
    task = load_task(write_task(tmp_path, edited(valid_task(), {"vendor": VENDOR})))
    case = task.cases[0].model_copy(update={"dims": {"m": m, "n": n, "k": k}})
    rng = np.random.default_rng(m * 100 + n * 10 + k)
    a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    c = cublas_gemm(gemm_call(task, case), {"a": a, "b": b}).reshape(m, n)  # C's memory read back row-major
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_the_emulation_tells_a_forgotten_swap_from_the_right_mapping(tmp_path):
    task = load_task(write_task(tmp_path, edited(valid_task(), {"vendor": VENDOR})))
    call = gemm_call(task, task.case("square"))  # m = n = k = 256
    wrong = dict(call, a_param="a", b_param="b")  # no swap: column-major Aᵀ·Bᵀ, i.e. row-major B·A
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((256, 256), dtype=np.float32), rng.standard_normal((256, 256), dtype=np.float32)
    np.testing.assert_allclose(cublas_gemm(wrong, {"a": a, "b": b}).reshape(256, 256), b @ a, rtol=1e-4, atol=1e-3)
    assert not np.allclose(cublas_gemm(wrong, {"a": a, "b": b}).reshape(256, 256), a @ b, atol=1e-2)


# -- the manifest ----------------------------------------------------------------------------------
def test_a_task_without_vendor_has_none(tmp_path):
    task = load_task(write_task(tmp_path, valid_task()))
    assert task.vendor is None and task.cost.compute == "fp32"
    with pytest.raises(ValueError, match="no gemm vendor baseline"):
        gemm_call(task, task.cases[0])


@pytest.mark.parametrize("edits, field, message", [
    ({"vendor.library": "mkl"}, "vendor.library", "cublas"),
    ({"vendor.op": "conv"}, "vendor.op", "gemm"),
    ({"vendor.transpose": True}, "vendor.transpose", "unknown key"),
    ({"vendor.a": "x"}, "vendor.a", "there is no parameter named 'x'"),
    ({"vendor.c": "a"}, "vendor.c", "'a' must be a 2-D output array"),
    ({"vendor.b": "m"}, "vendor.b", "'m' must be a 2-D input array"),
    ({"vendor.m": "q"}, "vendor.m", "unknown name 'q'"),
    ({"vendor.m": "n", "vendor.n": "m"}, "vendor.a", "needs [37, 29]"),
    ({"vendor.k": "k - 29"}, "vendor.k", "is 0 for case 'odd'"),
    ({"params.2.dtype": "float64"}, "vendor", "float32 x float32 -> float64 is not supported"),
    ({"cost.compute": "tensor_fp8"}, "cost.compute", "'fp32' or 'tensor_bf16'"),
])
def test_a_bad_vendor_table_names_its_field(tmp_path, edits, field, message):
    error = load_error(tmp_path, edited(valid_task(), {"vendor": dict(VENDOR), **edits}))
    assert isinstance(error, TaskError) and error.file == tmp_path.resolve() / "task.toml"
    assert error.field == field and message in error.message, error


def test_a_missing_vendor_key_is_named(tmp_path):
    vendor = {k: v for k, v in VENDOR.items() if k != "k"}
    error = load_error(tmp_path, edited(valid_task(), {"vendor": vendor}))
    assert (error.field, error.message) == ("vendor.k", "missing required key")


# -- the protocol, through CPU stand-in workers -------------------------------------------------
class _Pool:
    def __init__(self, reference: Worker, candidate: Worker):
        self.reference, self.candidate = reference, candidate


@pytest.fixture
def referee_for(request):
    made = []

    def make(task_dir: Path, reference_behaviour: str = "honest") -> Referee:
        task = load_task(task_dir)
        workers = [Worker(name, command=FAKE_GPU + (f"--behaviour={b}",), confine=False, startup_timeout_s=30)
                   for name, b in (("reference", reference_behaviour), ("candidate", "honest"))]
        made.extend(workers)
        return Referee(task, _Pool(*workers), CompiledKernel("reference", CUBIN, task.kernel_name, task.launch),
                       TimingSettings(warmups=2, iterations=20, min_checked_launches=3))

    yield make
    for worker in made:
        worker.stop()


def test_cublas_is_timed_and_checked_like_a_kernel(referee_for, tmp_path):
    referee = referee_for(write_task(tmp_path, edited(valid_task(), {"vendor": VENDOR})))
    referee.peaks = DevicePeaks(memory_gbps=4000.0, fp32_tflops=50.0)
    report = baselines.time_vendor(referee, list(referee.task.visible_cases))
    assert report.available and report.notes == [] and report.timing.passed
    assert set(report.medians_ms) == {c.name for c in referee.task.visible_cases}
    for case in report.timing.cases:
        assert (case.launches, case.audited_launches, case.unwritten_launches) == (20 * case.batches, referee.settings.checked_launches * case.batches, 0)
        assert case.inputs == "fresh"
        assert case.achieved_gbps > 0 and case.roofline_fraction is not None and 0 < case.roofline_fraction < 1
    assert referee.pool.candidate.starts == 0  # the vendor runs in the trusted reference worker only


def test_bf16_cublas_through_the_same_protocol(referee_for):
    referee = referee_for(MATMUL_BF16)
    report = baselines.time_vendor(referee, list(referee.task.correctness_cases))
    assert report.available and report.timing.passed, report.notes


def test_a_wrong_cublas_call_is_caught_not_reported(referee_for, monkeypatch, tmp_path):
    referee = referee_for(write_task(tmp_path, edited(valid_task(), {"vendor": VENDOR})))
    cases = [referee.task.case("square")]  # square, so the unswapped operands still fit
    timing = referee.time_vendor(cases, lambda case: _swapped(referee.task, case))
    assert not timing.passed
    assert [r.code for r in timing.reasons] == [ReasonCode.TIMED_OUTPUT_MISMATCH]
    monkeypatch.setattr(baselines, "gemm_call", _swapped)
    report = baselines.time_vendor(referee, cases)
    assert report.available and report.medians_ms == {}
    assert "failed the protocol" in report.notes[0] and "timed_output_mismatch" in report.notes[0]
    assert describe_view(vendor_summary(report, {})) is None


def _swapped(task, case):
    """The mapping with the operands left unswapped (row-major B·A): shapes fit on a square case."""
    return dict(gemm_call(task, case), a_param="a", b_param="b")


def test_cublas_that_does_not_load_is_a_note(referee_for):
    referee = referee_for(MATMUL, reference_behaviour="no_cublas")
    report = baselines.time_vendor(referee, list(referee.task.performance_cases))
    assert not report.available and report.timing is None and report.medians_ms == {}
    assert report.notes[0].startswith("cuBLAS is not available in the GPU worker (CUBLAS_UNAVAILABLE: cuBLAS could "
                                      "not be loaded: DynamicLibNotFoundError (fake))")
    assert report.notes[1:] == baselines.confinement_notes()  # and where the parent sees it, or that it is absent
    assert vendor_summary(report, {})["cases"] == {} and describe_view(vendor_summary(report, {})) is None


def test_a_task_without_vendor_times_nothing(referee_for, tmp_path):
    referee = referee_for(write_task(tmp_path, valid_task()))
    assert baselines.time_vendor(referee, list(referee.task.performance_cases)) is None
    assert referee.pool.reference.starts == 0


# -- where a confined worker finds cuBLAS ------------------------------------------------------------
def test_the_wheels_library_folder_is_readable_by_a_confined_worker():
    # pip puts nvidia-cublas in site-packages/nvidia/cu13/lib, beside the NVRTC wheel this project needs
    folders = [os.path.realpath(Path(d) / "nvidia" / "cu13" / "lib") for d in site.getsitepackages()
               if (Path(d) / "nvidia" / "cu13" / "lib").is_dir()]
    assert folders, "the NVRTC wheel's library folder should exist"
    granted = python_paths()
    for folder in folders:
        assert any(folder == g or folder.startswith(g.rstrip("/") + "/") for g in granted), folder
    notes = baselines.confinement_notes(granted, [str(Path(f).parents[2]) for f in folders])
    assert notes == [] or (len(notes) == 1 and "pip install nvidia-cublas" in notes[0])  # within reach, or absent


def test_confinement_notes_say_where_cublas_is_out_of_reach(tmp_path):
    library = tmp_path / "site" / "nvidia" / "cu13" / "lib" / "libcublas.so.13"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"\x7fELF")
    site_dirs = [str(tmp_path / "site")]
    assert baselines.confinement_notes([str(tmp_path / "site")], site_dirs) == []
    assert baselines.confinement_notes([str(tmp_path / "elsewhere")], site_dirs) == [
        f"{os.path.realpath(library)} is outside every folder a confined GPU worker may read"]
    assert "pip install nvidia-cublas" in baselines.confinement_notes([], [str(tmp_path / "empty")])[0]


# -- what people and agents read -------------------------------------------------------------------
def _timing(case: str, median_ms: float) -> CaseTiming:
    samples = [median_ms] * 10
    return CaseTiming(case=case, passed=True, stats=summarize(samples), samples_ms=samples, launches=10,
                      achieved_gbps=100.0, achieved_tflops=2.0, roofline_fraction=0.4)


def _report(**medians_ms: float) -> VendorReport:
    cases = [_timing(name, ms) for name, ms in medians_ms.items()]
    return VendorReport(name="cuBLAS", library="cublas", available=True,
                        timing=TimingReport(passed=True, cases=cases, score_ms=1.0))


def test_summary_and_describe_views():
    summary = vendor_summary(_report(square=0.01, rect=0.02), {"square": 0.05, "rect": 0.04})
    assert summary["name"] == "cuBLAS" and summary["available"] and summary["notes"] == []
    assert summary["cases"]["square"]["median_ms"] == pytest.approx(0.01)
    assert summary["cases"]["square"]["baseline_speedup_vs_vendor"] == pytest.approx(0.2)
    assert summary["cases"]["rect"]["roofline_fraction"] == 0.4
    assert summary["score_ms"] == pytest.approx((0.01 * 0.02) ** 0.5)
    assert describe_view(summary) == {"name": "cuBLAS", "cases": {"square": pytest.approx(0.01),
                                                                   "rect": pytest.approx(0.02)}}
    assert vendor_summary(None, {}) is None and describe_view(None) is None


def test_check_prints_the_vendor_table_and_each_kernel_against_it():
    target = Target("initial", "", None, timing=TimingReport(passed=True, cases=[_timing("square", 0.05)]))
    out = io.StringIO()
    print_vendor(_report(square=0.01), [target, Target("reference", "", None)], out)
    lines = out.getvalue().splitlines()
    assert lines[1].startswith("== cuBLAS (vendor baseline")
    assert "roof %" in lines[2] and lines[3].startswith("square") and lines[3].split()[1] == "10.00"
    assert lines[3].split()[-1] == "40.0"
    assert lines[4].strip().startswith("initial vs cuBLAS: square 0.20x; geometric mean 0.20x")
    assert len(lines) == 5  # the untimed reference gets no ratio
    out = io.StringIO()
    print_vendor(VendorReport(name="cuBLAS", library="cublas", available=False, notes=["not here"]), [target], out)
    assert out.getvalue().splitlines()[1:] == ["== cuBLAS (vendor baseline: timed and checked like a kernel, never a verdict)",
                                               "   note: not here"]


@pytest.mark.anyio
async def test_a_run_keeps_cublas_beside_the_baseline(tmp_path):
    run = new_run(MATMUL, tmp_path / "results", RunSettings(), executor())
    performance = [c.name for c in run.task.performance_cases]
    try:
        for name in performance:
            assert run.summary.vendor["cases"][name]["median_ms"] == pytest.approx(0.02)
            assert run.summary.vendor["cases"][name]["baseline_speedup_vs_vendor"] == pytest.approx(0.2, rel=0.02)
        assert run.history[0].vendor["available"] and run.history[0].vendor["timing"]["passed"]
        async with client(run) as c:
            described = await ok(c, "describe_task")
        assert described["vendor"] == {"name": "cuBLAS", "cases": {name: pytest.approx(0.02) for name in performance}}
        assert described["device"]["peaks"]["memory_gbps"] == 4300.0
    finally:
        run.close()


@pytest.mark.anyio
async def test_a_run_without_cublas_says_so_and_goes_on(tmp_path):
    fake = executor()
    fake.vendor_latency_us = None
    run = new_run(MATMUL, tmp_path / "results", RunSettings(), fake)
    try:
        assert run.summary.vendor["available"] is False and "not available" in run.summary.vendor["notes"][0]
        async with client(run) as c:
            assert (await ok(c, "describe_task"))["vendor"] is None
    finally:
        run.close()


@pytest.mark.anyio
async def test_time_kernel_and_record_attempt_state_the_roofline_fraction(tmp_path):
    run = new_run(MATMUL, tmp_path / "results", RunSettings(), executor())
    try:
        async with client(run) as c:
            timed = await ok(c, "time_kernel", source=kernel("latency_us=50"))
            recorded = await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="half the time")
        for answer in (timed, recorded):
            for row in answer["cases"]:
                assert row["roofline_ms"] == pytest.approx(0.01)
                assert row["roofline_fraction"] == pytest.approx(0.01 / row["stats"]["median_ms"])
                assert 0.19 < row["roofline_fraction"] < 0.21
    finally:
        run.close()


# -- the ctypes layer, against a stand-in libcublas built here ----------------------------------------
FAKE_CUBLAS_C = r"""
#include <stdint.h>
static long long seen[19];
static float scales[2];
int cublasCreate_v2(void** handle) { *handle = (void*)0x1234; return 0; }
int cublasSetStream_v2(void* handle, void* stream) { seen[0] = (long long)stream; return handle ? 0 : 1; }
int cublasGemmEx(void* h, int ta, int tb, int m, int n, int k, const float* alpha, const void* a, int at, int lda,
                 const void* b, int bt, int ldb, const float* beta, void* c, int ct, int ldc, int compute, int algo) {
    long long v[19] = {(long long)h, ta, tb, m, n, k, 0, (long long)a, at, lda, (long long)b, bt, ldb, 0,
                       (long long)c, ct, ldc, compute, algo};
    for (int i = 1; i < 19; ++i) seen[i] = v[i];
    scales[0] = *alpha; scales[1] = *beta;
    return m > 0 ? 0 : 7;  /* CUBLAS_STATUS_INVALID_VALUE */
}
long long fake_seen(int i) { return seen[i]; }
float fake_scale(int i) { return scales[i]; }
"""


@pytest.fixture
def fake_cublas(tmp_path, monkeypatch):
    import ctypes
    import shutil
    import subprocess

    from harness.worker_side import cublas as vendor

    if shutil.which("gcc") is None:
        pytest.skip("no C compiler to build the stand-in libcublas")
    (tmp_path / "fake.c").write_text(FAKE_CUBLAS_C)
    library = tmp_path / "libcublas.so.13"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(tmp_path / "fake.c")], check=True)
    monkeypatch.setattr(vendor, "_library_path", lambda: str(library))
    lib = ctypes.CDLL(str(library))
    lib.fake_seen.restype, lib.fake_scale.restype = ctypes.c_longlong, ctypes.c_float
    return lib


def test_the_worker_passes_the_parents_arguments_to_cublas_gemm_ex(fake_cublas):
    from cuda.bindings import driver

    from harness.worker_side.cublas import Cublas

    library = Cublas(driver.CUstream(0xBEEF))
    assert fake_cublas.fake_seen(0) == 0xBEEF  # cublasSetStream_v2 got the worker's stream
    task = load_task(MATMUL_BF16)
    call = gemm_call(task, task.case("odd-67x45x83"))
    library.gemm(call, {"a": 0xA000, "b": 0xB000, "c": 0xC000})
    seen = [fake_cublas.fake_seen(i) for i in range(1, 19)]
    assert seen == [0, 0, 45, 67, 83, 0, 0xB000, 14, 45, 0xA000, 14, 83, 0, 0xC000, 0, 45, 68, -1]
    assert (fake_cublas.fake_scale(0), fake_cublas.fake_scale(1)) == (1.0, 0.0)


def test_a_failed_cublas_status_is_a_named_cuda_error(fake_cublas):
    from cuda.bindings import driver

    from harness.worker_side.cuda_check import CudaError
    from harness.worker_side.cublas import Cublas

    library = Cublas(driver.CUstream(1))
    with pytest.raises(CudaError) as info:
        library.gemm(dict(gemm_call(load_task(MATMUL), load_task(MATMUL).cases[0]), m=0), {"a": 1, "b": 2, "c": 3})
    assert (info.value.call, info.value.name, info.value.code) == ("cublasGemmEx", "CUBLAS_STATUS_INVALID_VALUE", 7)


def test_a_library_that_does_not_load_is_unavailable_once_and_for_all(monkeypatch):
    from harness.worker_side import cublas as vendor
    from harness.worker_side.job import JobFailed

    attempts = []

    def missing():
        attempts.append(1)
        raise OSError("libcublas.so.13: cannot open shared object file")

    monkeypatch.setattr(vendor, "_library_path", missing)
    monkeypatch.setattr(vendor, "_state", {"cublas": None, "failure": None})
    context = type("Context", (), {"stream": 1})()
    for _ in range(2):
        with pytest.raises(JobFailed) as info:
            vendor.cublas(context)
        assert (info.value.status, info.value.error) == ("unavailable", "CUBLAS_UNAVAILABLE")
        assert "cannot open shared object file" in info.value.detail
    assert attempts == [1]
