"""What a kernel source may #include (harness/worker_side/include_policy.py), and the one-line answer for a
header NVRTC does not have: real NVRTC, in-process (no GPU needed)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness.compile_service import CompileService
from harness.worker_side.compile_policy import MAX_SOURCE_BYTES, CompileRefused
from harness.worker_side.include_policy import ADVICE, check_includes
from harness.worker_side.nvrtc import compile_kernel

REPO = Path(__file__).resolve().parent.parent
KERNEL = 'extern "C" __global__ void scale(float* x, float f) { x[threadIdx.x] *= f; }\n'
# What a compile worker's #include showed of itself before its confinement was narrowed (issue 20).
WORKER_FILES = ["/proc/self/environ", "/proc/self/maps", "/proc/self/mounts", "/proc/self/cmdline",
                "/etc/os-release", "/etc/ld.so.cache"]

# Every spelling of an include of `{path}` the preprocessor accepts, and what the refusal says.
SPELLINGS = [
    ('#include "{path}"\n', "absolute path"),
    ("#include <{path}>\n", "absolute path"),
    ('  #  include_next "{path}"\n', "absolute path"),
    ('#/* a comment */include/**/"{path}"\n', "absolute path"),
    ('#include /*\n*/ "{path}"\n', "absolute path"),
    ('#inc\\\nlude "{path}"\n', "absolute path"),
    ('%:include "{path}"\n', "absolute path"),
    ('??=include "{path}"\n', "absolute path"),
    ('#embed "{path}"\n', "absolute path"),
    ('#if __has_include("{path}")\n#endif\n', "absolute path"),
    ("#if defined(__has_include) && __has_include(<{path}>)\n#endif\n", "absolute path"),
    ('#define FILE "{path}"\n#include FILE\n', "not written out"),
    ("#define STR(x) #x\n#include STR({path})\n", "not written out"),
    ('#define HAS __has_include\n#if HAS("{path}")\n#endif\n', "not written out"),
    ('#include "../../../../../..{path}"\n', "'..'"),
    ('#include <cuda/std/{dots}../../../../../..{path}>\n', "'..'"),
    ('#include "{path}\n', "not closed"),
    ('#include <cuda/../../../../../..{path}>\n', "'..'"),
]


@pytest.mark.parametrize("path", WORKER_FILES)
def test_an_include_of_a_worker_file_is_refused_before_any_worker_starts(path):
    with CompileService(confine=False) as service:
        with pytest.raises(CompileRefused, match="absolute path") as refused:
            service.compile(f'#include "{path}"\n' + KERNEL, "scale")
        assert service.worker.starts == 0
    assert path in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("spelling, why", SPELLINGS, ids=[s for s, _ in SPELLINGS])
def test_every_spelling_of_an_include_outside_the_headers_is_refused(spelling, why):
    with pytest.raises(CompileRefused, match=why):
        check_includes(spelling.format(path="/proc/self/environ", dots="./" * 1000) + KERNEL)


ACCEPTED = [
    "#include <cuda_fp16.h>\n#include \"cuda_bf16.h\"\n#include <cuda/std/cstdint>\n",
    "#ifdef __has_include\n#if defined(__has_include) && __has_include(<cuda_fp16.h>)\n#endif\n#endif\n",
    'const char* text = "#include \\"/etc/passwd\\"";\n// #include "/etc/passwd"\n/* #include </etc/passwd> */\n',
    'const char* raw = R"x(\n#include "/etc/passwd"\n)x";\n',
    "__device__ int big = 1'000'000; // \"\n#include <mma.h>\n",
    'extern "C" __global__ void say() { printf("__has_include(/etc/passwd)\\n"); }\n',
]


@pytest.mark.parametrize("source", ACCEPTED)
def test_sources_that_only_mention_a_path_are_accepted(source):
    check_includes(source + KERNEL)


@pytest.mark.parametrize("piece", ['R"(', 'R"abcdefghijklmnop(', "/*", '"', "defined(__has_include) ",
                                   "#include <cuda_fp16.h>\n", "#if __has_include(<mma.h>)\n#endif\n"])
def test_the_check_takes_linear_time_on_a_source_of_the_largest_size(piece):
    source = piece * (MAX_SOURCE_BYTES // len(piece))
    started = time.perf_counter()
    check_includes(source)
    assert time.perf_counter() - started < 2.0


def test_every_shipped_kernel_passes_the_include_check():
    kernels = [*REPO.glob("cases/*/*.cu"), *REPO.glob("server/demo_kernels/*.cu")]
    assert len(kernels) >= 10
    for path in kernels:
        check_includes(path.read_text())


# ---------------------------------------------------------------- headers an agent commonly writes

# Headers that must compile as they are.
COMPILING = ["cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h", "mma.h", "cooperative_groups.h", "math_constants.h",
             "cuda/std/cstdint", "cuda/std/limits", "cuda/std/type_traits", "cuda/std/cmath", "cuda/std/array"]
# Headers NVRTC may lack: a compile must work, or fail with the advice as the log's first line.
ADVISED = ["cstdio", "stdio.h", "cstdint", "stdint.h", "cmath", "math.h", "cstdlib", "stdlib.h", "cstring",
           "string.h", "cstddef", "climits", "cfloat", "cassert", "assert.h", "algorithm", "vector", "iostream",
           "cuda.h"]


@pytest.mark.parametrize("header", COMPILING)
def test_a_cuda_header_compiles(header):
    result = compile_kernel(f"#include <{header}>\n" + KERNEL, "scale")
    assert result.ok, result.log


@pytest.mark.parametrize("header", ADVISED)
def test_a_header_nvrtc_lacks_gets_one_line_saying_what_to_write(header):
    result = compile_kernel(f"#include <{header}>\n" + KERNEL, "scale")
    assert result.ok or result.log.splitlines()[0] == f"<{header}> is not available under NVRTC: {ADVICE[header]}"


@pytest.mark.parametrize("header, expected", [
    ("type_traits", "write #include <cuda/std/type_traits> and use cuda::std::"),
    ("cute/tensor.hpp", "the include path holds only the CUDA runtime headers and CCCL"),
    ("thrust/device_vector.h", "Thrust is a host library"),
])
def test_other_missing_headers_get_one_line_too(header, expected):
    result = compile_kernel(f"#include <{header}>\n" + KERNEL, "scale")
    assert not result.ok
    assert expected in result.log.splitlines()[0] and "NVRTC" in result.log.splitlines()[0]


# What each piece of advice says to write, compiled: the advice is right.
AS_ADVISED = {
    "printf is built in": 'printf("%f\\n", x[0]);',
    "write #include <cuda/std/cstdint>": "int32_t a = 1; uint64_t b = 2; x[0] = a + b;",
    "the CUDA math functions": "x[0] = sqrtf(x[0]) + expf(x[1]) + fmaxf(x[0], x[1]) + isnan(x[2]) + CUDART_INF_F;",
    "device malloc, free and abs": "float* p = (float*)malloc(4); free(p); x[0] = abs(-3);",
    "memcpy and memset": "memcpy(x, x + 4, 8); memset(x, 0, 4);",
    "size_t is built in": "size_t n = 3; cuda::std::ptrdiff_t d = 1; x[0] = n + d;",
    "write #include <cuda/std/climits>": "x[0] = INT_MAX + CHAR_BIT;",
    "cuda::std::numeric_limits<float>::max()": "x[0] = cuda::std::numeric_limits<float>::max();",
    "assert is built in": "assert(x[0] > 0);",
    "min and max are built in": "x[0] = max(x[1], x[2]) + min(1, 2);",
}
PRELUDE = ("#include <cuda/std/cstdint>\n#include <cuda/std/cstddef>\n#include <cuda/std/climits>\n"
           "#include <cuda/std/limits>\n#include <math_constants.h>\n")


@pytest.mark.parametrize("advice", AS_ADVISED)
def test_the_advice_compiles(advice):
    assert any(advice in text for text in ADVICE.values())
    body = AS_ADVISED[advice]
    result = compile_kernel(PRELUDE + f'extern "C" __global__ void scale(float* x, float f) {{ {body} }}\n', "scale")
    assert result.ok, result.log
