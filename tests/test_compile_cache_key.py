"""What a cached CUBIN is keyed by (compile_policy.cache_key): a request that differs from a cached one in any
of what makes its CUBIN (target, options, source, kernel name, NVRTC, headers, the result's own fields) is a
miss, through the real NVRTC and the real CompileCache, in memory and on disk."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from harness.compile_cache import CompileCache
from harness.compile_service import CompileService
from harness.worker_side import compile_policy, nvrtc, sass_mix
from harness.worker_side.compile_policy import CompileResult, cache_key, schema_digest
from harness.worker_side.nvrtc import compile_kernel
from sandbox.confine import unavailable_reason

CONFINE = unavailable_reason() is None

SCALE = r"""
extern "C" __global__ void scale(float* x) { x[threadIdx.x] *= FACTOR; }
extern "C" __global__ void shift(float* x) { x[threadIdx.x] += FACTOR; }
"""

# 48 values live at once: about 60 registers uncapped, spills under -maxrregcount=32.
HEAVY = r"""
extern "C" __global__ void heavy(const float* x, float* y) {
    float a[48];
    #pragma unroll
    for (int i = 0; i < 48; ++i) a[i] = x[threadIdx.x + i * 32];
    float s = 0;
    #pragma unroll
    for (int i = 0; i < 48; ++i) s += a[i] * a[47 - i] * a[(i * 7) % 48];
    y[threadIdx.x] = s;
}
"""


def _elf_sm(cubin: bytes) -> int:
    """The SM number a CUBIN's ELF header names: e_flags' second byte from ABI version 8 on, its first before."""
    assert cubin[:4] == b"\x7fELF" and cubin[4] == 2  # a 64-bit ELF
    flags = struct.unpack_from("<I", cubin, 48)[0]
    return (flags >> 8) & 0xFF if cubin[8] >= 8 else flags & 0xFF


def test_a_cubin_built_for_one_architecture_is_never_served_for_another(tmp_path):
    """Through the compile worker and a cache on disk: sm_80's entry is there when sm_90 is asked for."""
    with CompileService(confine=CONFINE, cache=CompileCache(folder=tmp_path)) as service:
        older = service.compile(SCALE, "scale", ["-DFACTOR=2.0f"], "sm_80")
        assert older.ok and not older.cache_hit and older.arch == "sm_80"
    with CompileService(confine=CONFINE, cache=CompileCache(folder=tmp_path)) as service:
        again = service.compile(SCALE, "scale", ["-DFACTOR=2.0f"], "sm_80")
        assert again.cache_hit and again.cubin == older.cubin  # the entry is served where it applies
        assert again.mix is not None and again.mix == older.mix  # with the instruction mix the worker read
        newer = service.compile(SCALE, "scale", ["-DFACTOR=2.0f"], "sm_90")
    assert newer.ok and not newer.cache_hit and newer.arch == "sm_90"
    assert newer.key != older.key
    assert (_elf_sm(older.cubin), _elf_sm(newer.cubin)) == (80, 90)
    assert len(list(tmp_path.glob("*.cubin"))) == 2


# (what differs, the cached request's arguments, the new request's): each must be a miss with its own CUBIN.
_DIFFERENT = [
    ("arch", dict(arch="sm_80"), dict(arch="sm_90")),
    ("architecture-specific target", dict(), dict(options=["-DFACTOR=2.0f", "-arch=sm_90a"])),
    ("a -D value", dict(), dict(options=["-DFACTOR=3.0f"])),
    ("-maxrregcount", dict(), dict(options=["-DFACTOR=2.0f", "-maxrregcount=16"])),
    ("a math option", dict(), dict(options=["-DFACTOR=2.0f", "--use_fast_math"])),
    ("the order of definitions", dict(options=["-DFACTOR=2.0f", "-DFACTOR=3.0f"]),
     dict(options=["-DFACTOR=3.0f", "-DFACTOR=2.0f"])),
    ("kernel name", dict(), dict(kernel_name="shift")),
    ("source", dict(), dict(source=SCALE.replace("*=", "-="))),
]


def _request(**changes) -> dict:
    request = dict(source=SCALE, kernel_name="scale", options=["-DFACTOR=2.0f"], arch="sm_90")
    request.update(changes)
    return request


def _compile(cache: CompileCache, request: dict) -> CompileResult:
    request = dict(request)
    return compile_kernel(request.pop("source"), request.pop("kernel_name"), cache=cache, **request)


@pytest.mark.parametrize("what, cached, asked", _DIFFERENT, ids=[d[0] for d in _DIFFERENT])
def test_a_request_that_differs_in_what_makes_the_cubin_is_a_miss(what, cached, asked):
    cache = CompileCache()
    first = _compile(cache, _request(**cached))
    assert first.ok, first.log
    assert _compile(cache, _request(**cached)).cache_hit  # the same request is served
    second = _compile(cache, _request(**asked))
    assert second.ok, second.log
    assert not second.cache_hit and second.key != first.key
    fresh = _compile(CompileCache(), _request(**asked))
    assert second.cubin == fresh.cubin and second.resources == fresh.resources  # its own result, not the first's


def test_maxrregcount_changes_what_is_cached():
    """The register cap is seen in the result that is kept: a miss gets its own register count."""
    source = HEAVY
    cache = CompileCache()
    free = compile_kernel(source, "heavy", cache=cache)
    capped = compile_kernel(source, "heavy", options=["-maxrregcount=32"], cache=cache)
    assert not capped.cache_hit
    assert free.resources.registers > 32 >= capped.resources.registers
    assert free.resources.spill_store_bytes == 0 < capped.resources.spill_store_bytes


