"""Compile one CUDA kernel to CUBIN with NVRTC, under the option policy of compile_policy.py.

Compiler failures are returned as data (ok=False with the log); only a refused request or a broken
NVRTC install raises. Runs in the compile worker and in the GPU worker (the referee's own kernels).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import resource
import time
from typing import Sequence

# NVRTC 13.0 answers repeated compiles from the user's ~/.nv/ComputeCache with an empty program
# log, which loses the ptxas resource report and makes compile times meaningless. The referee keeps
# its own cache (CompileCache), so the shared one is turned off before NVRTC is loaded.
os.environ["CUDA_CACHE_DISABLE"] = "1"

from cuda import pathfinder  # noqa: E402
from cuda.bindings import nvrtc  # noqa: E402

from harness.worker_side.compile_policy import (DEFAULT_ARCH, CompileRequest, CompileResult, arch_specific_option,
                                                cache_key, check_arch, check_kernel_name, check_options, check_source,
                                                out_of_memory_message, parse_ptxas_report, target_arch, trim_log,
                                                without_arch_options)
from harness.worker_side.cuda_check import check
from harness.worker_side.include_policy import check_includes, missing_header_advice
from harness.worker_side import sass_mix


# ---------------------------------------------------------------- NVRTC

@functools.cache
def nvrtc_version() -> str:
    """The loaded NVRTC's version, e.g. '13.5'."""
    major, minor = check(nvrtc.nvrtcVersion(), "nvrtcVersion")
    return f"{major}.{minor}"


