"""harness.worker_side.device_state against CUBINs from the real NVRTC (no GPU needed)."""

from __future__ import annotations

import functools
import random
import struct

import pytest

from harness.worker_side.nvrtc import compile_kernel
from harness.worker_side.device_state import (DeviceVariable, NotACubin, WritableSection, _is_constant_bank,
                                              constant_sections, imported_symbols, writable_sections)

I32 = struct.Struct("<i")


@functools.lru_cache(maxsize=None)
def cubin(source: str, *options: str) -> bytes:
    result = compile_kernel(source, "k", options=options, arch="sm_90")
    assert result.ok, result.log
    return result.cubin


def only(sections: list[WritableSection], name: str) -> WritableSection:
    assert [s.name for s in sections] == [name]
    return sections[0]


def names(section: WritableSection) -> list[str]:
    return [name for name, _ in section.anchors]


ZERO_COUNTER = r"""
__device__ int counter;
extern "C" __global__ void k(int* o) { o[0] = atomicAdd(&counter, 1); }
"""

MIXED = r"""
__device__ int counter; __device__ int inited = 5;
static __device__ int hz; static __device__ int hi = 3;
__device__ int unused_v = 9;
extern "C" __global__ void k(int* o) { o[0] = counter++ + inited++ + hz++ + hi++; }
"""

POINTER = r"""
__device__ int target[4] = {1, 2, 3, 4};
__device__ int* p = &target[2];
extern "C" __global__ void k(int* o) { o[0] = *p; p = o; }
"""


# ---------------------------------------------------------------- what NVRTC emits

def test_zero_initialised_variable_is_a_nobits_global_section():
    section = only(writable_sections(cubin(ZERO_COUNTER)), ".nv.global")
    assert section.size == 4 and section.initial is None
    assert section.anchors == (("counter", 0),)
    assert section.variables == (DeviceVariable("counter", 0, 4, None, local=True, managed=False),)


def test_initialised_table_carries_its_image():
    source = r"""
    __device__ float table[1000] = {1.0f};
    extern "C" __global__ void k(float* o, int i) { table[threadIdx.x] += 1.0f; o[0] = table[i]; }
    """
    section = only(writable_sections(cubin(source)), ".nv.global.init")
    expected = struct.pack("<f", 1.0) + bytes(3996)
    assert section.size == 4000 and section.initial == expected
    assert section.anchors == (("table", 0),)
    assert section.variables[0].initial == expected


def test_static_variable_is_listed_with_its_plain_name():
    source = r"""
    static __device__ int hidden;
    extern "C" __global__ void k(int* o) { o[0] = hidden++; }
    """
    section = only(writable_sections(cubin(source)), ".nv.global")
    assert section.anchors == (("hidden", 0),) and section.variables[0].local


def test_anonymous_namespace_variable_has_an_internal_mangled_name():
    source = r"""
    namespace { __device__ int anon_v = 7; }
    extern "C" __global__ void k(int* o) { o[0] = anon_v++; }
    """
    section = only(writable_sections(cubin(source)), ".nv.global.init")
    (name, offset), = section.anchors
    assert offset == 0 and name.startswith("_ZN") and "_GLOBAL__N_" in name and name.endswith("6anon_vE")
    assert section.initial == I32.pack(7)


def test_namespace_variable_is_mangled():
    source = r"""
    namespace memo { __device__ long long cache[16] = {1, 2, 3}; }
    extern "C" __global__ void k(long long* o, int i) { o[0] = memo::cache[i]++; }
    """
    section = only(writable_sections(cubin(source)), ".nv.global.init")
    assert section.anchors == (("_ZN4memo5cacheE", 0),)
    assert section.size == 128 and section.initial == struct.pack("<3q", 1, 2, 3) + bytes(104)


def test_function_local_static_is_mangled():
    source = r"""extern "C" __global__ void k(int* o) { static __device__ int calls; o[0] = calls++; }"""
    section = only(writable_sections(cubin(source)), ".nv.global")
    assert section.anchors == (("_ZZ1kE5calls", 0),)


