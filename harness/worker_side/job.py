"""One job's buffers, module and function in a GPU worker: upload, poison, draw, launch, read back,
and the evidence the parent judges (input hashes, guard bands). Everything is released in close()."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

from harness.worker_side import fresh_inputs, gpu
from harness.worker_side.cuda_check import CudaError
from harness.worker_side.buffers import canary, hashing_pool, same_bytes, sha256
from harness.worker_side.module_state import ModuleState, UnrestorableState
from harness.worker_side.resident import Resident, ResidentMissing
from harness.worker_side.utility_kernels import Utilities
from sandbox.answers import Status

# Queues one launch on the context's stream, given each array parameter's device pointer by name.
Launcher = Callable[[dict[str, int]], None]


class JobFailed(Exception):
    """The candidate could not be run: a CUDA error (sticky or not) or a bad signature."""

    def __init__(self, status: str, error: str, detail: str):
        super().__init__(detail)
        self.status, self.error, self.detail = status, error, detail


class Job:
    """Buffers, module and function of one job; everything is released in close()."""

    def __init__(self, context: gpu.Context, header: dict, cubin: bytes | None, sets: int,
                 launcher: Launcher | None = None, resident: Resident | None = None):
        self.context = context
        self.header = header
        self.params = header["params"]
        self.arrays = [p for p in self.params if p["kind"] != "scalar"]
        self.module = None
        self.state: ModuleState | None = None  # the module's writable globals, restored before every launch
        self.launcher = launcher  # a library call (harness/worker_side/cublas.py) instead of the CUBIN's kernel
        self.resident = resident
        # Per set, per input: {"key": "NAME:SHA256" or None, "sent": whether its bytes come with the job}
        self.input_entries = header["inputs"]
        if len(self.input_entries) != sets:
            raise ValueError(f"the job names the inputs of {len(self.input_entries)} sets, not {sets}")
        self.buffers: list[list[gpu.GuardedBuffer]] = []
        self.kept: set[int] = set()  # id() of buffers handed to `resident`: not freed here
        # id() of an input buffer -> the bytes it must still hold after the job and their sha256 (or the
        # hashing of them under way): the bytes sent with the job, or the host copy of a kept buffer's
        self.references: dict[int, tuple[np.ndarray, str | Future]] = {}
        self.host_copies: dict[int, np.ndarray] = {}  # id() of a buffer kept from an earlier job -> its host copy
        self.read: dict[int, np.ndarray] = {}  # id() of an input buffer -> its bytes as read back after the job
        try:
            self._prepare(header, cubin, sets)
        except BaseException:
            self.close()  # a job refused while it was being set up must not leak the module or buffers
            raise

    def _prepare(self, header: dict, cubin: bytes | None, sets: int) -> None:
        if self.launcher is None:
            self._prepare_kernel(header, cubin)
        seed, guard = header["guard_seed"], header["guard_bytes"]
        for s in range(sets):
            row = []
            self.buffers.append(row)
            entries = iter(self.input_entries[s])
            for i, p in enumerate(self.arrays):
                head, tail = canary(seed, s * len(self.arrays) + i, guard)
                entry = next(entries) if p["kind"] == "input" else None
                if entry is not None and not entry["sent"] and not entry.get("drawn"):
                    taken = self.resident.take(entry["key"]) if self.resident is not None else None
                    if taken is None or taken[0].nbytes != p["nbytes"]:
                        if taken is not None:
                            taken[0].free()
                        raise ResidentMissing(entry["key"])
                    held, host = taken
                    self.references[id(held)] = (host, entry["key"].rsplit(":", 1)[1])
                    self.host_copies[id(held)] = host
                    held.rearm(head, tail)
                    row.append(held)
                else:
                    row.append(self._allocate(p["nbytes"], guard, head, tail))

    def _allocate(self, nbytes: int, guard: int, head: np.ndarray, tail: np.ndarray) -> gpu.GuardedBuffer:
        if self.resident is None:
            return gpu.GuardedBuffer(nbytes, guard, head, tail)
        return self.resident.making_room(gpu.GuardedBuffer, nbytes, guard, head, tail)

    def _prepare_kernel(self, header: dict, cubin: bytes) -> None:
        try:
            self.module = gpu.Module(cubin)
        except CudaError as exc:
            if gpu.is_out_of_memory(exc):
                raise  # the worker reports it as out of memory, with what is left
            raise JobFailed(Status.LAUNCH_ERROR, exc.name, f"the CUBIN did not load: {exc}") from None
        self.function = self._function(header["kernel"])
        try:
            self.state = ModuleState(self.module, cubin, self.context.stream)
        except UnrestorableState as exc:
            raise JobFailed(Status.LAUNCH_ERROR, "UNRESTORABLE_STATE", str(exc)) from None
        self.grid, self.block = tuple(header["launch"]["grid"]), tuple(header["launch"]["block"])
        self.shared_bytes = int(header["launch"]["shared_bytes"])
        self._prepare_shared()

    def _function(self, name: str):
        try:
            function = self.module.function(name)
        except CudaError as exc:
            raise JobFailed(Status.LAUNCH_ERROR, exc.name, f"kernel '{name}' is not in the module") from None
        sizes = gpu.parameter_sizes(function)
        wanted = [8 if p["kind"] != "scalar" else _scalar_size(p["dtype"]) for p in self.params]
        if sizes is not None and sizes != wanted:
            raise JobFailed(Status.LAUNCH_ERROR, "SIGNATURE_MISMATCH",
                            f"kernel '{name}' takes parameters of {sizes} bytes; the task declares {wanted}")
        return function

    def _prepare_shared(self) -> None:
        try:
            gpu.allow_dynamic_shared(self.function, self.shared_bytes)
        except (CudaError, OverflowError, ValueError) as exc:
            limit = self.context.info.max_shared_per_block_optin
            raise JobFailed(Status.LAUNCH_ERROR, getattr(exc, "name", type(exc).__name__),
                            f"{self.shared_bytes} bytes of dynamic shared memory refused (device limit {limit})") from None

    def sent_inputs(self, set_index: int) -> int:
        return sum(e["sent"] for e in self.input_entries[set_index])

    def upload_inputs(self, set_index: int, blobs: list[bytes]) -> None:
        """The set's inputs that came with the job (the others are already in place). Each one's bytes
        are hashed on the hashing threads while the job runs: after it, the device's bytes are
        compared with them (evidence())."""
        inputs = [(i, p) for (i, p), e in zip(((i, p) for i, p in enumerate(self.arrays) if p["kind"] == "input"),
                                              self.input_entries[set_index]) if e["sent"]]
        for (i, p), blob in zip(inputs, blobs, strict=True):
            if len(blob) != p["nbytes"]:
                raise ValueError(f"input {p['name']}: {len(blob)} bytes, expected {p['nbytes']}")
            sent = np.frombuffer(blob, dtype=np.uint8)
            buffer = self.buffers[set_index][i]
            gpu.upload(buffer.ptr, sent)
            # Queued on the hashing threads before evidence() queues the comparison that waits for it:
            # the threads take work in order, so the hash is running or done by then.
            self.references[id(buffer)] = (sent, hashing_pool().submit(sha256, sent))

    def outputs(self, set_index: int) -> list[tuple[int, dict, gpu.GuardedBuffer]]:
        return [(i, p, self.buffers[set_index][i]) for i, p in enumerate(self.arrays) if p["kind"] == "output"]

    def poison(self, set_index: int, byte: int) -> None:
        """Ready the set for a launch: the module's writable globals back to their initial image (no state
        carries from launch to launch) and every output filled with `byte`. Outside any timed window."""
        if self.state is not None:
            self.state.restore(self.context.stream)
        for _, p, buffer in self.outputs(set_index):
            gpu.fill(buffer.ptr, byte, p["nbytes"], self.context.stream)

    def drawn_inputs(self, set_index: int) -> list[tuple[dict, dict, gpu.GuardedBuffer, int]]:
        """(param, draw spec, buffer, input index) of each input drawn on the device in this job."""
        inputs = [(i, p) for i, p in enumerate(self.arrays) if p["kind"] == "input"]
        return [(p, entry["drawn"], self.buffers[set_index][i], n)
                for n, ((i, p), entry) in enumerate(zip(inputs, self.input_entries[set_index])) if entry.get("drawn")]

    def draw(self, utilities: Utilities, set_index: int, key: int, launch: int, changed: int = 0) -> None:
        """Draw the set's device-drawn inputs for `launch` of the job keyed `key` (or, with `changed`, count
        what no longer holds that draw). Only that launch's own key goes to the device."""
        own_key = fresh_inputs.launch_key(key, launch)
        for p, spec, buffer, n in self.drawn_inputs(set_index):
            utilities.generate(spec, buffer.ptr, p["nbytes"] // p["itemsize"], own_key, n, changed)

    def launch(self, set_index: int) -> None:
        if self.launcher is not None:
            self.launcher({p["name"]: buffer.ptr for p, buffer in zip(self.arrays, self.buffers[set_index])})
            return
        values = []
        arrays = iter(self.buffers[set_index])
        for p in self.params:
            values.append(("ptr", next(arrays).ptr) if p["kind"] != "scalar" else (p["dtype"], p["value"]))
        gpu.launch(self.function, self.grid, self.block, self.shared_bytes, self.context.stream,
                   gpu.kernel_arguments(values))

    def read_outputs(self, set_index: int) -> list[np.ndarray]:
        return [gpu.download(buffer.ptr, p["nbytes"]) for _, p, buffer in self.outputs(set_index)]

    def input_bytes(self) -> int:
        """Host bytes the inputs' evidence reads back: every input of every set but those drawn on the device
        (checked against their draw there instead)."""
        total = 0
        for s, row in enumerate(self.buffers):
            drawn = {id(buffer) for _, _, buffer, _ in self.drawn_inputs(s)}
            total += sum(p["nbytes"] for p, buffer in zip(self.arrays, row)
                         if p["kind"] == "input" and id(buffer) not in drawn)
        return total

    def function_name(self) -> str | None:
        return None if self.launcher is not None else self.header["kernel"]

    def evidence(self, host: np.ndarray) -> tuple[list[dict], list[bytes]]:
        """Input hashes per set and every guard band, read back after all launches into `host`
        (input_bytes() long). Each input is compared byte for byte with the bytes it must hold (those
        sent with the job, hashed while it ran, or the host copy of a kept buffer, which hashed to its
        key when it was kept) and takes their hash where it holds them; one that does not is hashed.
        Each input is compared on the hashing threads while the next one is read back."""
        pool, pending, offset = hashing_pool(), [], 0
        for s, row in enumerate(self.buffers):
            drawn = {id(buffer) for _, _, buffer, _ in self.drawn_inputs(s)}
            for p, buffer in zip(self.arrays, row):
                if p["kind"] != "input" or id(buffer) in drawn:  # drawn inputs are checked by their draw
                    continue
                view = host[offset:offset + p["nbytes"]]
                offset += p["nbytes"]
                gpu.download_into(buffer.ptr, view)
                self.read[id(buffer)] = view
                pending.append((s, p["name"], pool.submit(_digest, view, self.references.get(id(buffer)))))
        hashes: list[dict] = [{} for _ in self.buffers]
        for s, name, digest in pending:
            hashes[s][name] = digest.result()
        guards = []
        for row in self.buffers:
            for buffer in row:
                head, tail = buffer.guards()
                guards += [head.tobytes(), tail.tobytes()]
        return hashes, guards

    def keep_inputs(self, hashes: list[dict]) -> None:
        """Hand the inputs whose bytes still hash to their key to `resident`, for the next jobs, each
        with a host copy of those bytes (after evidence())."""
        if self.resident is None:
            return
        for s, row in enumerate(self.buffers):
            entries = iter(self.input_entries[s])
            for p, buffer in zip(self.arrays, row):
                if p["kind"] != "input":
                    continue
                key = next(entries)["key"]
                if key is not None and key == f"{p['name']}:{hashes[s].get(p['name'])}":
                    host = self.host_copies.get(id(buffer))
                    self.resident.keep(key, buffer, host if host is not None else self.read[id(buffer)].copy())
                    self.kept.add(id(buffer))

    def close(self) -> None:
        if self.context.stuck:
            return  # a kernel still runs: freeing would wait for it, and the worker ends anyway
        if self.state is not None:
            self.state.free()
        for row in self.buffers:
            for buffer in row:
                if id(buffer) not in self.kept:
                    buffer.free()
        if self.module is not None:
            self.module.unload()


def _digest(view: np.ndarray, reference: tuple[np.ndarray, str | Future] | None) -> str:
    """The sha256 of an input read back: that of the bytes it must hold (`reference`: the bytes and
    their sha256, or its hashing under way), without hashing it again, where it holds them."""
    if reference is not None and same_bytes(view, reference[0]):
        digest = reference[1]
        return digest.result() if isinstance(digest, Future) else digest
    return sha256(view)


def _scalar_size(dtype: str) -> int:
    return {"int8": 1, "uint8": 1, "float16": 2, "bfloat16": 2, "int32": 4, "uint32": 4, "float32": 4,
            "int64": 8, "float64": 8}[dtype]
