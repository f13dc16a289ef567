"""Altered copies of an approved kernel, to rehearse the guard on a runner: does it flag a kernel a few percent
slower as regressed, and one wrong on a single element as incorrect, on this hardware and with its noise?

Both alterations keep the approved code as it is and wrap it. The kernel becomes a `static __device__
__forceinline__` inner function (its `__launch_bounds__` moves to the wrapper), and a `__global__` wrapper of the
kernel's own name and parameter list (the task's signature, its qualifiers kept) calls it. Every thread of the
wrapper calls the inner function, so an early `return` in the kernel returns to the wrapper and a barrier after
the call is still reached by every thread.

Slower: thread 0 of each block spins on `clock64()` for D cycles, then `__syncthreads()`, then the inner call.
A block's start is delayed by D cycles, so a launch of W waves of blocks takes about W * D / f longer (f the SM
clock). For an added share s of a case's median latency T:

    D = s * T * f / W,   W = ceil(blocks / (SM count * blocks resident per SM))

Resident blocks are estimated from the block's threads, registers and shared memory (`resident_blocks`). The
estimate errs high where other resident blocks keep an SM busy during a block's spin (the spin then costs less
than a wave's time), so whoever relies on it measures the slowdown made and may rescale D (`rescaled`). One
source serves every case: the wrapper picks each case's D by the launch's block count, which tells the cases
apart (cases of one block count share their mean D).

One wrong element: after the inner call, `__syncthreads()`, then thread 0 of block 0 adds 1 to element 0 of the
output. Block 0 writes element 0 in the kernels this is used on (a row-major tile or row per block); the barrier
orders the add after that block's own write.

A copy is a full approval under another name in the same store, signed with a key the store trusts (`copy_with`):
the guard verifies it as any other.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

from guard.approval import Statement
from guard.signing import load_private, sign
from guard.store import LoadedApproval, load_approval, write_approval
from harness.csig import parse_signature
from harness.task import load_task
from harness.task_model import LaunchSpec, Task
from harness.worker_side.nvrtc import compile_kernel

# A block's residency on an SM, Hopper's limits: threads, registers, shared memory and blocks per SM.
MAX_THREADS_PER_SM, REGISTERS_PER_SM, SHARED_PER_SM, MAX_BLOCKS_PER_SM = 2048, 65536, 228 * 1024, 32
INNER_SUFFIX = "__rehearsal_inner"
_BOUNDS = r"__launch_bounds__\s*\([^()]*\)\s*"
_OUTPUT_C_TYPES = {"float32": "1.0f", "float64": "1.0"}


class VariantError(ValueError):
    """The kernel cannot be wrapped: its definition is not found or not of the supported form."""


def _definition(source: str, kernel_name: str) -> re.Match:
    pattern = re.compile(rf'extern\s+"C"\s+__global__\s+(?P<pre>{_BOUNDS})?void\s+(?P<post>{_BOUNDS})?'
                         rf'{re.escape(kernel_name)}\s*\((?P<params>[^()]*)\)\s*(?=\{{)')
    found = list(pattern.finditer(source))
    if len(found) != 1:
        raise VariantError(f"expected one definition of extern \"C\" __global__ void {kernel_name}(...) {{, "
                           f"found {len(found)}")
    return found[0]


def wrapped(source: str, kernel_name: str, before: str = "", after: str = "") -> str:
    """The kernel as an inner function, called by a wrapper `__global__` of its name and parameters; `before` and
    `after` are statements the wrapper runs around the call (every thread of the block runs them)."""
    match = _definition(source, kernel_name)
    params = " ".join(match["params"].split())
    try:
        names = [p.name for p in parse_signature(f'extern "C" __global__ void {kernel_name}({params})').params]
    except ValueError as e:
        raise VariantError(f"the kernel's parameters cannot be read: {e}") from None
    bounds = (match["pre"] or match["post"] or "").strip()
    inner = f"{kernel_name}{INNER_SUFFIX}"
    renamed = (source[:match.start()] + f"static __device__ __forceinline__ void {inner}({match['params']})"
               + source[match.end():])
    wrapper = (f'\n\nextern "C" __global__ void {bounds + " " if bounds else ""}{kernel_name}({params})\n{{\n'
               f"{before}    {inner}({', '.join(names)});\n{after}}}\n")
    return renamed + wrapper


def slower(source: str, kernel_name: str, cycles_by_blocks: dict[int, int]) -> str:
    """The kernel with thread 0 of each block spinning before it: D cycles chosen by the launch's block count
    (one entry per case; another count spins the entries' largest D)."""
    if not cycles_by_blocks or min(cycles_by_blocks.values()) < 0:
        raise VariantError("slower needs a non-negative spin per block count")
    cases = "".join(f"        case {blocks}LL: spin = {cycles}LL; break;\n"
                    for blocks, cycles in sorted(cycles_by_blocks.items()))
    before = ("    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {\n"
              "        const long long blocks = (long long)gridDim.x * gridDim.y * gridDim.z;\n"
              f"        long long spin = {max(cycles_by_blocks.values())}LL;\n"
              f"        switch (blocks) {{\n{cases}        default: break;\n        }}\n"
              "        const long long start = clock64();\n"
              "        while (clock64() - start < spin) { }\n"
              "    }\n    __syncthreads();\n")
    return wrapped(source, kernel_name, before=before)


def one_wrong_element(source: str, task: Task) -> str:
    """The kernel with element 0 of the task's first output raised by 1 after the kernel wrote it."""
    output = next((p for p in task.params if p.kind == "output"), None)
    if output is None or output.dtype not in _OUTPUT_C_TYPES:
        raise VariantError(f"one_wrong_element needs a float32 or float64 output, the task's is "
                           f"{output.dtype if output else 'none'}")
    after = ("    __syncthreads();\n"
             "    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0\n"
             "        && threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {\n"
             f"        {output.name}[0] += {_OUTPUT_C_TYPES[output.dtype]};\n"
             "    }\n")
    return wrapped(source, task.kernel_name, after=after)


def resident_blocks(threads: int, registers: int | None, shared_bytes: int) -> int:
    """Blocks one SM holds at once, the tightest of its limits (register allocation granularity left out)."""
    limits = [MAX_BLOCKS_PER_SM, MAX_THREADS_PER_SM // threads]
    if registers:
        limits.append(REGISTERS_PER_SM // (registers * threads))
    if shared_bytes:
        limits.append(SHARED_PER_SM // shared_bytes)
    return max(1, min(limits))


def waves(blocks: int, sm_count: int, resident: int) -> int:
    return max(1, math.ceil(blocks / (sm_count * resident)))


def spin_cycles(median_ms: float, sm_clock_mhz: float, wave_count: int, share: float = 0.03) -> int:
    """D = share * T * f / W: the spin that adds `share` of a launch's median time T over W waves at f."""
    return max(0, round(share * median_ms * 1e-3 * sm_clock_mhz * 1e6 / wave_count))


def spin_plan(loaded: LoadedApproval, share: float = 0.03, arch: str = "sm_90") -> dict[int, int]:
    """Per performance case's block count, the spin adding `share` of the approved kernel's accepted median:
    its waves from its launch and its resources (compiled here with NVRTC), the clock and SM count from the
    approval's fingerprint."""
    approval, task = loaded.approval, load_task(loaded.path("task"))
    fingerprint = approval.fingerprint
    clock = fingerprint.application_sm_clock_mhz or fingerprint.max_sm_clock_mhz
    if not clock or not fingerprint.sm_count:
        raise VariantError("the approval's fingerprint records no SM clock or SM count to plan a spin from")
    compiled = compile_kernel(loaded.source(approval.kernel.file), task.kernel_name,
                              options=approval.kernel.options, arch=arch)
    if not compiled.ok or compiled.resources is None:
        raise VariantError(f"the approved kernel does not compile here: {compiled.log[:300]}")
    launch, plan = LaunchSpec.model_validate(approval.kernel.launch), {}
    for case in task.performance_cases:
        geometry = launch.resolve(case)
        blocks, threads = math.prod(geometry.grid), math.prod(geometry.block)
        resident = resident_blocks(threads, compiled.resources.registers,
                                   compiled.resources.shared_bytes + geometry.shared_bytes)
        cycles = spin_cycles(approval.case(case.name).kernel.median_ms, clock,
                             waves(blocks, fingerprint.sm_count, resident), share)
        plan[blocks] = (plan[blocks] + cycles) // 2 if blocks in plan else cycles
    return plan


def rescaled(cycles: int, measured_share: float, share: float = 0.03) -> int:
    """The spin that would have added `share` where `cycles` added `measured_share` (the spin's cost is linear
    in D)."""
    if measured_share <= 0:
        raise VariantError(f"a spin of {cycles} cycles added {measured_share:.2%}: nothing to rescale from")
    return round(cycles * share / measured_share)


def copy_with(store: Path, loaded: LoadedApproval, name: str, source: str, key: Path, note: str) -> LoadedApproval:
    """The approval again under `name`, its kernel replaced by `source`, signed with `key` (one the store trusts);
    the task, baseline, accepted latencies and fingerprint are the original's."""
    approval = loaded.approval
    files = {relative: loaded.path(relative).read_bytes() for relative in approval.files()}
    files[approval.kernel.file] = source.encode()
    kernel = approval.kernel.model_copy(update={"sha256": hashlib.sha256(files[approval.kernel.file]).hexdigest()})
    provenance = approval.provenance.model_copy(update={"note": note})
    copy = approval.model_copy(update={"name": name, "kernel": kernel, "provenance": provenance})
    statement = Statement.of(copy)
    write_approval(store, statement, sign(statement.to_json(), load_private(key)), files)
    return load_approval(store, name)


def case_blocks(loaded: LoadedApproval) -> dict[str, int]:
    """Each performance case's block count under the approved kernel's launch: the key of its spin."""
    task, launch = load_task(loaded.path("task")), LaunchSpec.model_validate(loaded.approval.kernel.launch)
    return {case.name: math.prod(launch.resolve(case).grid) for case in task.performance_cases}


def recalibrated(plan: dict[int, int], blocks: dict[str, int], measured: dict[str, float],
                 share: float = 0.03) -> dict[int, int]:
    """The plan with each measured case's spin rescaled to add `share` (`measured`: case -> share it added)."""
    again = dict(plan)
    for case, added in measured.items():
        again[blocks[case]] = rescaled(plan[blocks[case]], added, share)
    return again
