"""Jobs sent to a GPU worker and the parent's strict reading of the answers.

The parent builds a job from a task, a compiled kernel and input arrays; the worker executes it
(harness/execute.py) and answers with raw bytes. Everything the parent concludes (outputs,
guard bands, input integrity) is re-derived here from bytes and from what the parent itself
sent, never taken from a worker's say-so.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.task import DTYPES, LaunchGeometry, Task

GUARD_BYTES = 4096
# Two poisons per check: 0xFF makes float outputs NaN, 0x7F a huge finite value. An output that
# depends on what was in memory before the launch differs between the two runs.
POISON_BYTES = (0xFF, 0x7F)
TIMING_POISON = 0xFF


@dataclass(frozen=True)
class ArraySpec:
    name: str
    kind: str  # "input" | "output"
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * DTYPES[self.dtype].itemsize


@dataclass(frozen=True)
class Layout:
    """The kernel's parameters for one case: arrays (with shapes) and scalar values, in order."""

    params: tuple[tuple[str, Any], ...]  # ("array", ArraySpec) | ("scalar", (name, dtype, value))

    @classmethod
    def for_case(cls, task: Task, dims) -> "Layout":
        shapes = task.shapes(dims)
        scalars = task.scalar_values(dims)
        params = []
        for p in task.params:
            if p.kind == "scalar":
                params.append(("scalar", (p.name, p.dtype, scalars[p.name])))
            else:
                params.append(("array", ArraySpec(p.name, p.kind, p.dtype, tuple(shapes[p.name]))))
        return cls(tuple(params))

    @property
    def arrays(self) -> list[ArraySpec]:
        return [spec for kind, spec in self.params if kind == "array"]

    @property
    def inputs(self) -> list[ArraySpec]:
        return [a for a in self.arrays if a.kind == "input"]

    @property
    def outputs(self) -> list[ArraySpec]:
        return [a for a in self.arrays if a.kind == "output"]

    def to_wire(self) -> list[dict]:
        wire = []
        for kind, spec in self.params:
            if kind == "array":
                wire.append({"kind": spec.kind, "name": spec.name, "dtype": spec.dtype, "nbytes": spec.nbytes,
                             "itemsize": DTYPES[spec.dtype].itemsize})
            else:
                name, dtype, value = spec
                wire.append({"kind": "scalar", "name": name, "dtype": dtype, "value": value})
        return wire


# An array this large starts on a boundary of ALIGN_BYTES, where cuMemAlloc puts an allocation of its
# own: a kernel's speed can depend on where its arrays lie. Shifted by a 4 KiB guard band, a naive
# bfloat16 matmul ran 5% slower on an H200 (3991 against 3799 us) and other kernels moved by up to
# 5% either way, so that the referee timed placements no program would have (docs/timing.md).
ALIGNED_FROM_BYTES = 1 << 20
ALIGN_BYTES = 2 << 20


def array_alignment(nbytes: int) -> int:
    """The boundary an array of `nbytes` starts on between its guard bands (0: the allocator's own)."""
    return ALIGN_BYTES if nbytes >= ALIGNED_FROM_BYTES else 0


def guarded_bytes(nbytes: int, guard_bytes: int = GUARD_BYTES) -> int:
    """Device bytes an array takes with its guard bands and the slack that aligns it."""
    return nbytes + 2 * guard_bytes + array_alignment(nbytes)


def canary(seed: int, buffer_index: int, guard_bytes: int = GUARD_BYTES) -> tuple[np.ndarray, np.ndarray]:
    """The head and tail guard patterns of one buffer; unpredictable to a kernel, known to the parent."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, buffer_index])))
    pattern = rng.integers(0, 256, size=2 * guard_bytes, dtype=np.uint8)
    return pattern[:guard_bytes], pattern[guard_bytes:]


def sha256(array: np.ndarray) -> str:
    return hashlib.sha256(memoryview(np.ascontiguousarray(array).view(np.uint8).reshape(-1))).hexdigest()


_hashers: ThreadPoolExecutor | None = None


_hashers_made = threading.Lock()


def hashing_pool() -> ThreadPoolExecutor:
    """The threads that hash and compare large blobs (hashlib and numpy let go of the GIL)."""
    global _hashers
    with _hashers_made:
        if _hashers is None:
            _hashers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="sha256")
    return _hashers


def _views(blobs: list) -> tuple[list, list[memoryview]]:
    unique = list({id(b): b for b in blobs}.values())
    return unique, [memoryview(np.ascontiguousarray(b).view(np.uint8).reshape(-1)) if isinstance(b, np.ndarray)
                    else memoryview(b) for b in unique]


def digests_later(blobs: list) -> Callable[[], list[str]]:
    """Start hashing each blob (sha256) on the hashing threads; the returned call waits for the
    digests, in the blobs' order. A blob given twice (the same object) is hashed once."""
    unique, views = _views(blobs)
    if sum(v.nbytes for v in views) < (8 << 20) or len(views) < 2:
        found = {id(b): hashlib.sha256(v).hexdigest() for b, v in zip(unique, views)}
        return lambda: [found[id(b)] for b in blobs]
    futures = [hashing_pool().submit(lambda v=v: hashlib.sha256(v).hexdigest()) for v in views]

    def wait() -> list[str]:
        by_id = {id(b): f.result() for b, f in zip(unique, futures)}
        return [by_id[id(b)] for b in blobs]
    return wait


