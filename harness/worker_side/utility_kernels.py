"""The referee's own kernels in a GPU worker: input generators, poison counts, byte comparisons, the
L2 flush, the hold that lets launches queue up, and the kernel clock's bracket. Made once per worker."""

from __future__ import annotations

import statistics

from harness.worker_side import evidence_mac, fresh_inputs, gpu
from harness.worker_side.buffers import KEPT_SHARE
from harness.worker_side.device_judging import Held, Kept
from harness.worker_side.kernel_clock import KernelClock, busy_ms, launch_records, launch_spans_ms
from harness.worker_side.resident import RESIDENT_MAX_BYTES, Resident, Staging

UTILITY_SOURCE = fresh_inputs.GENERATOR_SOURCE + evidence_mac.MAC_SOURCE + r"""
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
_COUNT_CTYPES = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


class Utilities:
    """The referee's own kernels and the L2 flush buffer, made once per worker."""

    def __init__(self, context: gpu.Context, cubin: bytes, clock: KernelClock | None = None):
        self.context = context
        self.clock = clock if clock is not None and clock.available else None
        self.clock_note = None if self.clock else (clock.failure if clock is not None else "not asked for")
        self.cubin = bytes(cubin)  # loaded again in the evidence context, for its MACs (harness/worker_side/evidence.py)
        self.module = gpu.Module(cubin)
        self.count = {size: self.module.function(f"referee_count_{size}") for size in (1, 2, 4, 8)}
        self.empty = self.module.function("referee_empty")
        self.differ_kernel = self.module.function("referee_differ")
        self.hold_kernel = self.module.function("referee_hold")
        self.flush_kernel = self.module.function("referee_flush")
        self.generate_kernel = self.module.function("referee_generate")
        self.mac_kernel = self.module.function("referee_mac")
        # Reading twice the L2 size evicts everything a previous launch left there.
        self.flush_bytes = -(-2 * context.info.l2_bytes // 16) * 16
        self.flush = gpu.Allocation(self.flush_bytes + 16)  # the buffer, then the kernel's sink
        gpu.fill(self.flush.ptr, 0x5A, self.flush_bytes + 16, context.stream)
        self.flush_arguments = gpu.kernel_arguments([("ptr", self.flush.ptr), ("uint64", self.flush_bytes // 16),
                                                     ("ptr", self.flush.ptr + self.flush_bytes)])
        self.flush_blocks = context.info.sm_count * 4
        self.staging = Staging()
        self.resident = Resident(min(RESIDENT_MAX_BYTES, context.info.total_memory_bytes // 10))
        # Outputs judged on the device (harness/worker_side/device_judging.py): a candidate's, held until its
        # next job; the reference's, kept as expected outputs; the judging kernels, made on first use.
        self.held = Held()
        self.kept = Kept(int(KEPT_SHARE * context.info.total_memory_bytes))
        self.judges = None
        self.evidence = None  # the evidence context (harness/worker_side/evidence.py), made by the first timing
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

    def mac(self, ptr: int, nbytes: int, key: int, k2: int, out: int) -> None:
        """Add the keyed MAC of `nbytes` at `ptr` into the uint64 at `out`, on the stream
        (harness/worker_side/evidence_mac.py)."""
        evidence_mac.launch_mac(self.mac_kernel, ptr, nbytes, key, k2, out, self.context.stream,
                                self.context.info.sm_count)

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
