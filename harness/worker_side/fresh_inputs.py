"""Fresh inputs for every timed launch, drawn on the device from a secret key.

A kernel that remembers answers (by input content, pointer, shape or a launch counter) is fast only
where an input comes back. Under timing, every launch and warm-up therefore gets inputs no launch has
seen: each input is drawn from its task generator (uniform, normal, integers) by the referee's own
counter-based generator (Philox4x32-10), keyed by a key of its own for each launch, derived on the
host (launch_key) from a secret 64-bit key per job (drawn with `secrets` in the parent, never from a
case's public seed) and the launch's number; the input's index is its stream. The key of a launch
reaches the device only as an argument of the draws queued for that launch: no kernel launched
earlier, warm-ups included, could learn a later launch's inputs from it. The draw is a pure function
of (job key, launch, input, element): the reference worker draws the very same inputs for the
audited launches, and after each timed launch the candidate's worker checks, with the same kernel,
that the inputs still hold their draw (no array-sized copy is kept).

The values follow the task's distributions, not numpy's bit streams: the visible cases, drawn on the
host from their seeds, are another sample of the same distributions.

This module is shared by the parent (wire specs) and the worker (the CUDA source and its launch
arguments); it imports nothing else of the project.
"""

from __future__ import annotations

import hashlib

import ml_dtypes
import numpy as np

# Element types the generator writes, by task dtype name.
DTYPE_CODES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3, "int8": 4, "uint8": 5,
               "int32": 6, "uint32": 7, "int64": 8}
DISTRIBUTIONS = {"uniform": 0, "normal": 1, "integers": 2}