def digests(blobs: list) -> list[str]:
    """sha256 of each blob, large ones on several threads. A blob given twice (the same object) is
    hashed once."""
    return digests_later(blobs)()


SAME_BYTES_CHUNK = 4 << 20


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two uint8 arrays hold the same bytes, compared in chunks (no array-sized temporary)."""
    if a.nbytes != b.nbytes:
        return False
    for start in range(0, a.nbytes, SAME_BYTES_CHUNK):
        if not np.array_equal(a[start:start + SAME_BYTES_CHUNK], b[start:start + SAME_BYTES_CHUNK]):
            return False
    return True


# -- outputs in answers: each distinct output travels once ------------------------------------------
# Every output blob of an answer has a slot, "SET/OUTPUT" (its input set and which output it is). The
# worker sends the sha256 of every output, and the bytes of each distinct output once, except those
# whose hash the job names as already verified for that very slot: a kernel's outputs repeat from
# launch to launch, and 16 MB outputs re-sent and re-compared made most of an attempt's host time.

def run_slots(poisons: int, outputs: int) -> list[str]:
    return [f"0/{j}" for _ in range(poisons) for j in range(outputs)]


def time_slots(checked: list[int], sets: int, outputs: int) -> list[str]:
    """The re-checked launches' outputs (in launch order), then the last output of every set."""
    return ([f"{i % sets}/{j}" for i in sorted(set(checked)) for j in range(outputs)]
            + [f"{s}/{j}" for s in range(sets) for j in range(outputs)])


def audit_slots(audited: list[int], outputs: int) -> list[str]:
    """Fresh inputs: each audited launch's outputs, by launch number (no two launches share inputs)."""
    return [f"{i}/{j}" for i in sorted(set(audited)) for j in range(outputs)]


def pack_outputs(blobs: list, slots: list[str], known: dict[str, list[str]],
                 hashes: list[str] | None = None) -> tuple[dict, list]:
    """Worker side: the answer's output fields and the output blobs to send, in slot order.
    `hashes`: the blobs' sha256 where already computed."""
    hashes = digests(blobs) if hashes is None else hashes
    sent, seen = [], set()
    for blob, slot, digest in zip(blobs, slots, hashes, strict=True):
        if digest in seen or digest in known.get(slot, ()):
            continue
        seen.add(digest)
        sent.append(blob)
    return {"output_sha256": hashes, "outputs_sent": len(sent)}, sent


def unpack_outputs(answer: dict, blobs: list[bytes], slots: list[str],
                   known: dict[str, set[str]]) -> tuple[list[bytes | None], list[bytes]]:
    """Parent side: one entry per slot, the output's bytes, or None for an output whose hash the job
    named as verified for that slot; and the blobs after the outputs. The parent hashes the bytes it
    got itself: an output is bound to its hash here, not by the worker's say-so."""
    hashes, count = answer.get("output_sha256"), answer.get("outputs_sent")
    if (not isinstance(hashes, list) or len(hashes) != len(slots) or not all(isinstance(h, str) for h in hashes)
            or not isinstance(count, int) or not 0 <= count <= min(len(blobs), len(slots))):
        raise AnswerError("the answer's output hashes do not match the job")
    sent = blobs[:count]
    by_hash = dict(zip(digests(sent), sent))
    if len(by_hash) != count or not set(by_hash) <= set(hashes):
        raise AnswerError("the answer's output bytes do not match their hashes")
    outputs = []
    for slot, digest in zip(slots, hashes):
        if digest in by_hash:
            outputs.append(by_hash[digest])
        elif digest in known.get(slot, ()):
            outputs.append(None)
        else:
            raise AnswerError(f"output {slot} was neither sent nor verified before")
    return outputs, blobs[count:]