def test_constant_and_shared_memory_are_not_listed():
    source = r"""
    __constant__ float coef[4] = {1, 2, 3, 4};
    __device__ int counter;
    extern "C" __global__ void k(float* o) {
        __shared__ float s[64];
        s[threadIdx.x] = o[threadIdx.x] * coef[threadIdx.x & 3];
        __syncthreads();
        o[threadIdx.x] = s[63 - threadIdx.x] + counter++;
    }
    """
    binary = cubin(source)
    assert b".nv.constant3" in binary and b".nv.shared.k" in binary  # they exist, and are skipped
    section = only(writable_sections(binary), ".nv.global")
    assert names(section) == ["counter"]


def test_constant_only_kernel_has_no_writable_sections():
    source = r"""
    __constant__ float coef[4] = {1, 2, 3, 4};
    extern "C" __global__ void k(float* o, int i) { o[0] = coef[i]; }
    """
    assert writable_sections(cubin(source)) == []


def test_kernel_without_globals_has_no_writable_sections():
    source = r"""extern "C" __global__ void k(int* o) { __shared__ int s[32]; s[threadIdx.x] = 1; o[0] = s[0]; }"""
    assert writable_sections(cubin(source)) == []


def test_managed_variables_are_listed_and_marked():
    source = r"""
    __device__ int a1 = 1; __managed__ int m = 7; __device__ int z1; __managed__ int mz;
    extern "C" __global__ void k(int* o) { o[0] = m++ + a1 + z1++ + mz++; }
    """
    init, zero = writable_sections(cubin(source))
    assert (init.name, zero.name) == (".nv.global.init", ".nv.global")
    assert [(v.name, v.managed, v.initial) for v in init.variables] == [
        ("a1", False, I32.pack(1)), ("m", True, I32.pack(7))]
    assert [(v.name, v.managed, v.initial) for v in zero.variables] == [("z1", False, None), ("mz", True, None)]


def test_default_device_globals_are_listed():
    source = r"""int plain_v = 11; extern "C" __global__ void k(int* o) { o[0] = plain_v++; }"""
    section = only(writable_sections(cubin(source, "-default-device")), ".nv.global.init")
    assert section.anchors == (("plain_v", 0),) and section.initial == I32.pack(11)


def test_mixed_variables_split_by_initialisation_and_sorted_by_offset():
    init, zero = writable_sections(cubin(MIXED))
    assert init.name == ".nv.global.init" and init.size == 12 and init.initial == struct.pack("<3i", 9, 5, 3)
    assert init.anchors == (("unused_v", 0), ("inited", 4), ("hi", 8))  # unused ones are kept
    assert zero.name == ".nv.global" and zero.size == 8 and zero.initial is None
    assert zero.anchors == (("counter", 0), ("hz", 4))
    assert all(v.local and not v.managed and not v.relocated for v in init.variables + zero.variables)
    assert [v.initial for v in init.variables] == [I32.pack(9), I32.pack(5), I32.pack(3)]


def test_pointer_initialiser_is_a_relocated_offset():
    section = only(writable_sections(cubin(POINTER)), ".nv.global.init")
    p, target = section.variables
    assert (p.name, p.offset, p.size, p.relocated) == ("p", 0, 8, (0,))
    assert p.initial == bytes(8)  # the loader writes &target[2] there
    assert (target.name, target.offset, target.relocated) == ("target", 8, ())
    assert target.initial == struct.pack("<4i", 1, 2, 3, 4)


def test_accepts_bytearray_and_memoryview():
    binary = cubin(MIXED)
    assert writable_sections(bytearray(binary)) == writable_sections(memoryview(binary)) == writable_sections(binary)


# ---------------------------------------------------------------- edited CUBINs

