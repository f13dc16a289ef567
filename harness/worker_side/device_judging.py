"""Outputs judged where they lie: the reference's worker keeps the expected outputs on its device, and opens
the candidate's outputs through CUDA IPC handles to compare them with its own judging kernels
(harness/worker_side/judge_source.py), in its own context.

The candidate's worker exports, after its two launches have finished, the handles of the allocations
holding the two runs' outputs; it frees them only at its next job, once the judging is over. A handle
names memory by the allocation it was exported from: the candidate's kernel ran before it was made and
never sees it, and the judging kernels run where no candidate code has ever run, on expected outputs
that never left that context. Only totals and a few elements come back to the parent.
"""

from __future__ import annotations

import ctypes
import hashlib
from collections import OrderedDict

import numpy as np
from cuda.bindings import driver

from harness.worker_side import gpu
from harness.worker_side.buffers import TIMING_POISON, TREE_CHUNK_BYTES
from harness.worker_side.compile_policy import arch_for
from harness.worker_side.cuda_check import CudaError, check
from harness.worker_side.nvrtc import compile_kernel
from harness.worker_side.judge_source import JUDGE_SOURCE, NO_INDEX, STATS_FIELDS, TOTALS_FIELDS
from sandbox.answers import Status

IPC_HANDLE_BYTES = 64
BLOCK = 256
# A thread per 1 MiB chunk: small blocks spread a few thousand chunks over every SM.
HASH_BLOCK = 32


def export(allocation_ptr: int, ptr: int) -> dict:
    """The IPC handle of the allocation starting at `allocation_ptr`, and where `ptr` lies in it."""
    handle = check(driver.cuIpcGetMemHandle(allocation_ptr), "cuIpcGetMemHandle")
    return {"handle": ctypes.string_at(handle.getPtr(), IPC_HANDLE_BYTES).hex(), "offset": ptr - allocation_ptr}