def geometry_to_wire(geometry: LaunchGeometry) -> dict:
    return {"grid": list(geometry.grid), "block": list(geometry.block), "shared_bytes": geometry.shared_bytes}


def resident_key(name: str, digest: str) -> str:
    """How a worker names an input buffer it keeps from job to job."""
    return f"{name}:{digest}"


def _inputs_field(layout: Layout, input_sets: list[dict[str, np.ndarray]], hashes: list[dict | None] | None,
                  resident: frozenset[str], draws: dict[str, dict] | None = None) -> tuple[list[list[dict]], list]:
    """Per set, per input: its key and whether its bytes go with the job (not if the worker holds
    it), or how the worker draws it (`draws`, by name: harness/fresh_inputs.py); and the blobs that go."""
    entries, blobs = [], []
    for s, inputs in enumerate(input_sets):
        known = (hashes or [None] * len(input_sets))[s] or {}
        entries.append([])
        for a in layout.inputs:
            if draws and a.name in draws:
                entries[-1].append({"key": None, "sent": False, "drawn": draws[a.name]})
                continue
            key = resident_key(a.name, known[a.name]) if a.name in known else None
            sent = key is None or key not in resident
            entries[-1].append({"key": key, "sent": sent})
            if sent:
                blobs.append(_contiguous(inputs[a.name], a))
    return entries, blobs


def run_job(cubin: bytes, kernel: str, layout: Layout, geometry: LaunchGeometry,
            inputs: dict[str, np.ndarray], poisons: tuple[int, ...], guard_seed: int,
            hashes: dict[str, str] | None = None, resident: frozenset[str] = frozenset()) -> tuple[dict, list]:
    """`hashes`: the inputs' sha256, by which the worker keeps them; `resident`: the keys it holds."""
    entries, blobs = _inputs_field(layout, [inputs], [hashes], resident)
    header = {"op": "run", "kernel": kernel, "params": layout.to_wire(), "launch": geometry_to_wire(geometry),
              "poisons": list(poisons), "guard_seed": guard_seed, "guard_bytes": GUARD_BYTES, "inputs": entries}
    return header, [cubin] + blobs


def draw_run_job(cubin: bytes, kernel: str, layout: Layout, geometry: LaunchGeometry,
                 fixed_inputs: dict[str, np.ndarray], fresh: "FreshDraws", launches: list[int], guard_seed: int,
                 hashes: dict[str, str] | None = None, resident: frozenset[str] = frozenset()) -> tuple[dict, list]:
    """One launch per launch number, each on the inputs that launch of a time job with the same `fresh`
    draws (the expected outputs of its audited launches). `fixed_inputs`: the inputs that are not drawn."""
    entries, blobs = _inputs_field(layout, [fixed_inputs], [hashes], resident, fresh.draws)
    header = {"op": "draw_run", "kernel": kernel, "params": layout.to_wire(), "launch": geometry_to_wire(geometry),
              "poisons": [TIMING_POISON], "guard_seed": guard_seed, "guard_bytes": GUARD_BYTES, "inputs": entries,
              "draws": {"key": fresh.key, "launches": list(launches)}}
    return header, [cubin] + blobs


@dataclass(frozen=True)
class FreshDraws:
    """A time job's fresh inputs: the secret key, and how each drawn input is drawn (by name)."""

    key: int
    draws: dict[str, dict]


def time_job(cubin: bytes, kernel: str, layout: Layout, geometry: LaunchGeometry,
             input_sets: list[dict[str, np.ndarray]], *, warmups: int, iterations: int, cold_l2: bool,
             checked_launches: list[int], guard_seed: int,
             known_outputs: dict[str, list[str]] | None = None, clock: str = "kernel",
             hashes: list[dict | None] | None = None, resident: frozenset[str] = frozenset(),
             fresh: FreshDraws | None = None) -> tuple[dict, list]:
    """`known_outputs`: by slot ("SET/OUTPUT"), the sha256 of outputs already found right, not to be sent again.
    `clock`: "kernel" times each launch on the kernel clock too, where the worker has it; "events" does not.
    `fresh`: every launch draws its drawn inputs anew (harness/fresh_inputs.py); `input_sets` then hold only
    the inputs that are not drawn, the same in every set, and `checked_launches` are the audited launches."""
    header = {"op": "time", "kernel": kernel, "params": layout.to_wire(), "launch": geometry_to_wire(geometry),
              "sets": len(input_sets), "warmups": warmups, "iterations": iterations, "cold_l2": cold_l2,
              "poison": TIMING_POISON, "checked_launches": sorted(checked_launches),
              "guard_seed": guard_seed, "guard_bytes": GUARD_BYTES, "known_outputs": known_outputs or {},
              "clock": clock, "fresh": {"key": fresh.key} if fresh else None}
    header["inputs"], blobs = _inputs_field(layout, input_sets, hashes, resident, fresh.draws if fresh else None)
    return header, [cubin] + blobs