@pytest.mark.parametrize("component", ["nvrtc_version", "toolchain_identity"])
def test_another_nvrtc_or_header_set_is_a_miss(monkeypatch, component):
    """A CUBIN from an NVRTC or headers since updated is compiled again (both are read in the process that checks
    the request, here this one)."""
    cache = CompileCache()
    first = _compile(cache, _request())
    real = getattr(nvrtc, component)()
    monkeypatch.setattr(nvrtc, component, lambda: real + " (updated)")
    second = _compile(cache, _request())
    assert not second.cache_hit and second.key != first.key


def test_the_toolchain_identity_follows_the_headers_nvrtc_and_what_reads_the_mix(monkeypatch, tmp_path):
    folder = tmp_path / "include"
    (folder / "cuda/std/__cccl").mkdir(parents=True)
    library = tmp_path / "libnvrtc.so.13"
    library.write_bytes(b"\x7fELF" + bytes(64))
    monkeypatch.setattr(nvrtc, "include_folders", lambda: (str(folder),))
    monkeypatch.setattr(nvrtc, "_nvrtc_library", lambda: (str(library),))
    identity = nvrtc.toolchain_identity.__wrapped__  # uncached: each call reads the files again
    seen = [identity()]
    (folder / "cuda_runtime_api.h").write_text("#define CUDART_VERSION 13000\n")
    seen.append(identity())
    dated = (folder / "cuda_runtime_api.h").stat()
    (folder / "cuda_runtime_api.h").write_text("#define CUDART_VERSION 13010\n")
    os.utime(folder / "cuda_runtime_api.h", ns=(dated.st_atime_ns, dated.st_mtime_ns))  # only the contents tell
    seen.append(identity())
    (folder / "cuda/std/__cccl/version.h").write_text("#define CCCL_VERSION 3000001\n")
    seen.append(identity())
    library.write_bytes(b"\x7fELF" + bytes(128))  # a patch release: nvrtcVersion still says 13.5
    seen.append(identity())
    monkeypatch.setattr(sass_mix, "nvdisasm_version", lambda: "13.6.0")  # the mix is read by another nvdisasm
    seen.append(identity())
    rules = tmp_path / "sass_mix.py"
    rules.write_text(Path(sass_mix.__file__).read_text())
    monkeypatch.setattr(sass_mix, "__file__", str(rules))
    seen.append(identity())
    rules.write_text(rules.read_text().replace('"HFMA2.MMA"', '"HFMA2.MMX"'))  # other rules, of the same length
    seen.append(identity())
    assert len(set(seen)) == len(seen), seen
    assert identity() == seen[-1]  # and nothing else moves it


class _GrownResult(CompileResult):
    instruction_mix: dict[str, int] | None = None


def test_an_entry_stored_before_the_result_gained_a_field_is_a_miss(monkeypatch, tmp_path):
    """The cache stores whole results: once CompileResult has a new field, an entry on disk without it is compiled
    again rather than served with the field's default."""
    assert schema_digest(_GrownResult) != schema_digest(CompileResult)
    first = _compile(CompileCache(folder=tmp_path), _request())
    assert _compile(CompileCache(folder=tmp_path), _request()).cache_hit
    monkeypatch.setattr(compile_policy, "_RESULT_SCHEMA", schema_digest(_GrownResult))
    after = _compile(CompileCache(folder=tmp_path), _request())
    assert not after.cache_hit and after.key != first.key


def test_every_argument_and_the_entry_format_are_in_the_key(monkeypatch):
    base = dict(source=b"a", options=("-DX=1",), arch="sm_90", kernel_name="k", version="13.5", toolchain="t")
    keys = {cache_key(**base)}
    for name, other in [("source", b"b"), ("options", ("-DX=2",)), ("arch", "sm_90a"), ("kernel_name", "k2"),
                        ("version", "13.6"), ("toolchain", "t2")]:
        keys.add(cache_key(**{**base, name: other}))
    for constant in ("_CACHE_FORMAT", "_RESULT_SCHEMA"):
        with monkeypatch.context() as patch:
            patch.setattr(compile_policy, constant, getattr(compile_policy, constant) + "-next")
            keys.add(cache_key(**base))
    assert len(keys) == 9
    # Parts cannot run into one another: the options are a list, not one joined string.
    assert cache_key(**{**base, "options": ("-DX=1", "-lineinfo")}) != \
        cache_key(**{**base, "options": ("-DX=1 -lineinfo",)})


def test_the_stored_entry_holds_every_field_of_the_result(tmp_path):
    """What the folder keeps is the whole result (a field added later is stored too), and what it serves equals
    what was compiled but for cache_hit."""
    first = _compile(CompileCache(folder=tmp_path), _request())
    stored = json.loads((tmp_path / f"{first.key}.json").read_text())
    assert set(stored) == set(CompileResult.model_fields) - {"cubin"}
    served = _compile(CompileCache(folder=tmp_path), _request())
    assert served.model_copy(update={"cache_hit": False}) == first and served.cubin == first.cubin


def test_the_compile_service_never_serves_an_entry_without_the_instruction_mix():
    """A result compiled in-process (no disassembly, so no mix) and one from the compile worker share a key: the
    service compiles the first again rather than answer a kernel whose instructions were not read."""
    cache = CompileCache()
    in_process = _compile(cache, _request())
    assert in_process.ok and in_process.mix is None
    with CompileService(confine=CONFINE, cache=cache) as service:
        served = service.compile(SCALE, "scale", ["-DFACTOR=2.0f"], "sm_90")
        assert not served.cache_hit and served.mix is not None and served.mix.fp32 >= 1
        again = service.compile(SCALE, "scale", ["-DFACTOR=2.0f"], "sm_90")
    assert again.cache_hit and again.mix == served.mix  # the worker's result replaced the entry
