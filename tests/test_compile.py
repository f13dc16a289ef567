"""harness.worker_side.nvrtc and harness.worker_side.cuda_check against the real NVRTC (no GPU needed)."""

from __future__ import annotations

import pickle
import threading

import pytest
from cuda.bindings import driver, nvrtc

from harness.compile_cache import CompileCache
from harness.worker_side.compile_policy import (MAX_SOURCE_BYTES, CompileRefused, arch_for, check_options,
                                                parse_ptxas_report, trim_log)
from harness.worker_side.nvrtc import compile_kernel, nvrtc_version
from harness.worker_side.cuda_check import CudaError, check

ELF_MAGIC = b"\x7fELF"

SHARED_KERNEL = r"""
extern "C" __global__ void reverse256(float* x) {
    __shared__ float s[256];
    s[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    x[threadIdx.x] = s[255 - threadIdx.x];
}
"""

HALF_KERNEL = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void mix(const __half* a, const __nv_bfloat16* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __half2float(__hmul(a[i], a[i])) + __bfloat162float(b[i]);
}
"""

CPP_KERNEL = r"""
namespace ops {
template <typename T> __global__ void scale(T* x, T f) { x[threadIdx.x] *= f; }
template __global__ void scale<float>(float*, float);
}
__global__ void plain(int* x) { x[threadIdx.x] += 1; }
"""

LOCAL_ARRAY_KERNEL = r"""
extern "C" __global__ void gather(const float* x, float* out, int i) {
    float a[512];
    for (int j = 0; j < 512; ++j) a[j] = x[j * i];
    out[threadIdx.x] = a[i & 511];
}
"""

SYNTAX_ERROR = """extern "C" __global__ void broken(float* x) {
    x[0] = ;
}
"""

TWO_FUNCTION_REPORT = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z5firstPf' for 'sm_90'
ptxas info    : Function properties for _Z5firstPf
ptxas         .     16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers, 360 bytes cmem[0], 12 bytes cmem[2]
ptxas info    : Compile time = 1.000 ms
ptxas info    : Function properties for _Z6helperi
ptxas         .     64 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'second' for 'sm_90'
ptxas info    : Function properties for second
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 1 barriers, 2048 bytes smem
ptxas info    : Compile time = 2.000 ms
"""


@pytest.fixture(scope="module")
def shared_result():
    return compile_kernel(SHARED_KERNEL, "reverse256")


# ---------------------------------------------------------------- successful compiles

def test_extern_c_kernel_compiles_to_cubin(shared_result):
    r = shared_result
    assert r.ok, r.log
    assert r.cubin.startswith(ELF_MAGIC)
    assert r.lowered_name == "reverse256"
    assert r.arch == "sm_90"
    assert r.nvrtc_version == nvrtc_version()
    assert r.compile_ms > 0 and not r.cache_hit
    assert len(r.key) == 64


def test_resources_of_shared_kernel(shared_result):
    usage = shared_result.resources
    assert usage is not None
    assert usage.registers is not None and usage.registers > 0
    assert usage.shared_bytes == 1024
    assert usage.spill_store_bytes == 0 and usage.spill_load_bytes == 0
    assert usage.barriers == 1


def test_cubin_is_not_serialized(shared_result):
    dumped = shared_result.model_dump()
    assert "cubin" not in dumped
    assert "cubin" not in repr(shared_result)


def test_fp16_and_bf16_headers_are_available():
    r = compile_kernel(HALF_KERNEL, "mix")
    assert r.ok, r.log
    assert r.cubin.startswith(ELF_MAGIC)


def test_cpp_kernels_get_mangled_lowered_names():
    template = compile_kernel(CPP_KERNEL, "ops::scale<float>")
    assert template.ok, template.log
    assert template.lowered_name.startswith("_Z")
    assert "scale" in template.lowered_name
    assert template.resources is not None and template.resources.registers > 0
    plain = compile_kernel(CPP_KERNEL, "plain")
    assert plain.ok, plain.log
    assert plain.lowered_name == "_Z5plainPi"


def test_dynamically_indexed_local_array_uses_stack():
    r = compile_kernel(LOCAL_ARRAY_KERNEL, "gather")
    assert r.ok, r.log
    assert r.resources.stack_bytes > 0


def test_allowed_options_compile():
    options = ["-std=c++20", "-lineinfo", "--use_fast_math", "-maxrregcount=32",
               "-DBLOCK=256", "-DFAST", "--fmad=true", "-ftz=true",
               "-prec-div=false", "-prec-sqrt=false", "--extra-device-vectorization",
               "-default-device"]
    r = compile_kernel(SHARED_KERNEL, "reverse256", options=options)
    assert r.ok, r.log
    assert r.options == tuple(options)
    assert r.resources.registers <= 32


def test_define_reaches_the_source():
    source = "extern \"C\" __global__ void k(float* x) { x[0] = VALUE; }"
    assert compile_kernel(source, "k", options=["-DVALUE=1.5"]).ok
    assert not compile_kernel(source, "k").ok


