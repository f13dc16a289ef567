"""What a GPU worker does with a job: buffers, poison, launches, events, read-back.

Runs inside the worker process only. It judges nothing: it returns raw outputs, guard bands and
input hashes, and the parent decides (harness/jobs.py, harness/referee.py).
"""

from __future__ import annotations

import statistics
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np
from harness.worker_side import fresh_inputs, gpu
from harness.worker_side.cuda_check import CudaError
from harness.worker_side.buffers import canary, digests_later, hashing_pool, pack_outputs, run_slots, same_bytes, sha256
from harness.worker_side.kernel_clock import KernelClock, busy_ms, launch_records, launch_spans_ms
from harness.worker_side.module_state import ModuleState, UnrestorableState

UTILITY_SOURCE = fresh_inputs.GENERATOR_SOURCE + r"""
template <typename T>
__device__ void count_equal(const T* data, unsigned long long n, T pattern, unsigned long long* count) {
    unsigned long long local = 0;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += stride)
        local += data[i] == pattern;
    for (int offset = 16; offset > 0; offset >>= 1)
        local += __shfl_down_sync(0xffffffffu, local, offset);
    if ((threadIdx.x & 31) == 0 && local) atomicAdd(count, local);
}
extern "C" __global__ void referee_count_1(const unsigned char* d, unsigned long long n, unsigned char p, unsigned long long* c) { count_equal(d, n, p, c); }
extern "C" __global__ void referee_count_2(const unsigned short* d, unsigned long long n, unsigned short p, unsigned long long* c) { count_equal(d, n, p, c); }
extern "C" __global__ void referee_count_4(const unsigned int* d, unsigned long long n, unsigned int p, unsigned long long* c) { count_equal(d, n, p, c); }
extern "C" __global__ void referee_count_8(const unsigned long long* d, unsigned long long n, unsigned long long p, unsigned long long* c) { count_equal(d, n, p, c); }
// Counts the 16-byte words (then the bytes of the tail) in which two buffers differ.
extern "C" __global__ void referee_differ(const unsigned char* a, const unsigned char* b, unsigned long long words,
                                          unsigned long long n, unsigned long long* count) {
    unsigned long long local = 0;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long first = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const uint4* a4 = (const uint4*)a;
    const uint4* b4 = (const uint4*)b;
    for (unsigned long long i = first; i < words; i += stride) {
        uint4 x = a4[i], y = b4[i];
        local += (x.x != y.x) | (x.y != y.y) | (x.z != y.z) | (x.w != y.w);
    }
    for (unsigned long long i = words * 16 + first; i < n; i += stride)
        local += a[i] != b[i];
    for (int offset = 16; offset > 0; offset >>= 1)
        local += __shfl_down_sync(0xffffffffu, local, offset);
    if ((threadIdx.x & 31) == 0 && local) atomicAdd(count, local);
}
extern "C" __global__ void referee_empty() {}
// Reads the flush buffer: L2 ends up holding its lines, clean, so that evicting them costs the timed
// kernel nothing (a memset would leave them dirty, to be written back during the kernel).
extern "C" __global__ void referee_flush(const uint4* data, unsigned long long n, unsigned int* sink) {
    uint4 acc = make_uint4(0, 0, 0, 0);
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += stride) {
        uint4 v = data[i];
        acc.x ^= v.x; acc.y ^= v.y; acc.z ^= v.z; acc.w ^= v.w;
    }
    if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x9E3779B9u) atomicAdd(sink, 1u);  // keeps the loads
}
// Keeps the GPU busy for `ns` nanoseconds so that the host can queue a whole timing loop ahead of
// it: per-launch events then measure the GPU, not the host's pace of submission.
extern "C" __global__ void referee_hold(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""
# Host time to queue one timed launch with its fresh inputs drawn and checked, its poison, flush and scan,
# generously (Python calls): the first hold's allowance. Later holds allow three times the pace the worker last measured, no more.
HOST_QUEUE_NS_PER_LAUNCH = 400_000
QUEUE_MARGIN = 3
MAX_HOLD_NS = 500_000_000
RESIDENT_MAX_BYTES = 8 << 30  # and a tenth of the device's memory at most
_COUNT_CTYPES = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}
# Queues one launch on the context's stream, given each array parameter's device pointer by name.
Launcher = Callable[[dict[str, int]], None]


class Utilities:
    """The referee's own kernels and the L2 flush buffer, made once per worker."""

    def __init__(self, context: gpu.Context, cubin: bytes, clock: KernelClock | None = None):
        self.context = context
        self.clock = clock if clock is not None and clock.available else None
        self.clock_note = None if self.clock else (clock.failure if clock is not None else "not asked for")
        self.module = gpu.Module(cubin)
        self.count = {size: self.module.function(f"referee_count_{size}") for size in (1, 2, 4, 8)}
        self.empty = self.module.function("referee_empty")
        self.differ_kernel = self.module.function("referee_differ")
        self.hold_kernel = self.module.function("referee_hold")
        self.flush_kernel = self.module.function("referee_flush")
        self.generate_kernel = self.module.function("referee_generate")
        # Reading twice the L2 size evicts everything a previous launch left there.
        self.flush_bytes = -(-2 * context.info.l2_bytes // 16) * 16
        self.flush = gpu.Allocation(self.flush_bytes + 16)  # the buffer, then the kernel's sink
        gpu.fill(self.flush.ptr, 0x5A, self.flush_bytes + 16, context.stream)
        self.flush_arguments = gpu.kernel_arguments([("ptr", self.flush.ptr), ("uint64", self.flush_bytes // 16),
                                                     ("ptr", self.flush.ptr + self.flush_bytes)])
        self.flush_blocks = context.info.sm_count * 4
        self.staging = Staging()
        self.resident = Resident(min(RESIDENT_MAX_BYTES, context.info.total_memory_bytes // 10))
        self.queue_ns_per_launch = HOST_QUEUE_NS_PER_LAUNCH
        self.event_overhead_ms, self.kernel_floor_ms = self._floor_ms()

    def flush_l2(self) -> None:
        gpu.launch(self.flush_kernel, (self.flush_blocks, 1, 1), (512, 1, 1), 0, self.context.stream,
                   self.flush_arguments)
        gpu.reset_persisting_l2()

    def hold(self, launches: int) -> None:
        """Occupy the GPU long enough for the host to queue `launches` timed launches behind it."""
        ns = min(MAX_HOLD_NS, 2_000_000 + launches * self.queue_ns_per_launch)
        gpu.launch(self.hold_kernel, (1, 1, 1), (1, 1, 1), 0, self.context.stream,
                   gpu.kernel_arguments([("uint64", ns)]))

    def queued(self, launches: int, seconds: float, kept_up: bool) -> None:
        """What the host's last queueing took: the next hold is sized on it (generously again if the
        host fell behind)."""
        measured = QUEUE_MARGIN * seconds * 1e9 / max(launches, 1)
        self.queue_ns_per_launch = int(min(HOST_QUEUE_NS_PER_LAUNCH, measured)) if kept_up else HOST_QUEUE_NS_PER_LAUNCH

    def generate(self, spec: dict, ptr: int, elements: int, key: int, stream: int, changed: int = 0) -> None:
        """Draw one input on the device (harness/worker_side/fresh_inputs.py); with `changed`, count instead (into
        that counter) the elements that no longer hold their draw."""
        blocks = max(1, min((elements + 255) // 256, self.context.info.sm_count * 8))
        args = gpu.kernel_arguments(fresh_inputs.generator_arguments(spec, ptr, elements, key, stream, changed))
        gpu.launch(self.generate_kernel, (blocks, 1, 1), (256, 1, 1), 0, self.context.stream, args)

    def count_equal(self, ptr: int, elements: int, itemsize: int, byte: int, counter: int) -> None:
        pattern = int.from_bytes(bytes([byte]) * itemsize, "little")
        blocks = max(1, min((elements + 255) // 256, self.context.info.sm_count * 8))
        args = gpu.kernel_arguments([("ptr", ptr), ("uint64", elements), (_COUNT_CTYPES[itemsize], pattern),
                                     ("ptr", counter)])
        gpu.launch(self.count[itemsize], (blocks, 1, 1), (256, 1, 1), 0, self.context.stream, args)

    def _floor_ms(self) -> tuple[float, float | None]:
        """What an empty kernel measures between two events, and on the kernel clock: the floor of
        any measurement on each."""
        pairs = [gpu.EventPair() for _ in range(50)]
        try:
            self.begin()
            self.hold(len(pairs))
            for tag, pair in enumerate(pairs, 1):
                gpu.record(pair.start, self.context.stream)
                self.tag(tag)
                gpu.launch(self.empty, (1, 1, 1), (1, 1, 1), 0, self.context.stream, 0)
                self.untag()
                gpu.record(pair.end, self.context.stream)
            self.context.synchronize()
            spans, _ = self.finish(list(range(1, len(pairs) + 1)))
            return (statistics.median(pair.elapsed_ms() for pair in pairs),
                    statistics.median(spans) if spans else None)
        finally:
            for pair in pairs:
                pair.destroy()

    def differ(self, a: int, b: int, nbytes: int, counter: int) -> None:
        """Count (into `counter`, on the stream) where two device buffers differ."""
        words = nbytes // 16 if a % 16 == 0 and b % 16 == 0 else 0
        blocks = max(1, min((nbytes // 16 + 255) // 256, self.context.info.sm_count * 8))
        args = gpu.kernel_arguments([("ptr", a), ("ptr", b), ("uint64", words), ("uint64", nbytes), ("ptr", counter)])
        gpu.launch(self.differ_kernel, (blocks, 1, 1), (256, 1, 1), 0, self.context.stream, args)

    # -- the kernel clock (harness/worker_side/kernel_clock.py), where it is available ----------------------
    def begin(self) -> None:
        """Forget the activity recorded so far: what follows belongs to one job."""
        if self.clock is not None:
            self.clock.collect()

    def tag(self, value: int) -> None:
        if self.clock is not None:
            self.clock.tag(value)

    def untag(self) -> None:
        if self.clock is not None:
            self.clock.untag()

    def finish(self, tags: list[int]) -> tuple[list[float] | None, float | None]:
        """(each tagged launch's kernel time in ms, or None; the GPU's busy ms since begin(), or None),
        once the work is done."""
        spans, busy, _ = self.finish_with_records(tags)
        return spans, busy

    def finish_with_records(self, tags: list[int]) -> tuple[list[float] | None, float | None, list | None]:
        """finish(), and each tagged launch's kernel records (name, grid, block), or None."""
        if self.clock is None:
            return None, None, None
        activities = self.clock.collect()
        return launch_spans_ms(activities, tags), busy_ms(activities), launch_records(activities, tags)


class Resident:
    """Input buffers kept on the device from job to job, by "NAME:SHA256" of their bytes: the parent
    need not send inputs the worker holds. A buffer is kept only if its bytes still hash to its key
    after the job, with a host copy of those bytes: the next job's check compares the device's bytes
    with it instead of hashing them again. The least recently used go first beyond `cap_bytes`, and
    all of them after a job that failed (the worker then says it holds none)."""

    def __init__(self, cap_bytes: int):
        self.cap_bytes = cap_bytes
        self._buffers: OrderedDict[str, tuple[gpu.GuardedBuffer, np.ndarray]] = OrderedDict()

    def take(self, key: str) -> tuple[gpu.GuardedBuffer, np.ndarray] | None:
        """(the buffer, the host copy of the bytes that hash to `key`), no longer held here; or None."""
        return self._buffers.pop(key, None)

    def keep(self, key: str, buffer: gpu.GuardedBuffer, host: np.ndarray) -> None:
        self._buffers[key] = (buffer, host)
        while self._buffers and sum(b.nbytes for b, _ in self._buffers.values()) > self.cap_bytes:
            self._buffers.popitem(last=False)[1][0].free()

    def clear(self) -> None:
        while self._buffers:
            self._buffers.popitem()[1][0].free()

    def making_room(self, allocate: Callable, *args):
        """allocate(*args); out of device memory, again once the buffers kept here are freed: the
        referee's own keeping must never be why a job runs out."""
        try:
            return allocate(*args)
        except CudaError as exc:
            if not gpu.is_out_of_memory(exc) or not self._buffers:
                raise
            self.clear()
            return allocate(*args)

    def keys(self) -> list[str]:
        return sorted(self._buffers)


class ResidentMissing(Exception):
    """The job names an input as held by the worker, which no longer holds it."""


class Staging:
    """Host memory reused from job to job for read-backs: fresh memory costs a page fault per 4 KiB."""

    def __init__(self):
        self._buffer = np.empty(0, dtype=np.uint8)

    def take(self, nbytes: int) -> np.ndarray:
        if self._buffer.nbytes < nbytes:
            self._buffer = np.empty(nbytes, dtype=np.uint8)
        return self._buffer[:nbytes]


class JobFailed(Exception):
    """The candidate could not be run: a CUDA error (sticky or not) or a bad signature."""

    def __init__(self, status: str, error: str, detail: str):
        super().__init__(detail)
        self.status, self.error, self.detail = status, error, detail


class _Job:
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
            raise JobFailed("launch_error", exc.name, f"the CUBIN did not load: {exc}") from None
        self.function = self._function(header["kernel"])
        try:
            self.state = ModuleState(self.module, cubin, self.context.stream)
        except UnrestorableState as exc:
            raise JobFailed("launch_error", "UNRESTORABLE_STATE", str(exc)) from None
        self.grid, self.block = tuple(header["launch"]["grid"]), tuple(header["launch"]["block"])
        self.shared_bytes = int(header["launch"]["shared_bytes"])
        self._prepare_shared()

    def _function(self, name: str):
        try:
            function = self.module.function(name)
        except CudaError as exc:
            raise JobFailed("launch_error", exc.name, f"kernel '{name}' is not in the module") from None
        sizes = gpu.parameter_sizes(function)
        wanted = [8 if p["kind"] != "scalar" else _scalar_size(p["dtype"]) for p in self.params]
        if sizes is not None and sizes != wanted:
            raise JobFailed("launch_error", "SIGNATURE_MISMATCH",
                            f"kernel '{name}' takes parameters of {sizes} bytes; the task declares {wanted}")
        return function

    def _prepare_shared(self) -> None:
        try:
            gpu.allow_dynamic_shared(self.function, self.shared_bytes)
        except (CudaError, OverflowError, ValueError) as exc:
            limit = self.context.info.max_shared_per_block_optin
            raise JobFailed("launch_error", getattr(exc, "name", type(exc).__name__),
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

    def draw(self, utilities: "Utilities", set_index: int, key: int, launch: int, changed: int = 0) -> None:
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
        return sum(p["nbytes"] for p in self.arrays if p["kind"] == "input") * len(self.buffers)

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


def run(context: gpu.Context, header: dict, blobs: list[bytes],
        utilities: Utilities | None = None) -> tuple[dict, list[bytes]]:
    """One launch per poison on the same inputs; the outputs of each, then the evidence."""
    if utilities is not None:
        utilities.begin()
    job = _Job(context, header, blobs[0], sets=1, resident=utilities.resident if utilities is not None else None)
    try:
        job.upload_inputs(0, blobs[1:])
        outputs: list[np.ndarray] = []
        for byte in header["poisons"]:
            job.poison(0, byte)
            job.launch(0)
            context.synchronize()
            outputs += job.read_outputs(0)
        output_hashes = digests_later(outputs)  # hashed while the inputs are read back and checked
        staging = utilities.staging if utilities is not None else Staging()
        hashes, guards = job.evidence(staging.take(job.input_bytes()))
        job.keep_inputs(hashes)
        fields, sent = pack_outputs(outputs, run_slots(len(header["poisons"]), len(job.outputs(0))), {},
                                    output_hashes())
        gpu_busy_ms = utilities.finish([])[1] if utilities is not None else None
        resident = utilities.resident.keys() if utilities is not None else []
        return {"status": "ok", "input_sha256": hashes, "gpu_busy_ms": gpu_busy_ms, "resident_inputs": resident,
                **fields}, sent + guards
    finally:
        job.close()


def draw_run(context: gpu.Context, header: dict, blobs: list[bytes],
             utilities: Utilities) -> tuple[dict, list[bytes]]:
    """The reference's outputs for inputs drawn on the device: one launch per launch number in
    header["draws"]["launches"], each on the inputs that launch of a time job drew with the same key
    (harness/worker_side/fresh_inputs.py). The expected outputs of a timing's audited launches."""
    utilities.begin()
    job = _Job(context, header, blobs[0], sets=1, resident=utilities.resident)
    try:
        job.upload_inputs(0, blobs[1:])
        key, outputs = header["draws"]["key"], []
        for launch in header["draws"]["launches"]:
            job.draw(utilities, 0, key, launch)
            job.poison(0, header["poisons"][0])
            job.launch(0)
            context.synchronize()
            outputs += job.read_outputs(0)
        output_hashes = digests_later(outputs)
        hashes, guards = job.evidence(utilities.staging.take(job.input_bytes()))
        job.keep_inputs(hashes)
        fields, sent = pack_outputs(outputs, [f"{launch}/{j}" for launch in header["draws"]["launches"]
                                              for j in range(len(job.outputs(0)))], {}, output_hashes())
        return {"status": "ok", "input_sha256": hashes, "gpu_busy_ms": utilities.finish([])[1],
                "resident_inputs": utilities.resident.keys(), **fields}, sent + guards
    finally:
        job.close()