class Opened:
    """Another process's allocation mapped here, until close()."""

    def __init__(self, entry: dict):
        raw = bytes.fromhex(entry["handle"])
        if len(raw) != IPC_HANDLE_BYTES or not isinstance(entry.get("offset"), int) or entry["offset"] < 0:
            raise ValueError("a malformed IPC handle")
        handle = driver.CUipcMemHandle()
        ctypes.memmove(handle.getPtr(), raw, IPC_HANDLE_BYTES)
        flags = int(driver.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        self.base = int(check(driver.cuIpcOpenMemHandle(handle, flags), "cuIpcOpenMemHandle"))
        self.ptr = self.base + entry["offset"]

    def size(self) -> int:
        """Bytes of the mapped allocation from ptr on."""
        base, size = check(driver.cuMemGetAddressRange(self.base), "cuMemGetAddressRange")
        return int(base) + int(size) - self.ptr

    def close(self) -> None:
        if self.base:
            driver.cuIpcCloseMemHandle(self.base)
            self.base = 0


class Held:
    """The candidate's side: allocations whose handles went out with the last answer, freed at the next job."""

    def __init__(self):
        self.allocations: list = []

    def keep(self, allocation) -> None:
        self.allocations.append(allocation)

    def release(self) -> None:
        while self.allocations:
            self.allocations.pop().free()


class Kept:
    """The reference's side: expected outputs by key ("CASE/SEED"), each output's allocation by name; the
    least recently used go first beyond the cap."""

    def __init__(self, cap_bytes: int):
        self.cap_bytes = cap_bytes
        self._outputs: OrderedDict[str, dict[str, gpu.Allocation]] = OrderedDict()

    def keep(self, key: str, outputs: dict[str, gpu.Allocation]) -> None:
        self.drop(key)
        self._outputs[key] = outputs
        while len(self._outputs) > 1 and self._bytes() > self.cap_bytes:
            self.drop(next(iter(self._outputs)))

    def get(self, key: str) -> dict[str, gpu.Allocation] | None:
        if key in self._outputs:
            self._outputs.move_to_end(key)
        return self._outputs.get(key)

    def drop(self, key: str) -> None:
        for allocation in self._outputs.pop(key, {}).values():
            allocation.free()

    def clear(self) -> None:
        for key in list(self._outputs):
            self.drop(key)

    def keys(self) -> list[str]:
        return list(self._outputs)

    def _bytes(self) -> int:
        return sum(a.nbytes for outputs in self._outputs.values() for a in outputs.values())


class ExpectedMissing(Exception):
    """The judge job names expected outputs this worker does not hold (it was restarted, or they were dropped)."""


class Judges:
    """The judging kernels, compiled and loaded in this worker on first use."""

    def __init__(self, context: gpu.Context, cubin: bytes):
        self.context = context
        self.module = gpu.Module(cubin)
        self.blocks = max(1, context.info.sm_count * 8)
        self.counters = gpu.Allocation(8 * max(len(TOTALS_FIELDS), len(STATS_FIELDS)))

    def _launch(self, name: str, arguments: list, blocks: int | None = None, block: int = BLOCK) -> None:
        gpu.launch(self.module.function(name), (blocks or self.blocks, 1, 1), (block, 1, 1), 0, self.context.stream,
                   gpu.kernel_arguments(arguments))

    def _counters(self, initial: list[int]) -> None:
        gpu.upload(self.counters.ptr, np.array(initial, dtype=np.uint64))

    def _read(self, count: int) -> list[int]:
        self.context.synchronize()
        return [int(v) for v in gpu.download(self.counters.ptr, 8 * count).view(np.uint64)]

    def judge(self, dtype: str, expected: int, first: int, second: int, elements: int, rtol: float, atol: float,
              patterns: tuple[int, int]) -> dict[str, int]:
        initial = [NO_INDEX if name.startswith("first_") else 0 for name in TOTALS_FIELDS]
        self._counters(initial)
        self._launch(f"referee_judge_{dtype}", [("ptr", expected), ("ptr", first), ("ptr", second),
                                                ("uint64", elements), ("float64", rtol), ("float64", atol),
                                                ("uint64", patterns[0]), ("uint64", patterns[1]),
                                                ("ptr", self.counters.ptr)])
        return dict(zip(TOTALS_FIELDS, self._read(len(TOTALS_FIELDS))))

    def first_after(self, dtype: str, expected: int, got: int, elements: int, rtol: float, atol: float,
                    start: int) -> int | None:
        self._counters([NO_INDEX])
        self._launch(f"referee_first_after_{dtype}", [("ptr", expected), ("ptr", got), ("uint64", elements),
                                                      ("float64", rtol), ("float64", atol), ("uint64", start),
                                                      ("ptr", self.counters.ptr)])
        found = self._read(1)[0]
        return None if found == NO_INDEX else found

    def spread(self, dtype: str, values: int, elements: int) -> dict[str, int]:
        self._counters([0, NO_INDEX, 0])
        self._launch(f"referee_spread_{dtype}", [("ptr", values), ("uint64", elements), ("ptr", self.counters.ptr)])
        return dict(zip(STATS_FIELDS, self._read(len(STATS_FIELDS))))

    def tree_sha256(self, ptr: int, nbytes: int) -> str:
        """buffers.tree_sha256 of the device bytes at `ptr`, each chunk hashed by its own thread."""
        if nbytes == 0:
            return hashlib.sha256(b"").hexdigest()
        chunks = -(-nbytes // TREE_CHUNK_BYTES)
        digests = gpu.Allocation(32 * chunks)
        try:
            self._launch("referee_chunk_sha256", [("ptr", ptr), ("uint64", nbytes), ("uint64", TREE_CHUNK_BYTES),
                                                  ("ptr", digests.ptr)],
                         blocks=-(-chunks // HASH_BLOCK), block=HASH_BLOCK)
            self.context.synchronize()
            return hashlib.sha256(gpu.download(digests.ptr, 32 * chunks).tobytes()).hexdigest()
        finally:
            digests.free()

    def count_equal(self, utilities, ptr: int, elements: int, itemsize: int, byte: int) -> int:
        self._counters([0])
        utilities.count_equal(ptr, elements, itemsize, byte, self.counters.ptr)
        return self._read(1)[0]

    def differ(self, utilities, a: int, b: int, nbytes: int) -> int:
        self._counters([0])
        utilities.differ(a, b, nbytes, self.counters.ptr)
        return self._read(1)[0]


def pattern(byte: int, itemsize: int) -> int:
    return int.from_bytes(bytes([byte]) * itemsize, "little")


def element_hex(ptr: int, index: int, itemsize: int) -> str:
    return gpu.download(ptr + index * itemsize, itemsize).tobytes().hex()


def judges_of(utilities) -> Judges:
    """The worker's judging kernels, compiled on first use (most workers never judge on the device)."""
    if utilities.judges is None:
        context = utilities.context
        compiled = compile_kernel(JUDGE_SOURCE, "referee_judge_float32", arch=arch_for(*context.info.compute_capability))
        if not compiled.ok:
            raise RuntimeError(f"the referee's judging kernels did not compile: {compiled.log}")
        utilities.judges = Judges(context, compiled.cubin)
    return utilities.judges


# -- the run job's two ways of leaving outputs on the device (harness/worker_side/execute.py) -------------------

def snapshot(outputs: list, stream, allocate=gpu.Allocation) -> list[gpu.Allocation]:
    """A copy of each output (the first run's) before the next launch's poison overwrites it. `allocate`: how
    (the worker's resident inputs make room first: harness/worker_side/resident.py)."""
    copies = []
    try:
        for _, p, buffer in outputs:
            copies.append(allocate(p["nbytes"]))
            gpu.copy(copies[-1].ptr, buffer.ptr, p["nbytes"], stream)
    except BaseException:
        for allocation in copies:
            allocation.free()
        raise
    return copies


def hold(job, firsts: list[gpu.Allocation], held: Held) -> dict:
    """The candidate's side: both runs' outputs stay here until the next job; their handles go back, per
    output [first run, second run]. Where this device or system cannot export them, the answer says so
    ("held_error") and nothing is held: the parent judges on the host instead."""
    entries = []
    try:
        for allocation, (_, _, buffer) in zip(firsts, job.outputs(0), strict=True):
            entries.append([export(allocation.ptr, allocation.ptr), export(buffer.allocation.ptr, buffer.ptr)])
    except CudaError as exc:
        return {"held_outputs": None, "held_error": f"{exc.name}: {exc}"}
    for allocation, (_, _, buffer) in zip(firsts, job.outputs(0)):
        held.keep(allocation)
        held.keep(buffer)
        job.kept.add(id(buffer))
    return {"held_outputs": entries}


def keep(job, firsts: list[gpu.Allocation], header: dict, utilities) -> dict:
    """The reference's side: the first run's outputs become the expected outputs of header["keep_as"]; for
    each, its sha256-tree, its spread, and how the second run compares with it (bytes that differ,
    elements beyond tolerance)."""
    judges = judges_of(utilities)
    facts = []
    for allocation, (_, p, buffer) in zip(firsts, job.outputs(0), strict=True):
        elements = p["nbytes"] // p["itemsize"]
        rtol, atol = header["tolerances"][p["name"]]
        # The first run against itself, the second as the pair: elements holding each run's poison are counted
        # as unwritten, apart from the second run's elements beyond tolerance of the first's.
        poisons = (pattern(header["poisons"][0], p["itemsize"]), pattern(header["poisons"][1], p["itemsize"]))
        pair = judges.judge(p["dtype"], allocation.ptr, allocation.ptr, buffer.ptr, elements, rtol, atol, poisons)
        facts.append({"name": p["name"], "tree_sha256": judges.tree_sha256(allocation.ptr, p["nbytes"]),
                      "spread": judges.spread(p["dtype"], allocation.ptr, elements),
                      "poison_count": judges.count_equal(utilities, allocation.ptr, elements, p["itemsize"],
                                                         TIMING_POISON),
                      "differ": judges.differ(utilities, allocation.ptr, buffer.ptr, p["nbytes"]),
                      "mismatches": pair["pair_mismatches"], "unwritten": pair["unwritten"],
                      "first_unwritten": pair["first_unwritten"]})
    utilities.kept.keep(header["keep_as"], {p["name"]: a for a, (_, p, _) in zip(firsts, job.outputs(0))})
    return {"kept": facts, "kept_expected": utilities.kept.keys()}


def keep_launch(job, key: str, poison: int, utilities) -> dict:
    """The reference's side of a timing's audit: this launch's outputs, copied and kept as `key`; each one's
    spread and how many of its elements hold the timing poison's pattern (a right output may)."""
    judges = judges_of(utilities)
    copies = snapshot(job.outputs(0), utilities.context.stream, _room_maker(utilities))
    try:
        facts = []
        for allocation, (_, p, _) in zip(copies, job.outputs(0)):
            elements = p["nbytes"] // p["itemsize"]
            facts.append({"name": p["name"], "spread": judges.spread(p["dtype"], allocation.ptr, elements),
                          "poison_count": judges.count_equal(utilities, allocation.ptr, elements, p["itemsize"],
                                                             poison)})
    except BaseException:
        for allocation in copies:
            allocation.free()
        raise
    utilities.kept.keep(key, {p["name"]: a for a, (_, p, _) in zip(copies, job.outputs(0))})
    return {"key": key, "outputs": facts}


def _room_maker(utilities):
    return lambda nbytes: utilities.resident.making_room(gpu.Allocation, nbytes)


def judge_job(context: gpu.Context, header: dict, utilities) -> tuple[dict, list]:
    """Compare a candidate's held outputs (by their handles) with the expected outputs kept here: one set of
    them (a check), or, with "launches", each audited launch of a timing against its own, in one job that opens
    each exported allocation once."""
    judges, opened = judges_of(utilities), {}
    try:
        if "launches" in header:
            judged = [_judge_outputs({**header, **launch}, utilities, judges, opened) for launch in header["launches"]]
            return {"status": Status.OK, "judged_launches": judged, "resident_inputs": utilities.resident.keys()}, []
        judged = _judge_outputs(header, utilities, judges, opened)
    finally:
        for handle in opened.values():
            handle.close()
    return {"status": Status.OK, "judged": judged, "resident_inputs": utilities.resident.keys()}, []


def _judge_outputs(header: dict, utilities, judges: Judges, opened: dict[str, Opened]) -> list[dict]:
    """Each output of header["outputs"] (its runs' handles) against the expected outputs header["expected"]."""
    expected = utilities.kept.get(header["expected"])
    if expected is None:
        raise ExpectedMissing(header["expected"])
    judged, patterns = [], header["poisons"]
    for out in header["outputs"]:
        name, dtype, itemsize, elements = out["name"], out["dtype"], out["itemsize"], out["elements"]
        nbytes = elements * itemsize
        if name not in expected or expected[name].nbytes != nbytes:
            raise ExpectedMissing(f"{header['expected']}/{name}")
        runs = []
        for entry in out["runs"]:
            base = opened.get(entry["handle"])
            if base is None:
                base = opened[entry["handle"]] = Opened({**entry, "offset": 0})
            if not isinstance(entry.get("offset"), int) or entry["offset"] < 0 or \
                    base.size() < entry["offset"] + nbytes:
                raise ValueError(f"{name}: the exported allocation is smaller than the output")
            runs.append(base.ptr + entry["offset"])
        first, second = runs
        rtol, atol = out["rtol"], out["atol"]
        totals = judges.judge(dtype, expected[name].ptr, first, second, elements, rtol, atol,
                              (pattern(patterns[0], itemsize), pattern(patterns[1], itemsize)))
        mismatches, start = [], 0
        while len(mismatches) < min(header["first_mismatches"], totals["mismatches"]):
            index = judges.first_after(dtype, expected[name].ptr, first, elements, rtol, atol, start)
            if index is None:
                break
            mismatches.append([index, element_hex(expected[name].ptr, index, itemsize),
                               element_hex(first, index, itemsize)])
            start = index + 1
        judged.append({"name": name, "totals": totals, "mismatches": mismatches})
    if header.get("drop_expected"):  # used once (a secret seed's, an audited launch's)
        utilities.kept.drop(header["expected"])
    return judged
