"""Device buffers as both sides see them: guard bands, poisons, alignment, and output slots.

The parent (harness/jobs.py) and the GPU worker (execute.py, timed_loop.py, gpu.py) must agree on
these bytes exactly, so they are written once, here, on the worker's side of the line.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

GUARD_BYTES = 4096
# Two poisons per check: 0xFF makes float outputs NaN, 0x7F a huge finite value. An output that
# depends on what was in memory before the launch differs between the two runs.
POISON_BYTES = (0xFF, 0x7F)
TIMING_POISON = 0xFF


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


# Of the device's memory, at most, for the expected outputs a reference's worker keeps between jobs
# (harness/worker_side/device_judging.py); the parent counts it in a case's device memory (harness/footprint.py).
KEPT_SHARE = 0.25

# sha256-tree: the SHA-256 of the concatenated SHA-256 digests of the data's 1 MiB chunks (the last one
# shorter). A GPU worker computes it where a multi-GB output lies, a chunk per thread
# (harness/worker_side/judge_source.py); the host computes the same here.
TREE_CHUNK_BYTES = 1 << 20


def tree_sha256(array) -> str:
    data = memoryview(np.ascontiguousarray(array).view(np.uint8).reshape(-1)) if isinstance(array, np.ndarray) \
        else memoryview(array)
    chunks = b"".join(hashlib.sha256(data[i:i + TREE_CHUNK_BYTES]).digest()
                      for i in range(0, len(data), TREE_CHUNK_BYTES))
    return hashlib.sha256(chunks).hexdigest()


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
