"""What a compile request may ask, and what a compile answers: the option policy, the limits, the
compile result and the ptxas report's parsing. Pure (no NVRTC): the parent checks a request with it
before any process starts, and the compile worker checks it again (nvrtc.py).

The referee picks the architecture and the ptxas flags itself: candidates may only choose options
that change code generation in ways that are comparable across attempts. The one architecture a
candidate may ask for is the device's own architecture-specific target (`-arch=sm_90a` on a 9.0
device), which enables instructions such as wgmma, TMA bulk copies and setmaxnreg that the plain
target lacks; the CUBIN still runs only on that device's architecture.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Sequence

from pydantic import BaseModel, ConfigDict, Field

from harness.worker_side.sass_mix import InstructionMix

MAX_SOURCE_BYTES = 256 * 1024
MAX_OPTIONS = 32
MAX_OPTION_CHARS = 200
MAX_KERNEL_NAME_CHARS = 512
LOG_MAX_LINES = 60
LOG_MAX_CHARS = 4000
LOG_MAX_LINE_CHARS = 400
# The compile worker's address-space limit (RLIMIT_AS). Measured with NVRTC 13.5 (docs/security.md):
# the worker holds about 0.21 GiB once NVRTC is loaded; a shipped task's kernel peaks at 0.22 GiB,
# the heaviest legitimate compiles tried (CUB block primitives with libcu++ and cooperative groups;
# a 32,768-FMA fully unrolled loop) at 0.62 GiB. 2 GiB is over three times that, and a template
# bomb growing at about 150 MB/s reaches it in seconds instead of running to the deadline.
COMPILE_MEMORY_BYTES = 2 << 30
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
    # The CUBIN's SASS instruction mix (harness/worker_side/sass_mix.py), from the compile worker; None where the
    # kernel was compiled in-process (the referee's own kernels in a GPU worker) or did not compile.
    mix: InstructionMix | None = None


def schema_digest(model: type[BaseModel]) -> str:
    """sha256 of a record's JSON schema: its fields, their types and defaults."""
    return hashlib.sha256(json.dumps(model.model_json_schema(), sort_keys=True).encode()).hexdigest()


# A cached entry is a stored CompileResult: one stored before the result gained a field (or changed one) must be
# a miss, not a result with the field's default.
_RESULT_SCHEMA = schema_digest(CompileResult)


# ---------------------------------------------------------------- options

_ALLOWED_HELP = (
    "-std=c++11|c++14|c++17|c++20, -lineinfo, --use_fast_math, -default-device, "
    "-maxrregcount=N (1..255), -DNAME or -DNAME=VALUE, --fmad=true|false, "
    "-ftz=true|false, -prec-div=true|false, -prec-sqrt=true|false, "
    "--extra-device-vectorization, -arch=sm_XYa (the device's own sm_XY, e.g. -arch=sm_90a on a 9.0 device)"
)

_ALLOWED = re.compile(
    r"--?std=c\+\+(11|14|17|20)|-lineinfo|--generate-line-info|--?use_fast_math"
    r"|-default-device|--?(fmad|ftz|prec-div|prec-sqrt)=(true|false)"
    r"|--?extra-device-vectorization")

_ARCH_PREFIXES = ("-arch", "--gpu-architecture", "-gencode", "--generate-code", "-code")