GENERATOR_SOURCE = r"""
// Philox4x32-10 (Salmon et al., SC'11): four 32-bit words from a 128-bit counter and a 64-bit key.
__device__ __forceinline__ uint4 referee_philox(uint4 ctr, uint2 key) {
    #pragma unroll
    for (int round = 0; round < 10; ++round) {
        unsigned int hi0 = __umulhi(0xD2511F53u, ctr.x), lo0 = 0xD2511F53u * ctr.x;
        unsigned int hi1 = __umulhi(0xCD9E8D57u, ctr.z), lo1 = 0xCD9E8D57u * ctr.z;
        ctr = make_uint4(hi1 ^ ctr.y ^ key.x, lo1, hi0 ^ ctr.w ^ key.y, lo0);
        key.x += 0x9E3779B9u; key.y += 0xBB67AE85u;
    }
    return ctr;
}
__device__ __forceinline__ double referee_unit(unsigned int a, unsigned int b) {  // [0, 1), 53 bits
    return ((double)(a >> 5) * 67108864.0 + (double)(b >> 6)) * (1.0 / 9007199254740992.0);
}
__device__ __forceinline__ unsigned short referee_half_bits(float f) {  // round to nearest even
    unsigned int x = __float_as_uint(f), sign = (x >> 16) & 0x8000u;
    unsigned int mag = x & 0x7FFFFFFFu;
    if (mag >= 0x47800000u) return (unsigned short)(sign | (mag > 0x7F800000u ? 0x7E00u : 0x7C00u));
    if (mag < 0x38800000u) {  // subnormal or zero in half precision
        if (mag < 0x33000000u) return (unsigned short)sign;
        unsigned int e = mag >> 23, m = (mag & 0x7FFFFFu) | 0x800000u, shift = 126u - e;
        unsigned int r = m >> shift, rest = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
        if (rest > halfway || (rest == halfway && (r & 1u))) ++r;
        return (unsigned short)(sign | r);
    }
    unsigned int r = ((mag - 0x38000000u) >> 13), rest = mag & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (r & 1u))) ++r;
    return (unsigned short)(sign | r);
}
__device__ __forceinline__ unsigned short referee_bf16_bits(float f) {  // round to nearest even
    unsigned int x = __float_as_uint(f);
    return (unsigned short)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}
// Draws element i of one input; dist 0 uniform [p0, p1), 1 normal (mean p0, std p1), 2 integers
// [ilow, ilow + irange). Writes it (check == 0), or counts where the array no longer holds it.
extern "C" __global__ void referee_generate(unsigned char* data, unsigned long long n, int dtype, int dist,
                                            double p0, double p1, long long ilow, unsigned long long irange,
                                            unsigned long long key, unsigned long long stream,
                                            unsigned long long* changed) {
    unsigned long long local = 0;
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    uint2 k = make_uint2((unsigned int)key, (unsigned int)(key >> 32));
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += step) {
        uint4 r = referee_philox(make_uint4((unsigned int)i, (unsigned int)(i >> 32),
                                            (unsigned int)stream, (unsigned int)(stream >> 32)), k);
        double v = 0.0;
        long long whole = 0;
        // Rounded step by step (no fused multiply-add), as numpy computes it on the host.
        if (dist == 0) {
            v = __dadd_rn(p0, __dmul_rn(p1 - p0, referee_unit(r.x, r.y)));
        } else if (dist == 1) {
            double u1 = 1.0 - referee_unit(r.x, r.y), u2 = referee_unit(r.z, r.w);  // u1 in (0, 1]
            double radius = sqrt(__dmul_rn(-2.0, log(u1))), angle = cos(__dmul_rn(6.283185307179586, u2));
            v = __dadd_rn(p0, __dmul_rn(__dmul_rn(p1, radius), angle));
        } else {
            unsigned long long bits = ((unsigned long long)r.x << 32) | r.y;
            whole = ilow + (long long)(bits % irange);
            v = (double)whole;
        }
        if (dist != 2) whole = (long long)v;  // numpy's astype: toward zero
        unsigned long long word;
        int size;
        switch (dtype) {
            case 0: word = __float_as_uint((float)v); size = 4; break;
            case 1: word = (unsigned long long)__double_as_longlong(v); size = 8; break;
            case 2: word = referee_half_bits((float)v); size = 2; break;
            case 3: word = referee_bf16_bits((float)v); size = 2; break;
            case 4: case 5: word = (unsigned char)whole; size = 1; break;
            case 6: case 7: word = (unsigned int)whole; size = 4; break;
            default: word = (unsigned long long)whole; size = 8; break;
        }
        unsigned char* at = data + i * size;
        if (changed == 0) {
            if (size == 1) *at = (unsigned char)word;
            else if (size == 2) *(unsigned short*)at = (unsigned short)word;
            else if (size == 4) *(unsigned int*)at = (unsigned int)word;
            else *(unsigned long long*)at = word;
        } else {
            unsigned long long held = size == 1 ? *at : size == 2 ? *(unsigned short*)at
                                    : size == 4 ? *(unsigned int*)at : *(unsigned long long*)at;
            local += held != word;
        }
    }
    if (changed != 0) {
        for (int offset = 16; offset > 0; offset >>= 1)
            local += __shfl_down_sync(0xffffffffu, local, offset);
        if ((threadIdx.x & 31) == 0 && local) atomicAdd(changed, local);
    }
}
"""


def draw_spec(kind: str, dtype: str, low=None, high=None, mean=None, std=None) -> dict:
    """The wire form of one input's generator: what the worker needs to draw it."""
    if kind not in DISTRIBUTIONS:
        raise ValueError(f"a {kind!r} input cannot be drawn on the device")
    if dtype not in DTYPE_CODES:
        raise ValueError(f"the device generator does not write {dtype}")
    if kind == "uniform":
        p0, p1, ilow, irange = float(low), float(high), 0, 1
    elif kind == "normal":
        p0, p1, ilow, irange = float(mean or 0.0), float(std), 0, 1
    else:
        ilow, irange, p0, p1 = int(low), int(high) - int(low), 0.0, 0.0
        if irange < 1:
            raise ValueError(f"integers in [{low}, {high}) is empty")
    return {"dist": DISTRIBUTIONS[kind], "dtype": DTYPE_CODES[dtype], "p0": p0, "p1": p1,
            "ilow": ilow, "irange": irange}


