"""A keyed MAC over the evidence of each timed launch, so that a repair of it is detected.

The evidence context (harness/worker_side/evidence.py) is out of the candidate's sight but not out of its reach: a
kernel that finds an address there can write it. So, in stream order right after each timed launch, before the next
one, the referee's MAC kernel seals what the evidence should hold: the launch's counts and, for an audited launch, its
outputs as they are being snapshotted. Each launch has keys of its own, derived on the host from a secret the worker
draws per job; they reach the device only as the MAC kernel's launch arguments, which no later launch can read. Once
the timed launches are done, the worker recomputes every MAC over what the evidence context holds (the counts on the
host, the snapshots with the same kernel run in the evidence context, where no candidate code runs) and names each
launch whose evidence no longer matches its seal.

H(key, k2, bytes): the bytes as little-endian 32-bit words w_i (the tail padded with zeros), in 64-bit wrapping
arithmetic, H = sum_i (w_i XOR k2) * m_i + splitmix64(k2 + length), with m_i = splitmix64(key + i) | 1.
Why a change is caught: changing words turns H by sum_i d_i * m_i, where each d_i, the difference of two values that
agree on their upper 32 bits, is nonzero with |d_i| < 2^32, so d_i = 2^t * odd with t < 32. Fixing every other term,
d_j * m_j must hit one value mod 2^64: at most 2^t of the 2^63 odd m_j do, and m_j is unknown (a keyed splitmix64),
so the change goes unseen with probability at most 2^31 / 2^63 = 2^-32; a change of one word (d * m, m odd, never
0 mod 2^64) is always seen. Wrapping addition is order-free, so the kernel's atomic sum is deterministic.
"""

from __future__ import annotations

import hashlib
import secrets

import numpy as np

from harness.worker_side import gpu
from harness.worker_side.cuda_check import CudaError

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
COUNTS_BYTES = 16  # a launch's two counts (uint64 each), then its counts' MAC, then its outputs' MAC
RECORD_BYTES = 32

MAC_SOURCE = r"""
__device__ __forceinline__ unsigned long long referee_splitmix64(unsigned long long x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
// Adds H(key, k2, data) to *mac (harness/worker_side/evidence_mac.py): each thread sums its words, one atomic per warp.
extern "C" __global__ void referee_mac(const unsigned char* data, unsigned long long nbytes, unsigned long long key,
                                       unsigned long long k2, unsigned long long* mac) {
    unsigned long long words = (nbytes + 3) / 4, local = 0;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long first = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    bool aligned = ((unsigned long long)data & 3ull) == 0;
    for (unsigned long long i = first; i < words; i += stride) {
        unsigned int w = 0;
        if (aligned && 4 * i + 4 <= nbytes) {
            w = ((const unsigned int*)data)[i];
        } else {
            for (unsigned int b = 0; b < 4; ++b)
                if (4 * i + b < nbytes) w |= (unsigned int)data[4 * i + b] << (8 * b);
        }
        local += ((unsigned long long)w ^ k2) * (referee_splitmix64(key + i) | 1ull);
    }
    if (first == 0) local += referee_splitmix64(k2 + nbytes);
    for (int offset = 16; offset > 0; offset >>= 1)
        local += __shfl_down_sync(0xffffffffu, local, offset);
    if ((threadIdx.x & 31) == 0) atomicAdd(mac, local);
}
"""


def splitmix64(x):
    """splitmix64's output for state `x` (an int, or a uint64 array), wrapping as the kernel does."""
    if isinstance(x, np.ndarray):
        x = x + np.uint64(GOLDEN)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))
    x = (x + GOLDEN) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def mac(data: np.ndarray, key: int, k2: int) -> int:
    """H(key, k2, the bytes of `data`) on the host, as referee_mac computes it."""
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    padded = np.zeros(-(-raw.size // 4) * 4, dtype=np.uint8)
    padded[:raw.size] = raw
    words = padded.view("<u4").astype(np.uint64)
    with np.errstate(over="ignore"):
        m = splitmix64(np.uint64(key) + np.arange(words.size, dtype=np.uint64)) | np.uint64(1)
        total = int(np.sum((words ^ np.uint64(k2)) * m, dtype=np.uint64))
    return (total + splitmix64((k2 + raw.size) & MASK)) & MASK


class Seal:
    """The MACs of one time job's launches: the keys (from a secret drawn here, never sent anywhere), the kernel that
    seals each launch's record on the candidate's stream, and the check of the evidence against the seals."""

    def __init__(self, utilities, evidence):
        self.utilities, self.evidence = utilities, evidence
        self.secret = secrets.token_bytes(32)

    def keys(self, launch: int, part: int) -> tuple[int, int]:
        """(key, k2) of one part of a launch's record: 0 its counts, 1 + j its output j. A keyed hash, as the
        draws' keys (harness/worker_side/fresh_inputs.py), so that one launch's keys say nothing of another's."""
        message = b"evidence-mac" + launch.to_bytes(8, "little") + part.to_bytes(8, "little")
        digest = hashlib.blake2b(message, key=self.secret, digest_size=16).digest()
        return int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:], "little")

    def queue(self, launch: int, record: int, outputs: list[tuple[int, int]] | None) -> None:
        """Seal the counts at `record` (already queued there) into its third word and, for an audited launch, its
        `outputs` ((device address, bytes) each) into its fourth; the record must be zero there."""
        self.utilities.mac(record, COUNTS_BYTES, *self.keys(launch, 0), record + 16)
        for j, (ptr, nbytes) in enumerate(outputs or []):
            self.utilities.mac(ptr, nbytes, *self.keys(launch, 1 + j), record + 24)

    def verify(self, records: np.ndarray, snapshots: dict[int, list[tuple[int, int]]]) -> list[str]:
        """The launches whose evidence no longer matches its seal: `records` (launches x 4 uint64, as downloaded),
        `snapshots` per audited launch its (evidence address, bytes) per output."""
        found = [f"launch {i}: its counts" for i in range(len(records))
                 if mac(records[i, :2], *self.keys(i, 0)) != int(records[i, 2])]
        sealed = self.snapshot_macs(snapshots)
        found += [f"launch {i}: its audited outputs" for i in sorted(snapshots) if sealed[i] != int(records[i, 3])]
        return found

    def snapshot_macs(self, snapshots: dict[int, list[tuple[int, int]]]) -> dict[int, int]:
        """Each audited launch's MAC over its snapshots, on the device in the evidence context; where that context
        cannot run the kernel, over the snapshots downloaded."""
        parts = {i: [(ptr, nbytes, *self.keys(i, 1 + j)) for j, (ptr, nbytes) in enumerate(outputs)]
                 for i, outputs in snapshots.items()}
        if not parts:
            return {}
        try:
            return dict(zip(parts, self.evidence.macs(list(parts.values()))))
        except (CudaError, RuntimeError):
            return {i: sum(mac(self.evidence.download(ptr, nbytes), key, k2) for ptr, nbytes, key, k2 in group) & MASK
                    for i, group in parts.items()}


def launch_mac(function, ptr: int, nbytes: int, key: int, k2: int, out: int, stream, sm_count: int) -> None:
    """Queue referee_mac over `nbytes` at `ptr`, added into the uint64 at `out`: bandwidth bound, a block per 256
    words up to eight per SM."""
    blocks = max(1, min((nbytes // 4 + 255) // 256, sm_count * 8))
    args = gpu.kernel_arguments([("ptr", ptr), ("uint64", nbytes), ("uint64", key), ("uint64", k2), ("ptr", out)])
    gpu.launch(function, (blocks, 1, 1), (256, 1, 1), 0, stream, args)