def symbol_entry(binary: bytes, name: str) -> int:
    """File offset of the Elf64_Sym called `name`."""
    from harness.worker_side.device_state import _sections  # the test edits bytes the parser already located
    sections = _sections(binary)
    symtab = next(s for s in sections if s.type == 2)
    strtab = sections[symtab.link]
    for at in range(symtab.offset, symtab.offset + symtab.size, 24):
        start = strtab.offset + struct.unpack_from("<I", binary, at)[0]
        if binary[start:binary.index(b"\0", start)] == name.encode():
            return at
    raise AssertionError(f"no symbol {name}")


def test_global_binding_symbols_come_first():
    binary = bytearray(cubin(MIXED))
    at = symbol_entry(binary, "hi")
    binary[at + 4] = (1 << 4) | (binary[at + 4] & 0xF)  # STB_GLOBAL
    init, _ = writable_sections(bytes(binary))
    assert init.anchors == (("hi", 8), ("unused_v", 0), ("inited", 4))
    assert not init.variables[0].local and init.variables[1].local


def test_section_without_symbols_is_listed_with_no_anchors():
    binary = bytearray(cubin(ZERO_COUNTER))
    struct.pack_into("<H", binary, symbol_entry(binary, "counter") + 6, 0)  # st_shndx = SHN_UNDEF
    section = only(writable_sections(bytes(binary)), ".nv.global")
    assert section.size == 4 and section.anchors == () and section.variables == ()


def test_symbol_past_its_section_is_refused():
    binary = bytearray(cubin(ZERO_COUNTER))
    struct.pack_into("<Q", binary, symbol_entry(binary, "counter") + 16, 8)  # st_size 8 > section size 4
    with pytest.raises(NotACubin, match="past the end"):
        writable_sections(bytes(binary))


# ---------------------------------------------------------------- malformed input

@pytest.mark.parametrize("data", [
    b"", b"\x7fELF", b"\x7fELF" + bytes(60), b"MZ" + bytes(200),
    b"\x7fELF\x01\x01" + bytes(58),  # ELF32
    b"\x7fELF\x02\x02" + bytes(58),  # big-endian
])
def test_not_a_cubin(data):
    with pytest.raises(NotACubin):
        writable_sections(data)


def test_not_bytes():
    with pytest.raises(NotACubin):
        writable_sections("\x7fELF")  # type: ignore[arg-type]
    assert issubclass(NotACubin, ValueError)


def outcome(data: bytes) -> str:
    """'ok' or 'refused'; any other exception fails the test."""
    try:
        result = writable_sections(data)
    except NotACubin:
        return "refused"
    assert isinstance(result, list) and all(isinstance(s, WritableSection) for s in result)
    return "ok"


def test_truncations_are_refused_cleanly():
    binary = cubin(MIXED)
    full = writable_sections(binary)
    # Past the section header table come only program headers, which the parser does not read.
    headers_end = struct.unpack_from("<Q", binary, 0x28)[0] + 64 * struct.unpack_from("<H", binary, 0x3C)[0]
    assert 0 < headers_end <= len(binary)
    assert {outcome(binary[:n]) for n in range(headers_end)} == {"refused"}
    assert all(writable_sections(binary[:n]) == full for n in range(headers_end, len(binary), 16))


def test_byte_flips_never_crash():
    binary = cubin(POINTER)
    rng = random.Random(1234)
    head = 0x40
    shoff = struct.unpack_from("<Q", binary, 0x28)[0]
    hot = list(range(head)) + list(range(shoff, len(binary)))  # ELF header, section headers
    results = set()
    for trial in range(600):
        data = bytearray(binary)
        spots = hot if trial % 2 else range(len(binary))
        for _ in range(rng.randint(1, 4)):
            data[rng.choice(spots)] = rng.randrange(256)
        results.add(outcome(bytes(data)))
    assert "refused" in results