def launch_key(job_key: int, launch: int) -> int:
    """The generator key of one launch of a job (warm-ups first, then timed launches): a keyed hash, so
    that one launch's key says nothing of another's."""
    digest = hashlib.blake2b(launch.to_bytes(8, "little"), key=job_key.to_bytes(8, "little"), digest_size=8)
    return int.from_bytes(digest.digest(), "little")


def generator_arguments(spec: dict, ptr: int, elements: int, key: int, stream: int, changed: int) -> list:
    """referee_generate's arguments, as gpu.kernel_arguments takes them (`changed` 0: write)."""
    return [("ptr", ptr), ("uint64", elements), ("int32", spec["dtype"]), ("int32", spec["dist"]),
            ("float64", spec["p0"]), ("float64", spec["p1"]), ("int64", spec["ilow"]),
            ("uint64", spec["irange"]), ("uint64", key), ("uint64", stream), ("ptr", changed)]


# -- the same draw on the host (numpy), for tests and the stand-in worker ---------------------------
_M0, _M1, _W0, _W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
_HOST_DTYPES = {0: "<f4", 1: "<f8", 2: "<u2", 3: "<u2", 4: "i1", 5: "u1", 6: "<i4", 7: "<u4", 8: "<i8"}


def _philox(counter: list, key: tuple[int, int]) -> list:
    """Philox4x32-10 on uint64 numpy arrays holding 32-bit words (the device's referee_philox)."""
    x0, x1, x2, x3 = counter
    k0, k1 = key
    mask = 0xFFFFFFFF
    for _ in range(10):
        p0, p1 = x0 * _M0, x2 * _M1
        x0, x1, x2, x3 = (p1 >> 32) ^ x1 ^ k0, p1 & mask, (p0 >> 32) ^ x3 ^ k1, p0 & mask
        k0, k1 = (k0 + _W0) & mask, (k1 + _W1) & mask
    return [x0, x1, x2, x3]


def draw_on_host(spec: dict, elements: int, key: int, stream: int):
    """The array referee_generate draws (as raw little-endian words of the dtype's size): equal bit for
    bit to the device's for uniform and integers; for normal, log and cos may differ in the last bit
    between the device and the host's libm, which moves a float32 by one ulp on rare elements."""
    i = np.arange(elements, dtype=np.uint64)
    r = _philox([i & 0xFFFFFFFF, i >> np.uint64(32), np.full_like(i, stream & 0xFFFFFFFF),
                 np.full_like(i, stream >> 32)], (key & 0xFFFFFFFF, key >> 32))
    unit = lambda a, b: ((a >> 5).astype(np.float64) * 67108864.0 + (b >> 6).astype(np.float64)) / 9007199254740992.0  # noqa: E731
    if spec["dist"] == 0:
        v = spec["p0"] + (spec["p1"] - spec["p0"]) * unit(r[0], r[1])
    elif spec["dist"] == 1:
        radius, angle = np.sqrt(-2.0 * np.log(1.0 - unit(r[0], r[1]))), np.cos(6.283185307179586 * unit(r[2], r[3]))
        v = spec["p0"] + (spec["p1"] * radius) * angle
    else:
        bits = (r[0] << np.uint64(32)) | r[1]
        whole = spec["ilow"] + (bits % np.uint64(spec["irange"])).astype(np.int64)
        v = whole.astype(np.float64)
    code = spec["dtype"]
    if code in (0, 1, 2, 3):
        return _float_words(v, code)
    whole = whole if spec["dist"] == 2 else np.trunc(v).astype(np.int64)
    return whole.astype(_HOST_DTYPES[code])


def _float_words(v, code: int):

    if code == 1:
        return v.astype("<f8")
    single = v.astype(np.float32)
    if code == 0:
        return single
    return single.astype(np.float16 if code == 2 else ml_dtypes.bfloat16).view("<u2")