# (prefixes, why) for options that are understood but deliberately refused.
_REFUSED = [
    (("-rdc", "--relocatable-device-code"),
     "relocatable device code enables dynamic parallelism, whose child launches "
     "escape the timing events"),
    (("-I", "--include-path", "-include", "--pre-include"),
     "arbitrary include paths and pre-includes are not allowed; the CUDA headers "
     "(cuda_fp16.h, cuda_bf16.h, CUB/libcu++) are already on the include path"),
    (_ARCH_PREFIXES,
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
_ARCH_OPTION = re.compile(r"(?:-arch|--gpu-architecture)=(\S+)")
DEFAULT_ARCH = "sm_90"


def arch_specific(arch: str) -> str:
    """The architecture-specific target of a device's architecture: 'sm_90' -> 'sm_90a'."""
    return arch if arch.endswith("a") else f"{arch}a"


def arch_specific_option(arch: str) -> str:
    """The option by which a candidate asks for the device's architecture-specific target."""
    return f"-arch={arch_specific(arch)}"


def target_arch(options: Sequence[str], arch: str) -> str:
    """What NVRTC compiles for: `arch` (the device's), or its architecture-specific target when the checked
    options ask for it."""
    return arch_specific(arch) if any(_ARCH_OPTION.fullmatch(o) for o in options) else arch


def without_arch_options(options: Sequence[str]) -> tuple[str, ...]:
    """The options less the architecture request, which the referee turns into its own -arch."""
    return tuple(o for o in options if not _ARCH_OPTION.fullmatch(o))


def check_options(options: Sequence[str], arch: str | None = None) -> tuple[str, ...]:
    """Validate candidate options against the allow-list; return them as a tuple. `arch`: the device's
    architecture, whose architecture-specific target (`-arch=sm_90a` for sm_90) is then allowed."""
    if isinstance(options, (str, bytes)):
        raise CompileRefused("options must be a list of strings, not a single string")
    options = tuple(options)
    if len(options) > MAX_OPTIONS:
        raise CompileRefused(f"too many options ({len(options)}); at most {MAX_OPTIONS}")
    for option in options:
        _check_option(option, arch)
    return options


def _check_option(option: object, arch: str | None = None) -> None:
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
    if arch is not None and option.startswith(_ARCH_PREFIXES):
        if (m := _ARCH_OPTION.fullmatch(option)) and m.group(1) == arch_specific(arch):
            return
        raise CompileRefused(f"option {option!r} is refused: the referee compiles for this device ({arch}); the "
                             f"only architecture a candidate may ask for is its architecture-specific target, "
                             f"{arch_specific_option(arch)}")
    for prefixes, why in _REFUSED:
        if option.startswith(prefixes):
            raise CompileRefused(f"option {option!r} is refused: {why}")
    raise CompileRefused(f"unknown option {option!r}; allowed: {_ALLOWED_HELP}")


def arch_for(major: int, minor: int) -> str:
    """The NVRTC architecture name for a compute capability, e.g. (9, 0) -> 'sm_90'."""
    if int(major) < 1 or int(minor) < 0 or int(minor) > 9:
        raise ValueError(f"not a compute capability: ({major}, {minor})")
    return f"sm_{int(major)}{int(minor)}"


def check_arch(arch: str) -> None:
    # Only real architectures produce a CUBIN; compute_XX would yield PTX.
    if not isinstance(arch, str) or not _ARCH.fullmatch(arch):
        raise CompileRefused(f"architecture {arch!r} is not of the form sm_XX (e.g. sm_90)")


def check_source(source: str) -> bytes:
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


def check_kernel_name(kernel_name: str) -> None:
    # The name is spliced into a generated #pragma line, so control
    # characters (a newline above all) must not get through.
    if not isinstance(kernel_name, str) or not kernel_name.strip():
        raise CompileRefused("the kernel name must be a non-empty string")
    if len(kernel_name) > MAX_KERNEL_NAME_CHARS:
        raise CompileRefused(f"the kernel name is longer than {MAX_KERNEL_NAME_CHARS} characters")
    if not kernel_name.isascii() or any(not c.isprintable() for c in kernel_name):
        raise CompileRefused(f"the kernel name {kernel_name!r} has non-printable or non-ASCII characters")


# ---------------------------------------------------------------- logs and reports

def out_of_memory_message(limit_bytes: int | None) -> str:
    """The first line of a compile that hit the worker's memory limit (None: no limit was set)."""
    limit = f"its {limit_bytes / (1 << 30):g} GiB memory limit" if limit_bytes else "memory"
    return (f"the compiler ran out of {limit}: deep or wide template instantiation, large initialized "
            "or constexpr tables, or heavy unrolling can cause this")


def unreadable(why: str) -> str:
    """The log of a compile whose CUBIN the disassembler could not read (harness/worker_side/sass_mix.py): no
    result the referee can judge."""
    return f"the compiled kernel's instructions could not be read: {why}"


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


def cache_key(source: bytes, options: tuple[str, ...], arch: str,
              kernel_name: str, version: str, toolchain: str) -> str:
    """sha256 over everything that determines the CUBIN and the result kept with it: the entry's format (the
    result's fields included, so an entry written before a field was added is never served without it), the
    options in order, `arch` the target compiled for (sm_90 or sm_90a), the kernel's name, NVRTC's version,
    `toolchain` what else a compile reads (nvrtc.toolchain_identity: the header files and the NVRTC library),
    and the source."""
    header = json.dumps([_CACHE_FORMAT, _RESULT_SCHEMA, list(options), arch, kernel_name, version, toolchain])
    return hashlib.sha256(header.encode() + b"\x00" + source).hexdigest()


@dataclass(frozen=True)
class CompileRequest:
    """A request that passed every policy check, with its cache key. `arch` is the device's architecture,
    `target` what NVRTC compiles for (`arch`, or its architecture-specific target if the options ask)."""

    source_bytes: bytes
    kernel_name: str
    options: tuple[str, ...]
    arch: str
    nvrtc_version: str
    key: str
    target: str
    toolchain: str = ""  # what the key was made with besides the request (nvrtc.toolchain_identity)
