"""Device-heap calls in a CUBIN, refused unless the task declares that its kernels need the heap.

The device heap (`malloc`, `free`, `new`, `delete`, `__nv_aligned_device_malloc`) belongs to the
worker's context and outlives every launch, job and attempt it serves; the worker cannot reset it
(no call locates it or empties it). A kernel could park a memo or a launch counter there and find it
again at the next launch, at the allocator's deterministic first address. So a task that does not
say `device_heap = true` (docs/task-format.md) runs no kernel that calls the heap: such a kernel is
refused before it is loaded, with ReasonCode.DEVICE_HEAP (harness/referee.py). Where a task allows
the heap, what a kernel keeps there is the residual that docs/security.md states.

Every way to the heap is a call the driver resolves when it loads the module: an undefined symbol
in the CUBIN (`malloc`, `free`, `__cuda_syscall_aligned_malloc`; `new` and `delete` call `malloc`
and `free`). Reading the CUBIN, not the source or the PTX, catches every spelling, inline PTX too.
Pure (no CUDA): the parent checks with it before any job is sent.
"""

from __future__ import annotations

import re

from harness.worker_side.device_state import NotACubin, imported_symbols

__all__ = ["heap_calls", "heap_refusal"]

# Any imported routine that allocates or frees: the three the compiler emits today, and any later one.
_HEAP_ROUTINE = re.compile(r"alloc|free", re.IGNORECASE)


def heap_calls(cubin: bytes) -> tuple[str, ...]:
    """The device-heap routines the CUBIN calls (empty for a CUBIN that cannot be read: the worker refuses to
    load one, since it cannot restore its state: harness/worker_side/module_state.py)."""
    try:
        imported = imported_symbols(cubin)
    except NotACubin:
        return ()
    return tuple(name for name in imported if _HEAP_ROUTINE.search(name))


def heap_refusal(cubin: bytes, allowed: bool) -> str | None:
    """Why the kernel may not run, or None: it calls the device heap and the task does not allow it."""
    calls = heap_calls(cubin) if not allowed else ()
    if not calls:
        return None
    return (f"the kernel calls the device heap ({', '.join(calls)}), which this task does not allow: the heap "
            "outlives every launch and is never reset, so nothing kept there may carry from one launch to the "
            "next; use registers, shared memory or the task's outputs instead (a task that needs device malloc "
            "says `device_heap = true` in its task.toml)")
