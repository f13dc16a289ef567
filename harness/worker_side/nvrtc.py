"""Compile one CUDA kernel to CUBIN with NVRTC, with a strict option policy.

The referee picks the architecture and the ptxas flags itself: candidates may
only choose options that change code generation in ways that are comparable
across attempts. Compiler failures are returned as data (ok=False with the
log); only a refused request or a broken NVRTC install raises.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

# NVRTC 13.0 answers repeated compiles from the user's ~/.nv/ComputeCache with an empty program
# log, which loses the ptxas resource report and makes compile times meaningless. The referee keeps
# its own cache (CompileCache), so the shared one is turned off before NVRTC is loaded.
os.environ["CUDA_CACHE_DISABLE"] = "1"

from cuda.bindings import nvrtc  # noqa: E402
from pydantic import BaseModel, ConfigDict, Field

from harness.worker_side.cuda_check import check

__all__ = [
    "MAX_SOURCE_BYTES", "CompileRefused", "ResourceUsage", "CompileResult",
    "CompileCache", "check_options", "compile_kernel", "nvrtc_version",
    "parse_ptxas_report", "arch_for", "trim_log",
]

MAX_SOURCE_BYTES = 256 * 1024
MAX_OPTIONS = 32
MAX_OPTION_CHARS = 200
MAX_KERNEL_NAME_CHARS = 512
LOG_MAX_LINES = 60
LOG_MAX_CHARS = 4000
LOG_MAX_LINE_CHARS = 400
# Bumped whenever the meaning of a cached entry changes.
_CACHE_FORMAT = "kernel-referee-compile-v1"


class CompileRefused(ValueError):
    """The request is refused before compiling (bad option, oversized source)."""


class ResourceUsage(BaseModel):
    model_config = ConfigDict(frozen=True)

    registers: int | None
    spill_store_bytes: int
    spill_load_bytes: int
    shared_bytes: int
    stack_bytes: int
    barriers: int | None
    constant_bytes: int | None


class CompileResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    ok: bool
    kernel_name: str
    lowered_name: str | None
    arch: str
    options: tuple[str, ...]
    log: str
    full_log: str
    resources: ResourceUsage | None
    compile_ms: float
    cache_hit: bool
    nvrtc_version: str
    cubin: bytes = Field(default=b"", exclude=True, repr=False)
    key: str


# ---------------------------------------------------------------- options

_ALLOWED_HELP = (
    "-std=c++11|c++14|c++17|c++20, -lineinfo, --use_fast_math, -default-device, "
    "-maxrregcount=N (1..255), -DNAME or -DNAME=VALUE, --fmad=true|false, "
    "-ftz=true|false, -prec-div=true|false, -prec-sqrt=true|false, "
    "--extra-device-vectorization"
)

_ALLOWED = re.compile(
    r"--?std=c\+\+(11|14|17|20)|-lineinfo|--generate-line-info|--?use_fast_math"
    r"|-default-device|--?(fmad|ftz|prec-div|prec-sqrt)=(true|false)"
    r"|--?extra-device-vectorization")

# (prefixes, why) for options that are understood but deliberately refused.
_REFUSED = [
    (("-rdc", "--relocatable-device-code"),
     "relocatable device code enables dynamic parallelism, whose child launches "
     "escape the timing events"),
    (("-I", "--include-path", "-include", "--pre-include"),
     "arbitrary include paths and pre-includes are not allowed; the CUDA headers "
     "(cuda_fp16.h, cuda_bf16.h, CUB/libcu++) are already on the include path"),
    (("-arch", "--gpu-architecture", "-gencode", "--generate-code", "-code"),
     "the referee picks the architecture of the device that runs the kernel"),
    (("-G", "--device-debug"),
     "debug builds are not comparable with optimized ones"),
    (("-dlto", "--dlink-time-opt", "-dc", "--device-c", "-dw", "--device-w"),
     "separate compilation and link-time optimization are not supported: the "
     "referee loads one self-contained CUBIN"),
    (("-Xptxas", "--ptxas-options", "-Xnvvm"),
     "backend flags are set by the referee"),
    (("-O",),
     "NVRTC has no -O levels; it optimizes fully by default"),
]

_DEFINE = re.compile(r"-D([A-Za-z_][A-Za-z0-9_]*)(=[A-Za-z0-9_.+\-]*)?")
_MAXRREG = re.compile(r"--?maxrregcount=(\d+)")
_ARCH = re.compile(r"sm_\d+[a-z]?")


def check_options(options: Sequence[str]) -> tuple[str, ...]:
    """Validate candidate options against the allow-list; return them as a tuple."""
    if isinstance(options, (str, bytes)):
        raise CompileRefused("options must be a list of strings, not a single string")
    options = tuple(options)
    if len(options) > MAX_OPTIONS:
        raise CompileRefused(f"too many options ({len(options)}); at most {MAX_OPTIONS}")
    for option in options:
        _check_option(option)
    return options


def _check_option(option: object) -> None:
    if not isinstance(option, str):
        raise CompileRefused(f"option {option!r} is not a string")
    if len(option) > MAX_OPTION_CHARS:
        raise CompileRefused(
            f"option {option[:40]!r}... is {len(option)} characters; at most {MAX_OPTION_CHARS}")
    if _ALLOWED.fullmatch(option):
        return
    if option.startswith("-D"):
        if not _DEFINE.fullmatch(option):
            raise CompileRefused(
                f"option {option!r} is not a valid macro definition: use -DNAME or "
                "-DNAME=VALUE, NAME a C identifier and VALUE made of [A-Za-z0-9_.+-]")
        return
    if m := _MAXRREG.fullmatch(option):
        if not 1 <= int(m.group(1)) <= 255:
            raise CompileRefused(f"option {option!r}: the register count must be 1..255")
        return
    for prefixes, why in _REFUSED:
        if option.startswith(prefixes):
            raise CompileRefused(f"option {option!r} is refused: {why}")
    raise CompileRefused(f"unknown option {option!r}; allowed: {_ALLOWED_HELP}")


def arch_for(major: int, minor: int) -> str:
    """The NVRTC architecture name for a compute capability, e.g. (9, 0) -> 'sm_90'."""
    if int(major) < 1 or int(minor) < 0 or int(minor) > 9:
        raise ValueError(f"not a compute capability: ({major}, {minor})")
    return f"sm_{int(major)}{int(minor)}"


def _check_arch(arch: str) -> None:
    # Only real architectures produce a CUBIN; compute_XX would yield PTX.
    if not isinstance(arch, str) or not _ARCH.fullmatch(arch):
        raise CompileRefused(f"architecture {arch!r} is not of the form sm_XX (e.g. sm_90)")


def _check_source(source: str) -> bytes:
    if not isinstance(source, str):
        raise CompileRefused("the source must be text")
    try:
        data = source.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CompileRefused(f"the source is not valid UTF-8 text: {exc.reason}") from None
    if len(data) > MAX_SOURCE_BYTES:
        raise CompileRefused(
            f"the source is {len(data)} bytes; at most {MAX_SOURCE_BYTES}: "
            "trim unused code or tables")
    if b"\x00" in data:
        raise CompileRefused("the source contains a NUL byte; remove it")
    return data


def _check_kernel_name(kernel_name: str) -> None:
    # The name is spliced into a generated #pragma line, so control
    # characters (a newline above all) must not get through.
    if not isinstance(kernel_name, str) or not kernel_name.strip():
        raise CompileRefused("the kernel name must be a non-empty string")
    if len(kernel_name) > MAX_KERNEL_NAME_CHARS:
        raise CompileRefused(f"the kernel name is longer than {MAX_KERNEL_NAME_CHARS} characters")
    if not kernel_name.isascii() or any(not c.isprintable() for c in kernel_name):
        raise CompileRefused(f"the kernel name {kernel_name!r} has non-printable or non-ASCII characters")


# ---------------------------------------------------------------- logs and reports

def trim_log(log: str) -> str:
    """First LOG_MAX_LINES lines / LOG_MAX_CHARS characters, with a marker for the rest."""
    lines = log.splitlines()
    kept: list[str] = []
    used = 0
    for line in lines:
        if len(line) > LOG_MAX_LINE_CHARS:
            line = line[:LOG_MAX_LINE_CHARS] + " [...]"
        if len(kept) >= LOG_MAX_LINES or used + len(line) + 1 > LOG_MAX_CHARS:
            break
        kept.append(line)
        used += len(line) + 1
    hidden = len(lines) - len(kept)
    if hidden:
        kept.append(f"... {hidden} more lines")
    return "\n".join(kept)


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"\bUsed (\d+) registers")


def parse_ptxas_report(log: str, lowered_name: str) -> ResourceUsage | None:
    """Resource usage of the entry `lowered_name` from a `ptxas -v` report, or None."""
    entries: set[str] = set()
    frames: dict[str, re.Match] = {}
    used: dict[str, str] = {}
    entry = properties_of = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry = m.group(1)
            entries.add(entry)
        elif m := _PROPERTIES.search(line):
            properties_of = m.group(1)
        elif (m := _FRAME.search(line)) and properties_of is not None:
            frames.setdefault(properties_of, m)
            properties_of = None
        elif _USED.search(line) and entry is not None:
            used.setdefault(entry, line)
    if lowered_name not in entries:
        return None
    return _usage_from(frames.get(lowered_name), used.get(lowered_name))


def _usage_from(frame: re.Match | None, used_line: str | None) -> ResourceUsage:
    used_line = used_line or ""

    def number(pattern: str) -> int | None:
        m = re.search(pattern, used_line)
        return int(m.group(1)) if m else None

    cmem = [int(v) for v in re.findall(r"(\d+) bytes cmem\[\d+\]", used_line)]
    stack_frame = int(frame.group(1)) if frame else 0
    # The cumulative figure includes callee frames, which is what a launch reserves.
    cumulative = number(r"(\d+) bytes cumulative stack size") or 0
    return ResourceUsage(
        registers=number(r"\bUsed (\d+) registers"),
        spill_store_bytes=int(frame.group(2)) if frame else 0,
        spill_load_bytes=int(frame.group(3)) if frame else 0,
        shared_bytes=number(r"(\d+) bytes smem") or 0,
        stack_bytes=max(stack_frame, cumulative),
        barriers=number(r"used (\d+) barriers"),
        constant_bytes=sum(cmem) if cmem else None,
    )


# ---------------------------------------------------------------- NVRTC

@functools.cache
def nvrtc_version() -> str:
    """The loaded NVRTC's version, e.g. '13.5'."""
    major, minor = check(nvrtc.nvrtcVersion(), "nvrtcVersion")
    return f"{major}.{minor}"


