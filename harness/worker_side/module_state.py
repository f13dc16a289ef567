"""A loaded module's writable globals, put back to their initial image before every launch.

A `__device__` table or counter is the cheapest way for a kernel to carry something from one launch
to the next: a memo of finished answers, a launch counter that skips work on some launches. Before
every launch of a candidate (checks and timing alike, outside the timed window) the worker writes
each writable global variable (harness/worker_side/device_state.py lists them from the CUBIN) back to the bytes
it held right after the module was loaded. No `__device__` variable then tells a launch from another
(memory outside them, the device heap for one, is not reset: docs/security.md).

Each variable is located by name (cuModuleGetGlobal): the loader gives every variable a slot of its
own, not one block per section, and patches pointer initializers at load time, so the image is
copied from the device right after loading rather than taken from the file. Runs inside the worker.
"""

from __future__ import annotations

from harness.worker_side import gpu
from harness.worker_side.device_state import NotACubin, writable_sections

# Beyond these a module's state is refused rather than restored: each variable is one copy per launch.
MAX_VARIABLES = 256
MAX_STATE_BYTES = 4 << 30


class UnrestorableState(Exception):
    """The module has writable global data the worker cannot restore before every launch."""


class ModuleState:
    """The writable variables of one loaded module, each with a device copy of its initial bytes."""

    def __init__(self, module: gpu.Module, cubin: bytes, stream):
        try:
            variables = [v for section in writable_sections(cubin) for v in self._variables(section)]
        except NotACubin as exc:
            raise UnrestorableState(f"the CUBIN's sections cannot be read: {exc}") from None
        if len(variables) > MAX_VARIABLES or sum(v.size for v in variables) > MAX_STATE_BYTES:
            raise UnrestorableState(f"{len(variables)} writable global variables of {sum(v.size for v in variables)} "
                                    f"bytes: more than the {MAX_VARIABLES} variables or {MAX_STATE_BYTES >> 30} GiB "
                                    "restored before every launch")
        self._slots: list[tuple[int, gpu.Allocation]] = []  # (the variable's address, its initial bytes)
        self.nbytes = 0
        try:
            for variable in variables:
                address = self._address(module, variable)
                image = gpu.Allocation(variable.size)
                self._slots.append((address, image))
                gpu.copy(image.ptr, address, variable.size, stream)
                self.nbytes += variable.size
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

    @staticmethod
    def _address(module: gpu.Module, variable) -> int:
        found = module.global_address(variable.name)
        if found is None or found[1] != variable.size:
            raise UnrestorableState(f"writable global {variable.name} ({variable.size} bytes) cannot be located")
        return found[0]

    def restore(self, stream) -> None:
        """Queue the copies that put every writable global back to its initial bytes."""
        for address, image in self._slots:
            gpu.copy(address, image.ptr, image.nbytes, stream)

    def free(self) -> None:
        for _, image in self._slots:
            image.free()
        self._slots = []