def vendor_time_job(call: dict, layout: Layout, input_sets: list[dict[str, np.ndarray]], **timing) -> tuple[dict, list]:
    """A time job whose launch is a vendor library call (harness/vendor.py) instead of a kernel:
    the same header without the kernel and its geometry, the same blobs without the CUBIN."""
    header, blobs = time_job(b"", "", layout, LaunchGeometry(grid=(1, 1, 1), block=(1, 1, 1), shared_bytes=0),
                             input_sets, **timing)
    for key in ("kernel", "launch"):
        del header[key]
    return {**header, "op": "vendor_time", "vendor": call}, blobs[1:]


def _contiguous(array: np.ndarray, spec: ArraySpec) -> memoryview:
    if array.dtype != DTYPES[spec.dtype] or tuple(array.shape) != spec.shape:
        raise ValueError(f"input {spec.name}: expected {spec.dtype}{list(spec.shape)}, "
                         f"got {array.dtype}{list(array.shape)}")
    return memoryview(np.ascontiguousarray(array).view(np.uint8).reshape(-1))


@dataclass
class Integrity:
    """What the parent found about memory the kernel must not touch."""

    guard_violations: list[str] = field(default_factory=list)  # "c: 4 bytes after the end", ...
    modified_inputs: list[str] = field(default_factory=list)


class AnswerError(RuntimeError):
    """A worker's answer does not have the shape the parent asked for."""


def read_arrays(blobs: list[bytes], specs: list[ArraySpec]) -> dict[str, np.ndarray]:
    if len(blobs) != len(specs):
        raise AnswerError(f"expected {len(specs)} arrays, got {len(blobs)}")
    arrays = {}
    for blob, spec in zip(blobs, specs):
        if len(blob) != spec.nbytes:
            raise AnswerError(f"{spec.name}: expected {spec.nbytes} bytes, got {len(blob)}")
        arrays[spec.name] = np.frombuffer(blob, dtype=DTYPES[spec.dtype]).reshape(spec.shape)
    return arrays


def check_integrity(header: dict, guard_blobs: list[bytes], layout: Layout, guard_seed: int,
                    input_sets: list[dict[str, np.ndarray]], sent_hashes: list[dict | None] | None = None) -> Integrity:
    """Compare guard bands with their canaries and device inputs (by hash) with what was sent.
    `sent_hashes`, where given, are the sent inputs' hashes computed earlier (None: compute them)."""
    integrity = Integrity()
    arrays = layout.arrays
    if len(guard_blobs) != 2 * len(arrays) * len(input_sets):
        raise AnswerError("guard band count does not match the buffers")
    blob_index = 0
    for set_index in range(len(input_sets)):
        for buffer_index, spec in enumerate(arrays):
            head, tail = canary(guard_seed, set_index * len(arrays) + buffer_index)
            for where, expected in (("before the start", head), ("after the end", tail)):
                got = np.frombuffer(guard_blobs[blob_index], dtype=np.uint8)
                blob_index += 1
                if got.shape != expected.shape:
                    raise AnswerError(f"guard band of {spec.name} has the wrong size")
                bad = np.flatnonzero(got != expected)
                if bad.size:
                    distance = (GUARD_BYTES - int(bad.max())) if where == "before the start" else int(bad.min()) + 1
                    integrity.guard_violations.append(
                        f"{spec.name}: {bad.size} bytes changed {where} (nearest {distance} bytes away)")
    hashes = header.get("input_sha256")
    if not isinstance(hashes, list) or len(hashes) != len(input_sets):
        raise AnswerError("input hashes missing")
    for set_index, inputs in enumerate(input_sets):
        known = (sent_hashes or [None] * len(input_sets))[set_index] or {}
        for spec in layout.inputs:
            if spec.name not in inputs:
                continue  # drawn on the device: checked against its draw after every launch instead
            sent = known.get(spec.name) or sha256(inputs[spec.name])
            if hashes[set_index].get(spec.name) != sent:
                integrity.modified_inputs.append(spec.name)
    integrity.modified_inputs = sorted(set(integrity.modified_inputs))
    return integrity
