"""Jobs sent to a GPU worker and the parent's strict reading of the answers.

The parent builds a job from a task, a compiled kernel and input arrays; the worker executes it
(harness/worker_side/execute.py) and answers with raw bytes. Everything the parent concludes (outputs,
guard bands, input integrity) is re-derived here from bytes and from what the parent itself
sent, never taken from a worker's say-so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.task_model import DTYPES, LaunchGeometry, Task
from harness.worker_side.messages import DrawRunJob, RunJob, TimeJob
from harness.worker_side.buffers import GUARD_BYTES, TIMING_POISON, canary, digests, sha256


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
    it), or how the worker draws it (`draws`, by name: harness/worker_side/fresh_inputs.py); and the blobs that go."""
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


def make_run_job(cubin: bytes, kernel: str, layout: Layout, geometry: LaunchGeometry,
                 inputs: dict[str, np.ndarray], poisons: tuple[int, ...], guard_seed: int,
                 hashes: dict[str, str] | None = None, resident: frozenset[str] = frozenset(),
                 launch_limit_s: float | None = None, drawn: FreshDraws | None = None) -> tuple[RunJob, list]:
    """`hashes`: the inputs' sha256, by which the worker keeps them; `resident`: the keys it holds;
    `launch_limit_s`: a launch still running after this is too slow (None: no limit); `drawn`: the inputs
    the worker draws on the device instead (a large case's: its key and how each input is drawn)."""
    entries, blobs = _inputs_field(layout, [inputs], [hashes], resident, drawn.draws if drawn else None)
    header: RunJob = {"op": "run", "kernel": kernel, "params": layout.to_wire(), "launch": geometry_to_wire(geometry),
              "poisons": list(poisons), "guard_seed": guard_seed, "guard_bytes": GUARD_BYTES, "inputs": entries}
    if launch_limit_s is not None:
        header["launch_limit_s"] = launch_limit_s
    if drawn is not None:
        header["draw_key"] = drawn.key
    return header, [cubin] + blobs


def make_draw_run_job(cubin: bytes, kernel: str, layout: Layout, geometry: LaunchGeometry,
                      fixed_inputs: dict[str, np.ndarray], fresh: "FreshDraws", launches: list[int], guard_seed: int,
                      hashes: dict[str, str] | None = None,
                      resident: frozenset[str] = frozenset()) -> tuple[DrawRunJob, list]:
    """One launch per launch number, each on the inputs that launch of a time job with the same `fresh`
    draws (the expected outputs of its audited launches). `fixed_inputs`: the inputs that are not drawn."""
    entries, blobs = _inputs_field(layout, [fixed_inputs], [hashes], resident, fresh.draws)
    header: DrawRunJob = {"op": "draw_run", "kernel": kernel, "params": layout.to_wire(), "launch": geometry_to_wire(geometry),
              "poisons": [TIMING_POISON], "guard_seed": guard_seed, "guard_bytes": GUARD_BYTES, "inputs": entries,
              "draws": {"key": fresh.key, "launches": list(launches)}}
    return header, [cubin] + blobs


@dataclass(frozen=True)
class FreshDraws:
    """A time job's fresh inputs: the secret key, and how each drawn input is drawn (by name)."""

    key: int
    draws: dict[str, dict]


def make_time_job(cubin: bytes, kernel: str, layout: Layout, geometry: LaunchGeometry,
                  input_sets: list[dict[str, np.ndarray]], *, warmups: int, iterations: int, cold_l2: bool,
                  checked_launches: list[int], guard_seed: int,
                  known_outputs: dict[str, list[str]] | None = None, clock: str = "kernel",
                  hashes: list[dict | None] | None = None, resident: frozenset[str] = frozenset(),
                  fresh: FreshDraws | None = None, launch_limit_s: float | None = None) -> tuple[TimeJob, list]:
    """`known_outputs`: by slot ("SET/OUTPUT"), the sha256 of outputs already found right, not to be sent again.
    `clock`: "kernel" times each launch on the kernel clock too, where the worker has it; "events" does not.
    `fresh`: every launch draws its drawn inputs anew (harness/worker_side/fresh_inputs.py); `input_sets` then hold only
    the inputs that are not drawn, the same in every set, and `checked_launches` are the audited launches.
    `launch_limit_s`: a launch still running after this is too slow (None: no limit)."""
    header: TimeJob = {"op": "time", "kernel": kernel, "params": layout.to_wire(), "launch": geometry_to_wire(geometry),
              "sets": len(input_sets), "warmups": warmups, "iterations": iterations, "cold_l2": cold_l2,
              "poison": TIMING_POISON, "checked_launches": sorted(checked_launches),
              "guard_seed": guard_seed, "guard_bytes": GUARD_BYTES, "known_outputs": known_outputs or {},
              "clock": clock, "fresh": {"key": fresh.key} if fresh else None}
    if launch_limit_s is not None:
        header["launch_limit_s"] = launch_limit_s
    header["inputs"], blobs = _inputs_field(layout, input_sets, hashes, resident, fresh.draws if fresh else None)
    return header, [cubin] + blobs


def make_vendor_time_job(call: dict, layout: Layout, input_sets: list[dict[str, np.ndarray]],
                         **timing) -> tuple[TimeJob, list]:
    """A time job whose launch is a vendor library call (harness/worker_side/cublas.py) instead of a kernel:
    the same header without the kernel and its geometry, the same blobs without the CUBIN."""
    header, blobs = make_time_job(b"", "", layout, LaunchGeometry(grid=(1, 1, 1), block=(1, 1, 1), shared_bytes=0),
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