@functools.cache
def _include_options() -> tuple[str, ...]:
    from cuda import pathfinder

    found = []
    for library in ("cudart", "cccl"):
        try:
            folder = pathfinder.find_nvidia_header_directory(library)
        except Exception:
            # A missing header set only matters to sources that include it,
            # and their compile error says so.
            folder = None
        if folder:
            found.append(f"-I{folder}")
    return tuple(found)


def _nvrtc_options(user_options: tuple[str, ...], arch: str) -> list[bytes]:
    options = [f"-arch={arch}", "--ptxas-options=-v"]
    if not any(o.lstrip("-").startswith("std=") for o in user_options):
        options.append("-std=c++17")
    options += _include_options()
    options += user_options
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
    if status != nvrtc.nvrtcResult.NVRTC_ERROR_COMPILATION:
        return f"{log}\nnvrtcCompileProgram failed: {status.name}".strip()
    return log


# ---------------------------------------------------------------- entry point

def cache_key(source: bytes, options: tuple[str, ...], arch: str,
              kernel_name: str, version: str) -> str:
    """sha256 over everything that determines the CUBIN."""
    header = json.dumps([_CACHE_FORMAT, list(options), arch, kernel_name, version])
    return hashlib.sha256(header.encode() + b"\x00" + source).hexdigest()