def test_other_architecture():
    r = compile_kernel(SHARED_KERNEL, "reverse256", arch=arch_for(8, 0))
    assert r.ok, r.log
    assert r.arch == "sm_80"
    assert r.cubin.startswith(ELF_MAGIC)


# ---------------------------------------------------------------- failed compiles are data

def test_syntax_error_is_reported_not_raised():
    r = compile_kernel(SYNTAX_ERROR, "broken")
    assert not r.ok
    assert r.cubin == b"" and r.resources is None and r.lowered_name is None
    assert "kernel.cu(2): error: expected an expression" in r.log
    assert "x[0] = ;" in r.log


def test_missing_kernel_name_is_reported():
    r = compile_kernel(SHARED_KERNEL, "no_such_kernel")
    assert not r.ok
    assert r.log.startswith("kernel 'no_such_kernel' not found in the source")


def test_device_function_is_not_a_kernel():
    source = "__device__ float helper(float x) { return x * 2; }\n" + SHARED_KERNEL
    r = compile_kernel(source, "helper")
    assert not r.ok
    assert "kernel 'helper' not found in the source" in r.log


def test_nvrtc_option_error_is_reported_not_raised():
    r = compile_kernel(SHARED_KERNEL, "reverse256", arch="sm_999")
    assert not r.ok
    assert "NVRTC_ERROR_INVALID_OPTION" in r.log


def test_long_error_log_is_trimmed():
    source = "\n".join(f"__global__ void f{i}() {{ int x = ; }}" for i in range(80))
    r = compile_kernel(source, "f0")
    assert not r.ok
    assert "more lines" in r.log.splitlines()[-1]
    assert len(r.full_log) > len(r.log)
    assert len(r.log) < 4200


def test_trim_log_marker():
    log = "\n".join(f"line {i}" for i in range(100))
    trimmed = trim_log(log).splitlines()
    assert trimmed[:60] == [f"line {i}" for i in range(60)]
    assert trimmed[-1] == "... 40 more lines"
    assert trim_log("a\nb") == "a\nb"


def test_trim_log_bounds_characters():
    trimmed = trim_log("\n".join("x" * 300 for _ in range(50)))
    assert len(trimmed) <= 4000 + 40
    assert trimmed.endswith("more lines")


# ---------------------------------------------------------------- refusals

@pytest.mark.parametrize("option", [
    "-rdc=true", "--relocatable-device-code=true", "-I/x", "--include-path=/x",
    "-include=stdio.h", "--pre-include=x.h", "-arch=sm_80", "--gpu-architecture=sm_80",
    "-G", "--device-debug", "-dlto", "-dc", "-Xptxas=-O1", "--ptxas-options=-v",
    "--bogus", "-O3", "-maxrregcount=300", "-maxrregcount=0", "-DBAD NAME",
    "-D1X=2", "-DX=\"a\"", "-std=c++03",
])
def test_refused_option_is_named(option):
    with pytest.raises(CompileRefused) as info:
        compile_kernel(SHARED_KERNEL, "reverse256", options=[option])
    assert repr(option) in str(info.value)


@pytest.mark.parametrize("option, reason", [
    ("-rdc=true", "dynamic parallelism"),
    ("-I/x", "include"),
    ("-arch=sm_80", "architecture"),
    ("-G", "debug"),
    ("--bogus", "allowed: -std="),
])
def test_refusal_says_why(option, reason):
    with pytest.raises(CompileRefused, match=reason):
        check_options([option])


def test_option_count_and_length_limits():
    with pytest.raises(CompileRefused, match="too many"):
        check_options(["-lineinfo"] * 33)
    with pytest.raises(CompileRefused, match="characters"):
        check_options(["-DX=" + "1" * 300])
    with pytest.raises(CompileRefused, match="list of strings"):
        check_options("-lineinfo")


def test_oversized_source_refused():
    source = "// " + "x" * MAX_SOURCE_BYTES + "\n" + SHARED_KERNEL
    with pytest.raises(CompileRefused, match="bytes"):
        compile_kernel(source, "reverse256")


def test_nul_in_source_refused():
    with pytest.raises(CompileRefused, match="NUL"):
        compile_kernel(SHARED_KERNEL + "\x00", "reverse256")


@pytest.mark.parametrize("arch", ["compute_90", "sm90", "sm_", "90", ""])
def test_bad_architecture_refused(arch):
    with pytest.raises(CompileRefused, match="sm_XX"):
        compile_kernel(SHARED_KERNEL, "reverse256", arch=arch)


@pytest.mark.parametrize("name", ["", "k\n#include <x>", "k\x00"])
def test_bad_kernel_name_refused(name):
    with pytest.raises(CompileRefused):
        compile_kernel(SHARED_KERNEL, name)


def test_arch_for():
    assert arch_for(9, 0) == "sm_90"
    assert arch_for(12, 0) == "sm_120"
    with pytest.raises(ValueError):
        arch_for(9, 10)


# ---------------------------------------------------------------- ptxas report

