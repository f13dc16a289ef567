"""Writable global data of a CUBIN, so the worker can restore it before every launch.

Rule: a section is writable global data when its name is ".nv.global" or starts with
".nv.global." and its flags hold SHF_WRITE|SHF_ALLOC; its image is its file bytes
(PROGBITS) or zeros (NOBITS). Each data symbol in it is one DeviceVariable.

Evidence, NVRTC 13.0 sm_90 whole-program (harness.worker_side.nvrtc refuses -rdc):
- zero-initialised `__device__` data (`static`, function-local `static`, `extern`,
  `__managed__` too) goes to ".nv.global", NOBITS, WA; initialised data (anonymous
  namespace, `__device__ const`, `-default-device` globals, a string literal behind a
  `__device__` pointer) to ".nv.global.init", PROGBITS, WA.
- `__shared__` goes to ".nv.shared.<kernel>" (NOBITS, WA): the name test drops it. No globals:
  neither global section exists.
- `__constant__` goes to ".nv.constant3" (A only, PROGBITS, zeros for zero-initialised ones), with
  a LOCAL symbol per variable; pointer initialisers are relocated there as in ".nv.global.init".
  Not writable by its flags, but a kernel can take a variable's generic address (PTX `cvta.const`)
  and store through it: constant_sections() lists the sections that hold such variables. The other
  constant sections hold no variable and no PTX name reaches them: ".nv.constant0.<kernel>" (the
  launch's parameters, written by the driver at every launch), ".nv.constant2.<kernel>" (the
  compiler's literals) and ".nv.constant4" (addresses the loader patches in).
- a call to a driver routine (malloc, free, vprintf, __assertfail, __cuda_syscall_aligned_malloc)
  is an undefined GLOBAL symbol (st_shndx 0) the loader resolves: imported_symbols() lists them.
- every variable symbol is LOCAL, unused ones kept; names are mangled for namespaces,
  function statics (_ZZ1kE5calls) and templates. `__managed__` has st_other 0x4.

Seen on an H200 (driver 580): cuModuleGetGlobal resolves every one of these LOCAL names,
but the loader does NOT lay a section out contiguously: each variable gets its own
256-byte-aligned slot, in an order unrelated to the section offsets, and `__managed__` ones
live in managed memory elsewhere. So `address - offset` is no section base: restore each
variable on its own, at cuModuleGetGlobal(name), checking the size it returns. A constant bank
is different: the code addresses it as c[0x3][offset] with the section's own offsets, so the
loader must place the section whole, and `address - offset` is the same for every variable in
it (harness/worker_side/module_state.py checks that before restoring the section whole). Bytes at
`relocated` offsets (`__device__ int *p = &x;`) are zero in the file and hold an address
after loading: snapshot the variables right after cuModuleLoadData and restore from that.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = ["DeviceVariable", "NotACubin", "WritableSection", "constant_sections", "imported_symbols",
           "writable_sections"]

_SHF_WRITE, _SHF_ALLOC = 0x1, 0x2
_SHN_UNDEF = 0
_SHT_SYMTAB, _SHT_RELA, _SHT_NOBITS, _SHT_REL = 2, 4, 8, 9
_STB_LOCAL, _STT_SECTION, _STT_FILE = 0, 3, 4
_STO_MANAGED = 0x4                    # st_other bit NVRTC sets on __managed__ variables only
_SHDR = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_SYM = struct.Struct("<IBBHQQ")       # Elf64_Sym


class NotACubin(ValueError):
    """The bytes are not a well-formed little-endian ELF64 CUBIN."""


@dataclass(frozen=True)
class DeviceVariable:
    name: str
    offset: int                     # inside its section
    size: int                       # st_size
    initial: bytes | None           # None: NOBITS, restore by zero fill
    local: bool                     # STB_LOCAL binding
    managed: bool                   # __managed__: st_other bit 0x4, lives in managed memory
    relocated: tuple[int, ...] = ()  # offsets inside the variable that the loader patches


@dataclass(frozen=True)
class WritableSection:
    name: str
    size: int
    initial: bytes | None                 # None: NOBITS, restore by zero fill
    anchors: tuple[tuple[str, int], ...]  # (symbol, offset in section), global binding first
    variables: tuple[DeviceVariable, ...] = ()  # same order as anchors; the unit to restore


@dataclass(frozen=True)
class _Section:
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int


def _as_bytes(cubin) -> bytes:
    if not isinstance(cubin, (bytes, bytearray, memoryview)):
        raise NotACubin("the CUBIN must be bytes")
    return bytes(cubin)


def _slice(data: bytes, offset: int, size: int, what: str) -> bytes:
    if offset < 0 or size < 0 or offset + size > len(data):
        raise NotACubin(f"{what} lies outside the file ({offset}+{size} > {len(data)})")
    return data[offset:offset + size]


def _cstring(table: bytes, offset: int, what: str) -> str:
    end = table.find(b"\0", offset)
    if offset >= len(table) or end < 0:
        raise NotACubin(f"{what}: string offset {offset} is outside its table")
    return table[offset:end].decode("utf-8", "replace")


def _sections(cubin: bytes) -> list[_Section]:
    head = _slice(cubin, 0, 64, "the ELF header")
    if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        raise NotACubin("not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", head, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
    if shentsize != _SHDR.size or shnum == 0 or shstrndx >= shnum:
        raise NotACubin(f"bad section header table (entsize {shentsize}, count {shnum}, names {shstrndx})")
    headers = list(_SHDR.iter_unpack(_slice(cubin, shoff, shnum * _SHDR.size, "the section header table")))
    _, _, _, _, offset, size, *_ = headers[shstrndx]
    names = _slice(cubin, offset, size, ".shstrtab")
    return [_Section(_cstring(names, name, "section name"), type_, flags, offset, size, link, info, entsize)
            for name, type_, flags, _addr, offset, size, link, info, _align, entsize in headers]


def _contents(cubin: bytes, section: _Section) -> bytes:
    return _slice(cubin, section.offset, section.size, f"section {section.name!r}")


def _symbols(cubin: bytes, sections: list[_Section]) -> list[tuple[str, int, int, int, int, int]]:
    """(name, binding, st_other, section index, value, size) of data symbols; [] without .symtab."""
    symtab = next((s for s in sections if s.type == _SHT_SYMTAB), None)
    if symtab is None:
        return []
    if symtab.entsize != _SYM.size or symtab.link >= len(sections):
        raise NotACubin("bad .symtab header")
    names = _contents(cubin, sections[symtab.link])
    rows = _contents(cubin, symtab)
    rows = rows[:len(rows) - len(rows) % _SYM.size]
    # Section and file symbols name no variable (section symbols carry the section's name).
    return [(_cstring(names, name, "symbol name"), info >> 4, other, shndx, value, size)
            for name, info, other, shndx, value, size in _SYM.iter_unpack(rows)
            if info & 0xF not in (_STT_SECTION, _STT_FILE) and name]


def _relocated(cubin: bytes, sections: list[_Section], index: int) -> set[int]:
    """Offsets in section `index` that a REL/RELA section patches at load time."""
    found = set()
    for s in sections:
        if s.type in (_SHT_RELA, _SHT_REL) and s.info == index:
            width = 24 if s.type == _SHT_RELA else 16  # r_offset is the first field of both
            rows = _contents(cubin, s)
            found.update(struct.unpack_from("<Q", rows, i)[0] for i in range(0, len(rows) - width + 1, width))
    return found


def _section(cubin: bytes, sections: list[_Section], index: int, symbols: list) -> WritableSection:
    s = sections[index]
    initial = None if s.type == _SHT_NOBITS else _contents(cubin, s)
    patched = _relocated(cubin, sections, index)
    # Global binding first (cuModuleGetGlobal is surest to resolve those), then by offset.
    mine = sorted((bind == _STB_LOCAL, value, name, other, size) for name, bind, other, shndx, value, size
                  in symbols if shndx == index)
    if any(value + size > s.size for _, value, _, _, size in mine):
        raise NotACubin(f"a symbol reaches past the end of {s.name}")  # it would escape a restore
    variables = tuple(
        DeviceVariable(name, value, size, None if initial is None else initial[value:value + size],
                       local, bool(other & _STO_MANAGED),
                       tuple(sorted(o - value for o in patched if value <= o < value + size)))
        for local, value, name, other, size in mine)
    return WritableSection(s.name, s.size, initial, tuple((v.name, v.offset) for v in variables), variables)


def writable_sections(cubin: bytes) -> list[WritableSection]:
    """Writable global data of a CUBIN (ELF64), read from its section headers and symbol table."""
    cubin = _as_bytes(cubin)
    sections = _sections(cubin)
    symbols = _symbols(cubin, sections)
    return [_section(cubin, sections, index, symbols) for index, s in enumerate(sections)
            if (s.name == ".nv.global" or s.name.startswith(".nv.global."))
            and s.flags & (_SHF_WRITE | _SHF_ALLOC) == _SHF_WRITE | _SHF_ALLOC]  # constant banks: constant_sections


def _is_constant_bank(name: str) -> bool:
    """`.nv.constantN` with N a bank number: a module-wide bank (a per-kernel one has a `.<kernel>` tail)."""
    return name.startswith(".nv.constant") and name[len(".nv.constant"):].isdigit()


def constant_sections(cubin: bytes) -> list[WritableSection]:
    """The module-wide constant banks that hold `__constant__` variables: read-only to `ld.const`, writable
    through a generic address (`cvta.const`), so restored like writable data. A bank with no variable
    (the loader's own, ".nv.constant4") is left out: no name locates it and no PTX name reaches it."""
    cubin = _as_bytes(cubin)
    sections = _sections(cubin)
    symbols = _symbols(cubin, sections)
    banks = [_section(cubin, sections, index, symbols) for index, s in enumerate(sections)
             if _is_constant_bank(s.name) and s.flags & _SHF_ALLOC]
    return [bank for bank in banks if bank.variables]


def imported_symbols(cubin: bytes) -> tuple[str, ...]:
    """Names the CUBIN uses but does not define (st_shndx SHN_UNDEF): the driver routines it calls."""
    cubin = _as_bytes(cubin)
    return tuple(sorted({name for name, _bind, _other, shndx, _value, _size in _symbols(cubin, _sections(cubin))
                         if shndx == _SHN_UNDEF}))