@dataclass(frozen=True)
class CompileRequest:
    """A request that passed every policy check, with its cache key."""

    source_bytes: bytes
    kernel_name: str
    options: tuple[str, ...]
    arch: str
    nvrtc_version: str
    key: str


def check_request(source: str, kernel_name: str, options: Sequence[str] = (), arch: str = "sm_90") -> CompileRequest:
    """Every policy check, made before anything compiles (here or in a compile worker)."""
    user_options = check_options(options)
    _check_arch(arch)
    _check_kernel_name(kernel_name)
    source_bytes = _check_source(source)
    version = nvrtc_version()
    return CompileRequest(source_bytes, kernel_name, user_options, arch, version,
                          cache_key(source_bytes, user_options, arch, kernel_name, version))


def compile_kernel(source: str, kernel_name: str, *, options: Sequence[str] = (),
                   arch: str = "sm_90", cache: CompileCache | None = None) -> CompileResult:
    """Compile `kernel_name` in `source` to a CUBIN for `arch`.

    Raises CompileRefused for requests refused by policy; a compiler error is
    returned as ok=False with the log.
    """
    request = check_request(source, kernel_name, options, arch)
    user_options, source_bytes, version, key = request.options, request.source_bytes, request.nvrtc_version, request.key
    if cache is not None and (hit := cache.get(key)) is not None:
        return hit.model_copy(update={"cache_hit": True})

    started = time.perf_counter()
    status, log, lowered, cubin = _run_nvrtc(
        source_bytes, kernel_name, _nvrtc_options(user_options, arch))
    compile_ms = (time.perf_counter() - started) * 1000.0
    ok = lowered is not None and bool(cubin)
    full_log = log if ok else _failure_log(status, log, kernel_name)
    result = CompileResult(
        ok=ok, kernel_name=kernel_name, lowered_name=lowered, arch=arch,
        options=user_options, log=trim_log(full_log), full_log=full_log,
        resources=parse_ptxas_report(log, lowered) if ok else None,
        compile_ms=compile_ms, cache_hit=False, nvrtc_version=version,
        cubin=cubin if ok else b"", key=key,
    )
    if cache is not None and ok:
        cache.put(result)
    return result