def test_parse_report_picks_the_named_entry():
    first = parse_ptxas_report(TWO_FUNCTION_REPORT, "_Z5firstPf")
    assert (first.registers, first.stack_bytes) == (40, 16)
    assert (first.spill_store_bytes, first.spill_load_bytes) == (8, 4)
    assert (first.shared_bytes, first.barriers, first.constant_bytes) == (0, 0, 372)
    second = parse_ptxas_report(TWO_FUNCTION_REPORT, "second")
    assert (second.registers, second.shared_bytes, second.barriers) == (10, 2048, 1)
    assert second.stack_bytes == 0 and second.constant_bytes is None


def test_parse_report_ignores_non_entries_and_unknown_names():
    assert parse_ptxas_report(TWO_FUNCTION_REPORT, "_Z6helperi") is None
    assert parse_ptxas_report(TWO_FUNCTION_REPORT, "missing") is None
    assert parse_ptxas_report("", "second") is None


def test_parse_report_older_format_without_barriers():
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_80'\n"
           "ptxas info    : Function properties for k\n"
           "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : Used 12 registers, 4096 bytes smem, 368 bytes cmem[0]\n")
    usage = parse_ptxas_report(log, "k")
    assert (usage.registers, usage.shared_bytes, usage.constant_bytes) == (12, 4096, 368)
    assert usage.barriers is None


# ---------------------------------------------------------------- cache

def test_cache_hits_then_misses_on_new_options():
    cache = CompileCache(max_entries=4)
    first = compile_kernel(SHARED_KERNEL, "reverse256", cache=cache)
    again = compile_kernel(SHARED_KERNEL, "reverse256", cache=cache)
    assert not first.cache_hit and again.cache_hit
    assert again.key == first.key and again.cubin == first.cubin
    assert again.compile_ms == first.compile_ms
    other = compile_kernel(SHARED_KERNEL, "reverse256", options=["-lineinfo"], cache=cache)
    assert not other.cache_hit and other.key != first.key
    assert len(cache) == 2


def test_cache_skips_failures():
    cache = CompileCache()
    compile_kernel(SYNTAX_ERROR, "broken", cache=cache)
    assert not compile_kernel(SYNTAX_ERROR, "broken", cache=cache).cache_hit
    assert len(cache) == 0


def test_cache_evicts_least_recently_used(shared_result):
    cache = CompileCache(max_entries=2)
    results = [shared_result.model_copy(update={"key": f"{i:064x}"}) for i in range(3)]
    cache.put(results[0])
    cache.put(results[1])
    assert cache.get(results[0].key) is not None
    cache.put(results[2])
    assert cache.get(results[1].key) is None
    assert cache.get(results[0].key) is not None and len(cache) == 2


def test_disk_cache_survives_a_new_instance(tmp_path, shared_result):
    CompileCache(folder=tmp_path).put(shared_result)
    reloaded = CompileCache(folder=tmp_path).get(shared_result.key)
    assert reloaded is not None
    assert reloaded.cubin == shared_result.cubin
    assert reloaded.resources == shared_result.resources
    hit = compile_kernel(SHARED_KERNEL, "reverse256", cache=CompileCache(folder=tmp_path))
    assert hit.cache_hit and hit.cubin.startswith(ELF_MAGIC)


def test_disk_cache_treats_damage_as_a_miss(tmp_path, shared_result):
    CompileCache(folder=tmp_path).put(shared_result)
    (tmp_path / f"{shared_result.key}.json").write_text("{not json")
    assert CompileCache(folder=tmp_path).get(shared_result.key) is None
    assert CompileCache(folder=tmp_path).get("../etc/passwd") is None


def test_cache_is_thread_safe(shared_result):
    cache = CompileCache(max_entries=8)
    results = [shared_result.model_copy(update={"key": f"{i:064x}"}) for i in range(64)]

    def work(chunk):
        for r in chunk:
            cache.put(r)
            cache.get(results[0].key)

    threads = [threading.Thread(target=work, args=(results[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache) == 8


# ---------------------------------------------------------------- cuda_check

def test_check_unwraps_values():
    assert check((nvrtc.nvrtcResult.NVRTC_SUCCESS,), "x") is None
    assert check((nvrtc.nvrtcResult.NVRTC_SUCCESS, 7), "x") == 7
    assert check(nvrtc.nvrtcVersion(), "nvrtcVersion") == tuple(
        int(v) for v in nvrtc_version().split("."))


def test_check_names_nvrtc_failures():
    with pytest.raises(CudaError) as info:
        check((nvrtc.nvrtcResult.NVRTC_ERROR_COMPILATION,), "nvrtcCompileProgram")
    err = info.value
    assert (err.call, err.name) == ("nvrtcCompileProgram", "NVRTC_ERROR_COMPILATION")
    assert err.code == 6
    assert "nvrtcCompileProgram" in str(err)


def test_check_names_driver_failures_without_a_driver():
    with pytest.raises(CudaError) as info:
        check((driver.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS, None), "cuCtxSynchronize")
    assert info.value.name == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert info.value.code == int(driver.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS)


def test_cuda_error_pickles():
    err = CudaError("cuMemAlloc", 2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory")
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.call, copy.code, copy.name, str(copy)) == (
        err.call, err.code, err.name, str(err))