def test_hostile_sizes_and_offsets_are_refused():
    binary = bytearray(cubin(MIXED))
    struct.pack_into("<Q", binary, 0x28, 2**63)  # e_shoff far past the end
    with pytest.raises(NotACubin):
        writable_sections(bytes(binary))
    binary = bytearray(cubin(MIXED))
    struct.pack_into("<H", binary, 0x3C, 0xFFFF)  # e_shnum beyond the file
    with pytest.raises(NotACubin):
        writable_sections(bytes(binary))


# ---------------------------------------------------------------- constant banks (writable through cvta.const)

CONSTANTS = r"""
__constant__ unsigned char tag = 1;
__constant__ unsigned int counter = 7;
__constant__ int table[3] = {4, 5, 6};
__device__ int target;
__constant__ int* where = &target;
extern "C" __global__ void k(int* o, int i) { o[0] = tag + counter + table[i] + *where; }
"""


def test_constant_bank_is_listed_whole_with_its_variables():
    bank, = constant_sections(cubin(CONSTANTS))
    assert bank.name == ".nv.constant3" and bank.size == 32
    by_name = {v.name: v for v in bank.variables}
    assert {n: (v.offset, v.size) for n, v in by_name.items()} == {
        "tag": (0, 1), "counter": (4, 4), "table": (8, 12), "where": (24, 8)}
    assert by_name["counter"].initial == struct.pack("<I", 7) and by_name["table"].initial == struct.pack("<3i", 4, 5, 6)
    assert bank.initial[:8] == b"\x01\0\0\0" + struct.pack("<I", 7)  # the padding after `tag` is in the image
    assert by_name["where"].relocated == (0,) and by_name["where"].initial == bytes(8)  # patched at load
    assert not any(v.managed for v in bank.variables)


def test_zero_initialised_constant_is_an_image_of_zeros():
    source = r"""
    __constant__ unsigned int count;
    extern "C" __global__ void k(unsigned int* o) { o[0] = count; }
    """
    bank, = constant_sections(cubin(source))
    assert bank.variables == (DeviceVariable("count", 0, 4, bytes(4), local=True, managed=False),)


def test_banks_without_variables_are_not_listed():
    # The compiler's literals (.nv.constant2.k), the loader's addresses (.nv.constant4) and the parameters
    # (.nv.constant0.k) hold no variable: no name locates them and no PTX name reaches them.
    source = r"""
    __device__ int dv = 5;
    extern "C" __global__ void k(double* o, int i) {
        double x = o[i];
        switch (i) { case 0: x *= 1.2345678901; break; case 1: x += 3.14159265358979; break;
                     case 2: x = sin(x); break; case 3: x = 7.77777777; break; }
        o[0] = x + dv;
    }
    """
    binary = cubin(source)
    assert b".nv.constant4" in binary and b".nv.constant0.k" in binary
    assert constant_sections(binary) == []
    assert constant_sections(cubin(ZERO_COUNTER)) == []


def test_every_module_wide_bank_is_read_and_per_kernel_ones_are_not():
    assert [s.name for s in constant_sections(cubin(CONSTANTS))] == [".nv.constant3"]
    assert _is_constant_bank(".nv.constant3") and _is_constant_bank(".nv.constant12")
    assert not _is_constant_bank(".nv.constant0.k") and not _is_constant_bank(".nv.constant2.k")


def test_a_constant_symbol_past_its_bank_is_refused():
    binary = bytearray(cubin(CONSTANTS))
    struct.pack_into("<Q", binary, symbol_entry(binary, "where") + 16, 64)  # st_size 64 > what is left of 32
    with pytest.raises(NotACubin, match="past the end"):
        constant_sections(bytes(binary))


def test_imported_symbols_are_the_routines_the_loader_resolves():
    source = r"""extern "C" __global__ void k(float* o, int i) { float* p = (float*)malloc(8); o[0] = p[0]; free(p); }"""
    assert {"malloc", "free"} <= set(imported_symbols(cubin(source)))
    assert not {"malloc", "free"} & set(imported_symbols(cubin(CONSTANTS)))
    with pytest.raises(NotACubin):
        imported_symbols(b"MZ")