# ---------------------------------------------------------------- cache

_KEY = re.compile(r"[0-9a-f]{64}")


class CompileCache:
    """Thread-safe LRU of successful compiles, optionally mirrored to a folder.

    The folder holds <key>.cubin and <key>.json; the json is written last,
    so its presence marks a complete entry.
    """

    def __init__(self, max_entries: int = 256, folder: str | os.PathLike | None = None) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self.folder = Path(folder) if folder is not None else None
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
        self._entries: OrderedDict[str, CompileResult] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def get(self, key: str) -> CompileResult | None:
        """The stored result for `key` (memory first, then the folder), or None."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        found = self._load(key)
        if found is not None:
            self._remember(found)
        return found

    def put(self, result: CompileResult) -> None:
        self._remember(result)
        if self.folder is not None and _KEY.fullmatch(result.key):
            self._store(result)

    def _remember(self, result: CompileResult) -> None:
        with self._lock:
            self._entries[result.key] = result
            self._entries.move_to_end(result.key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def _load(self, key: str) -> CompileResult | None:
        if self.folder is None or not _KEY.fullmatch(key):
            return None
        try:
            text = (self.folder / f"{key}.json").read_text(encoding="utf-8")
            cubin = (self.folder / f"{key}.cubin").read_bytes()
            result = CompileResult.model_validate_json(text)
        except (OSError, ValueError):
            # A missing or damaged entry is just a miss; it is rewritten later.
            return None
        if result.key != key or not cubin:
            return None
        return result.model_copy(update={"cubin": cubin})

    def _store(self, result: CompileResult) -> None:
        assert self.folder is not None
        _write_atomic(self.folder / f"{result.key}.cubin", result.cubin)
        _write_atomic(self.folder / f"{result.key}.json", result.model_dump_json().encode())


def _write_atomic(path: Path, data: bytes) -> None:
    # Readers in other threads or processes must never see a partial file.
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
