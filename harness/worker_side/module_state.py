"""A loaded module's writable globals and constant banks, put back to their initial image before every launch.

A `__device__` table or counter is the cheapest way for a kernel to carry something from one launch
to the next: a memo of finished answers, a launch counter that skips work on some launches. A
`__constant__` one does as well: `ld.const` cannot write it, but a store through its generic address
(PTX `cvta.const`) lands in the memory behind the bank. Before every launch of a candidate (checks
and timing alike, outside the timed window) the worker writes each writable global variable and each
constant bank that holds variables (harness/worker_side/device_state.py lists both from the CUBIN)
back to the bytes it held right after the module was loaded. No `__device__` or `__constant__` byte
then tells a launch from another (memory outside them, the slack of each `__device__` slot for one,
is not reset: docs/security.md).

Each `__device__` variable is located by name (cuModuleGetGlobal): the loader gives every variable a
slot of its own, not one block per section. A constant bank is one block (the code addresses it by
the section's offsets), restored whole, padding between its variables included, where every variable
agrees on its base; else variable by variable. Pointer initializers are patched at load time, so the
image is copied from the device right after loading rather than taken from the file. Runs inside the
worker.

Cost, per launch: one device-to-device copy per `__device__` variable of its own size, plus one per
constant bank of the section's size, at most 64 KiB (the bank's limit), tens of bytes for most kernels.
"""

from __future__ import annotations

from harness.worker_side import gpu
from harness.worker_side.device_state import NotACubin, constant_sections, writable_sections

# Beyond these a module's state is refused rather than restored: each variable is one copy per launch.
MAX_VARIABLES = 256
MAX_STATE_BYTES = 4 << 30


class UnrestorableState(Exception):
    """The module has writable global data the worker cannot restore before every launch."""


class ModuleState:
    """The writable variables and constant banks of one loaded module, each with a device copy of its initial
    bytes."""

    def __init__(self, module: gpu.Module, cubin: bytes, stream):
        self._slots: list[tuple[int, gpu.Allocation]] = []  # (where the bytes live, their initial image)
        self.nbytes = 0
        self.whole_banks = 0  # constant banks restored as one block, padding included
        try:
            variables = [v for section in writable_sections(cubin) for v in self._variables(section)]
            banks = constant_sections(cubin)
        except NotACubin as exc:
            raise UnrestorableState(f"the CUBIN's sections cannot be read: {exc}") from None
        spans = [(self._address(module, v), v.size) for v in variables]
        for bank in banks:
            spans += self._bank_spans(module, bank)
        if len(spans) > MAX_VARIABLES or sum(size for _, size in spans) > MAX_STATE_BYTES:
            raise UnrestorableState(f"{len(spans)} writable global variables and constant banks of "
                                    f"{sum(size for _, size in spans)} bytes: more than the {MAX_VARIABLES} or "
                                    f"{MAX_STATE_BYTES >> 30} GiB restored before every launch")
        try:
            for address, size in spans:
                image = gpu.Allocation(size)
                self._slots.append((address, image))
                gpu.copy(image.ptr, address, size, stream)
                self.nbytes += size
        except BaseException:
            self.free()
            raise

    @staticmethod
    def _variables(section):
        if section.size and not section.variables:
            raise UnrestorableState(f"{section.size} bytes of writable global data in {section.name} with no "
                                    "variable the worker can locate")
        for variable in section.variables:
            if variable.managed:
                raise UnrestorableState(f"__managed__ variable {variable.name}: managed memory is not allowed "
                                        "(it moves between host and device under the timing)")
            if variable.size:
                yield variable

    def _bank_spans(self, module: gpu.Module, bank) -> list[tuple[int, int]]:
        """The bank as one (base, size) span where all its variables sit at base + their offset; else each
        variable's own bytes (the padding between them is then not restored: docs/security.md)."""
        located = [(self._address(module, v), v) for v in bank.variables if v.size]
        bases = {address - v.offset for address, v in located}
        if len(bases) == 1:
            self.whole_banks += 1
            return [(bases.pop(), bank.size)]
        return [(address, v.size) for address, v in located]

    @staticmethod
    def _address(module: gpu.Module, variable) -> int:
        found = module.global_address(variable.name)
        if found is None or found[1] != variable.size:
            raise UnrestorableState(f"global {variable.name} ({variable.size} bytes) cannot be located")
        return found[0]

    def restore(self, stream) -> None:
        """Queue the copies that put every writable global and constant bank back to its initial bytes."""
        for address, image in self._slots:
            gpu.copy(address, image.ptr, image.nbytes, stream)

    def free(self) -> None:
        for _, image in self._slots:
            image.free()
        self._slots = []