@functools.cache
def supported_archs() -> tuple[str, ...]:
    """The real architectures the loaded NVRTC compiles for (nvrtcGetSupportedArchs), e.g. ('sm_75', 'sm_90')."""
    return tuple(f"sm_{number}" for number in check(nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs"))


@functools.cache
def include_folders() -> tuple[str, ...]:
    """The CUDA runtime and CCCL header folders, the only include path a compile gets."""
    found = []
    for library in ("cudart", "cccl"):
        try:
            folder = pathfinder.find_nvidia_header_directory(library)
        except Exception:
            # A missing header set only matters to sources that include it,
            # and their compile error says so.
            folder = None
        if folder:
            found.append(folder)
    return tuple(found)


# Files whose contents name a header set's version (CUDART_VERSION, CCCL_VERSION), where an include folder has them.
_VERSION_HEADERS = ("cuda_runtime_api.h", "cuda/std/__cccl/version.h")


@functools.cache
def toolchain_identity() -> str:
    """What a compile result depends on besides its request, for the cache key: each include folder with its
    version headers' contents, the NVRTC library's file and size (nvrtcVersion says only major.minor, and
    the headers come from another package than NVRTC: either may be updated alone), and what the compile worker's
    instruction mix is read with (nvdisasm's version, sass_mix's rules). A file that cannot be read is named as
    such, so the parent and the compile worker (which reads it once, before its confinement narrows) agree."""
    parts = [_file_identity(lib) for lib in _nvrtc_library()]
    for folder in include_folders():
        parts.append(folder)
        parts += [_file_identity(os.path.join(folder, name), digest=True) for name in _VERSION_HEADERS]
    parts += [_disassembler_version(), _file_identity(sass_mix.__file__, digest=True)]
    return json.dumps(parts)


def _disassembler_version() -> str:
    try:
        return f"nvdisasm {sass_mix.nvdisasm_version()}"
    except Exception:  # not installed: the compile worker then fails at start, and nothing is cached
        return "nvdisasm absent"


def _nvrtc_library() -> tuple[str, ...]:
    try:
        return (pathfinder.load_nvidia_dynamic_lib("nvrtc").abs_path,)
    except Exception:  # a library NVRTC's bindings found another way: its version still keys the entry
        return ()


def _file_identity(path: str, digest: bool = False) -> str:
    # No dates: a file reinstalled unchanged while a server runs must not set a restarted worker's keys apart.
    try:
        identity = f"{path}:{os.stat(path).st_size}"
        if digest:
            with open(path, "rb") as stream:
                identity += ":" + hashlib.sha256(stream.read()).hexdigest()
        return identity
    except OSError:
        return f"{path}:absent"


def _include_options() -> tuple[str, ...]:
    return tuple(f"-I{folder}" for folder in include_folders())


def _nvrtc_options(user_options: tuple[str, ...], target: str) -> list[bytes]:
    """NVRTC's options: the referee's own -arch (the target, which a candidate's -arch=sm_XYa chose), then the
    candidate's other options."""
    options = [f"-arch={target}", "--ptxas-options=-v"]
    if not any(o.lstrip("-").startswith("std=") for o in user_options):
        options.append("-std=c++17")
    options += _include_options()
    options += without_arch_options(user_options)
    return [o.encode() for o in options]


def _read_output(program, what: str) -> bytes:
    """The program's log ('ProgramLog') or CUBIN ('CUBIN') via NVRTC's size/get pair."""
    size_call, get_call = f"nvrtcGet{what}Size", f"nvrtcGet{what}"
    buffer = b" " * check(getattr(nvrtc, size_call)(program), size_call)
    check(getattr(nvrtc, get_call)(program, buffer), get_call)
    return bytes(buffer)


def _lowered_name(program, kernel_name: str) -> str | None:
    status, name = nvrtc.nvrtcGetLoweredName(program, kernel_name.encode())
    if status != nvrtc.nvrtcResult.NVRTC_SUCCESS or not name:
        return None
    return name.decode() if isinstance(name, bytes) else str(name)


def _only_name_errors(log: str) -> bool:
    # NVRTC reports an unresolvable name expression as an error in a
    # synthetic file "__nv_name_map"; if that is the only failing place,
    # the source itself is fine and the name is what is wrong.
    places = re.findall(r"^(.*?)\(\d+\): error", log, flags=re.MULTILINE)
    return bool(places) and all(p == "__nv_name_map" for p in places)


def _run_nvrtc(source: bytes, kernel_name: str, options: list[bytes]):
    """Compile; return (status, log, lowered name, cubin). The program is always destroyed."""
    program = check(nvrtc.nvrtcCreateProgram(source, b"kernel.cu", 0, [], []),
                    "nvrtcCreateProgram")
    try:
        check(nvrtc.nvrtcAddNameExpression(program, kernel_name.encode()),
              "nvrtcAddNameExpression")
        (status,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        log = _read_output(program, "ProgramLog").decode(errors="replace").rstrip("\x00").strip()
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return status, log, None, b""
        return status, log, _lowered_name(program, kernel_name), _read_output(program, "CUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def _failure_log(status, log: str, kernel_name: str) -> str:
    not_found = (f"kernel '{kernel_name}' not found in the source: it must name one "
                 f"__global__ function (a template instance needs its arguments, "
                 f"e.g. '{kernel_name}<float>')")
    if status == nvrtc.nvrtcResult.NVRTC_SUCCESS or _only_name_errors(log):
        return f"{not_found}\n{log}".strip()
    if _out_of_memory(status, log):
        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        return f"{out_of_memory_message(None if limit == resource.RLIM_INFINITY else limit)}\n{log}".strip()
    if status != nvrtc.nvrtcResult.NVRTC_ERROR_COMPILATION:
        return f"{log}\nnvrtcCompileProgram failed: {status.name}".strip()
    # What to write instead of a header NVRTC does not have, ahead of the log so the trimmed log shows it.
    return "\n".join(missing_header_advice(log, include_folders()) + _arch_specific_advice(log) + [log])


def _arch_specific_advice(log: str) -> list[str]:
    """An instruction the plain target lacks (wgmma, setmaxnreg on sm_90): say how to ask for the other."""
    found = re.search(r"not supported on \.target '(sm_\d+)'", log)
    if found is None:
        return []
    return [f"{found.group(1)} lacks an instruction this source uses; the device's architecture-specific target "
            f"may have it: compile with the option {arch_specific_option(found.group(1))}"]


def _out_of_memory(status, log: str) -> bool:
    # The front end reports "catastrophic error: out of memory" and returns; NVRTC itself may say so by status.
    return (status == nvrtc.nvrtcResult.NVRTC_ERROR_OUT_OF_MEMORY
            or re.search(r"^\S.*: catastrophic error: out of memory\s*$", log, flags=re.MULTILINE) is not None)


# ---------------------------------------------------------------- entry point


def check_request(source: str, kernel_name: str, options: Sequence[str] = (),
                  arch: str = DEFAULT_ARCH, toolchain: str | None = None) -> CompileRequest:
    """Every policy check, made before anything compiles (here or in a compile worker). `arch`: the device's.
    `toolchain`: the identity the cache key is made with (the parent's, sent with the job: the cache is the
    parent's, and a confined worker may see its files differently); None, this process's own."""
    check_arch(arch)
    user_options = check_options(options, arch)
    check_kernel_name(kernel_name)
    source_bytes = check_source(source)
    check_includes(source)
    version = nvrtc_version()
    target = target_arch(user_options, arch)
    toolchain = toolchain if toolchain is not None else toolchain_identity()
    return CompileRequest(source_bytes, kernel_name, user_options, arch, version,
                          cache_key(source_bytes, user_options, target, kernel_name, version, toolchain), target,
                          toolchain)


def compile_kernel(source: str, kernel_name: str, *, options: Sequence[str] = (),
                   arch: str = DEFAULT_ARCH, cache=None, toolchain: str | None = None) -> CompileResult:
    """Compile `kernel_name` in `source` to a CUBIN for `arch` (or its architecture-specific target, sm_90a,
    where the options ask for it with -arch=sm_90a).

    Raises CompileRefused for requests refused by policy; a compiler error is
    returned as ok=False with the log. `cache`: where successful compiles are kept and found
    (harness/compile_cache.py's CompileCache), or None.
    """
    request = check_request(source, kernel_name, options, arch, toolchain)
    user_options, source_bytes, version, key = request.options, request.source_bytes, request.nvrtc_version, request.key
    if cache is not None and (hit := cache.get(key)) is not None:
        return hit.model_copy(update={"cache_hit": True})

    started = time.perf_counter()
    status, log, lowered, cubin = _run_nvrtc(
        source_bytes, kernel_name, _nvrtc_options(user_options, request.target))
    compile_ms = (time.perf_counter() - started) * 1000.0
    ok = lowered is not None and bool(cubin)
    full_log = log if ok else _failure_log(status, log, kernel_name)
    result = CompileResult(
        ok=ok, kernel_name=kernel_name, lowered_name=lowered, arch=request.target,
        options=user_options, log=trim_log(full_log), full_log=full_log,
        resources=parse_ptxas_report(log, lowered) if ok else None,
        compile_ms=compile_ms, cache_hit=False, nvrtc_version=version,
        cubin=cubin if ok else b"", key=key,
    )
    if cache is not None and ok:
        cache.put(result)
    return result
