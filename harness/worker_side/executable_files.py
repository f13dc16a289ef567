"""The files an executable needs to start: itself, its ELF interpreter and the shared libraries it names.

The compile worker runs nvdisasm after its second Landlock layer has left only the header folders and its
scratch folder readable (sandbox/grants.py). Granting the system library folders back would undo that, so
the layer grants exactly these files instead, found by reading the executable's ELF headers (PT_INTERP,
DT_NEEDED) and looking the libraries up where the loader looks when /etc/ld.so.cache is out of reach: the
loader then falls back to its default folders, which are these.
"""

from __future__ import annotations

import os
import struct
import sysconfig

_PT_LOAD, _PT_DYNAMIC, _PT_INTERP = 1, 2, 3
_DT_NULL, _DT_NEEDED, _DT_STRTAB = 0, 1, 5


def _default_folders() -> tuple[str, ...]:
    triplet = sysconfig.get_config_var("MULTIARCH") or ""
    multiarch = (f"/lib/{triplet}", f"/usr/lib/{triplet}") if triplet else ()
    return multiarch + ("/lib64", "/usr/lib64", "/lib", "/usr/lib")


def _elf_program(data: bytes) -> tuple[str | None, list[str]]:
    """(interpreter, needed library names) of a 64-bit little-endian ELF image."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    headers = [struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize) for i in range(phnum)]
    interpreter = None
    loads = [(h[3], h[2], h[5]) for h in headers if h[0] == _PT_LOAD]  # (vaddr, offset, file size)

    def offset_of(address: int) -> int:
        for vaddr, offset, size in loads:
            if vaddr <= address < vaddr + size:
                return offset + address - vaddr
        raise ValueError(f"address {address:#x} is in no loaded segment")

    needed_offsets, strtab = [], None
    for kind, _, offset, _, _, size, _, _ in headers:
        if kind == _PT_INTERP:
            interpreter = data[offset:offset + size].split(b"\x00")[0].decode()
        elif kind == _PT_DYNAMIC:
            for at in range(offset, offset + size, 16):
                tag, value = struct.unpack_from("<qQ", data, at)
                if tag == _DT_NULL:
                    break
                if tag == _DT_NEEDED:
                    needed_offsets.append(value)
                elif tag == _DT_STRTAB:
                    strtab = offset_of(value)
    if needed_offsets and strtab is None:
        raise ValueError("DT_NEEDED without a string table")
    names = [data[strtab + n:data.index(b"\x00", strtab + n)].decode() for n in needed_offsets]
    return interpreter, names


def startup_files(executable: str) -> tuple[str, ...]:
    """Real paths of the executable, its interpreter and its libraries (each found in the loader's default
    folders); ValueError when the file is not an ELF executable this can read, or a library is not found."""
    with open(executable, "rb") as file:
        interpreter, needed = _elf_program(file.read())
    found = [os.path.realpath(executable)]
    if interpreter:
        found.append(os.path.realpath(interpreter))
    for name in needed:
        candidates = [os.path.join(folder, name) for folder in _default_folders()]
        path = next((c for c in candidates if os.path.isfile(c)), None)
        if path is None:
            raise ValueError(f"{os.path.basename(executable)} needs {name}, found in none of {_default_folders()}")
        found.append(os.path.realpath(path))
    return tuple(dict.fromkeys(found))
