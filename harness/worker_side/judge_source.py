"""The referee's judging kernels: a candidate's outputs compared with the expected outputs on the device.

The rule is harness/compare.py's, element for element, in float64: |got - expected| <= atol + rtol *
|expected|; NaN must meet NaN and an infinity the same infinity; the relative error divides by
max(|expected|, 1e-30); a non-finite pair adds nothing to the error maxima. Two runs under different
poisons give the unwritten elements (each run's poison pattern still in place) and the agreement of
the runs (bitwise, then within tolerance, over the written elements) as harness/judging.py and
compare.agreement() find them. The arithmetic uses round-to-nearest intrinsics so that no multiply-add
is fused: a fused one rounds once where numpy rounds twice, and an element on the edge of the
tolerance could change sides.

The rule's C++, element by element, is harness/worker_side/judge_rule_source.py's; float32, float16 and
bfloat16 pairs are mostly settled there in float32 arithmetic rounded outward, with the float64 rule's verdict.

The part marked PORTABLE is plain C++ as well: the tests compile it with a host compiler (tests/judge_host.py
defines the prelude there) and hold it to harness/compare.py on the same arrays. Only the traversal in
16-byte loads and the reduction across threads (warp shuffles and atomics) are device-only; the GPU tests hold
those to the host path.

With them, from harness/worker_side/sha256_source.py: SHA-256 of fixed-size chunks, on the device.
"""

from __future__ import annotations

from harness.worker_side.judge_rule_source import RULE_SOURCE
from harness.worker_side.sha256_source import SHA256_KERNEL, SHA256_PORTABLE

# Task dtype name -> the kind number of the kernels' element conversions (the names end the kernels').
JUDGE_KINDS = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3, "int8": 4, "int32": 5, "int64": 6,
               "uint8": 7, "uint32": 8}

# Fields of the totals one judging fills, in order (unsigned 64-bit each). Maxima are the bits of
# non-negative doubles, which order as their values do; minima of indices start at all ones.
TOTALS_FIELDS = ("mismatches", "nonfinite_mismatches", "max_abs_bits", "max_rel_bits", "first_mismatch",
                 "unwritten", "first_unwritten", "pair_differ_bits", "pair_mismatches")
STATS_FIELDS = ("nonfinite", "finite_min_key", "finite_max_key")
NO_INDEX = (1 << 64) - 1

PORTABLE_SOURCE = ("\n// ---- PORTABLE: device and host " + "-" * 63 + "\n" + RULE_SOURCE + SHA256_PORTABLE
                   + "// ---- end PORTABLE " + "-" * 77 + "\n")

DEVICE_PRELUDE = r"""
#define JUDGE_HD __device__
#define JUDGE_CONST __constant__
#define JUDGE_UNROLL _Pragma("unroll 4")
__device__ __forceinline__ unsigned long long judge_bits_of_double(double x) { return (unsigned long long)__double_as_longlong(x); }
__device__ __forceinline__ double judge_double_of_bits(unsigned long long b) { return __longlong_as_double((long long)b); }
__device__ __forceinline__ float judge_float_of_bits(unsigned int b) { return __int_as_float((int)b); }
__device__ __forceinline__ double judge_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double judge_sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ double judge_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ double judge_div(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ double judge_mul_down(double a, double b) { return __dmul_rd(a, b); }
__device__ __forceinline__ bool judge_finite(double x) { return isfinite(x); }
__device__ __forceinline__ bool judge_nan(double x) { return isnan(x); }
__device__ __forceinline__ double judge_abs(double x) { return fabs(x); }
__device__ __forceinline__ float judge_float_of_half(unsigned int h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)h)); return f;
}
__device__ __forceinline__ float judge_fsub_up(float a, float b) { return __fsub_ru(a, b); }
__device__ __forceinline__ float judge_fadd_down(float a, float b) { return __fadd_rd(a, b); }
__device__ __forceinline__ float judge_fmul_down(float a, float b) { return __fmul_rd(a, b); }
__device__ __forceinline__ float judge_float_down(double x) { return __double2float_rd(x); }
__device__ __forceinline__ float judge_fmax(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ float judge_fabs(float x) { return fabsf(x); }
"""

DEVICE_KERNELS = r"""
// ---- device only: across threads -------------------------------------------------------------
__device__ __forceinline__ unsigned long long judge_warp_sum(unsigned long long v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ unsigned long long judge_warp_max(unsigned long long v) {
    for (int o = 16; o > 0; o >>= 1) { unsigned long long w = __shfl_down_sync(0xffffffffu, v, o); v = w > v ? w : v; }
    return v;
}
__device__ __forceinline__ unsigned long long judge_warp_min(unsigned long long v) {
    for (int o = 16; o > 0; o >>= 1) { unsigned long long w = __shfl_down_sync(0xffffffffu, v, o); v = w < v ? w : v; }
    return v;
}
// Lane 0 of each warp adds its warp's share to the totals (TOTALS_FIELDS order).
__device__ void judge_commit(const JudgePartial& p, unsigned long long* t) {
    unsigned long long v[9] = {judge_warp_sum(p.mismatches), judge_warp_sum(p.nonfinite_mismatches),
                               judge_warp_max(p.max_abs_bits), judge_warp_max(p.max_rel_bits),
                               judge_warp_min(p.first_mismatch), judge_warp_sum(p.unwritten),
                               judge_warp_min(p.first_unwritten), judge_warp_sum(p.pair_differ_bits),
                               judge_warp_sum(p.pair_mismatches)};
    if ((threadIdx.x & 31) != 0) return;
    if (v[0]) atomicAdd(t + 0, v[0]);
    if (v[1]) atomicAdd(t + 1, v[1]);
    if (v[2]) atomicMax(t + 2, v[2]);
    if (v[3]) atomicMax(t + 3, v[3]);
    if (v[4] != ~0ull) atomicMin(t + 4, v[4]);
    if (v[5]) atomicAdd(t + 5, v[5]);
    if (v[6] != ~0ull) atomicMin(t + 6, v[6]);
    if (v[7]) atomicAdd(t + 7, v[7]);
    if (v[8]) atomicAdd(t + 8, v[8]);
}

// A thread's share of a judging in 16-byte loads of the three arrays where they are all so aligned (the
// referee's allocations are), streamed past the caches; what is left, element by element.
template <int KIND>
__device__ void judge_vectors(const void* expected, const void* one, const void* two, judge_u64 n, double rtol,
                              double atol, judge_u64 p1, judge_u64 p2, JudgePartial& p) {
    typedef typename JudgeType<KIND>::Bits Bits;
    const int per = 16 / sizeof(Bits);
    judge_u64 thread = blockIdx.x * (judge_u64)blockDim.x + threadIdx.x, threads = (judge_u64)gridDim.x * blockDim.x;
    bool aligned = ((((judge_u64)expected) | ((judge_u64)one) | ((judge_u64)two)) & 15u) == 0;
    judge_u64 vectors = aligned ? n / per : 0;
    const uint4* e4 = (const uint4*)expected;
    const uint4* a4 = (const uint4*)one;
    const uint4* b4 = (const uint4*)two;
    // Where both runs hold the expected bits, every element passes with no error: skipped. (With distinct
    // poisons no element of such a vector is unwritten, and the runs agree.)
    bool skip_equal = p1 != p2;
    JudgeRule rule = judge_rule(rtol, atol);
    for (judge_u64 v = thread; v < vectors; v += threads) {
        uint4 ev = __ldcs(e4 + v), av = __ldcs(a4 + v), bv = __ldcs(b4 + v);
        if (skip_equal && ev.x == av.x && ev.y == av.y && ev.z == av.z && ev.w == av.w && av.x == bv.x
            && av.y == bv.y && av.z == bv.z && av.w == bv.w)
            continue;
        const Bits* eb = (const Bits*)&ev;
        const Bits* ab = (const Bits*)&av;
        const Bits* bb = (const Bits*)&bv;
#pragma unroll
        for (int k = 0; k < per; ++k) judge_step<KIND>(v * per + k, eb[k], ab[k], bb[k], rule, p1, p2, p);
    }
    judge_range<KIND>(expected, one, two, n, rtol, atol, p1, p2, vectors * per + thread, threads, p);
}

#define JUDGE_KERNELS(NAME, KIND)                                                                              \
extern "C" __global__ void referee_judge_##NAME(const void* expected, const void* one, const void* two,       \
        unsigned long long n, double rtol, double atol, unsigned long long p1, unsigned long long p2,            \
        unsigned long long* totals) {                                                                          \
    JudgePartial p; judge_partial_start(p);                                                                    \
    judge_vectors<KIND>(expected, one, two, n, rtol, atol, p1, p2, p);                                         \
    judge_commit(p, totals);                                                                                   \
}                                                                                                              \
extern "C" __global__ void referee_first_after_##NAME(const void* expected, const void* got,                  \
        unsigned long long n, double rtol, double atol, unsigned long long from, unsigned long long* first) {  \
    unsigned long long i = judge_warp_min(judge_first_after<KIND>(expected, got, n, rtol, atol, from,         \
        blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x, (unsigned long long)gridDim.x * blockDim.x)); \
    if ((threadIdx.x & 31) == 0 && i != ~0ull) atomicMin(first, i);                                           \
}                                                                                                              \
extern "C" __global__ void referee_spread_##NAME(const void* values, unsigned long long n,                    \
                                                  unsigned long long* stats) {                                 \
    unsigned long long nonfinite = 0, lo = ~0ull, hi = 0;                                                      \
    judge_spread<KIND>(values, n, blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x,                  \
                       (unsigned long long)gridDim.x * blockDim.x, nonfinite, lo, hi);                        \
    nonfinite = judge_warp_sum(nonfinite); lo = judge_warp_min(lo); hi = judge_warp_max(hi);                   \
    if ((threadIdx.x & 31) != 0) return;                                                                       \
    if (nonfinite) atomicAdd(stats + 0, nonfinite);                                                            \
    if (lo != ~0ull) atomicMin(stats + 1, lo);                                                                 \
    if (hi) atomicMax(stats + 2, hi);                                                                          \
}

JUDGE_KERNELS(float32, 0)
JUDGE_KERNELS(float16, 1)
JUDGE_KERNELS(bfloat16, 2)
JUDGE_KERNELS(float64, 3)
JUDGE_KERNELS(int8, 4)
JUDGE_KERNELS(int32, 5)
JUDGE_KERNELS(int64, 6)
JUDGE_KERNELS(uint8, 7)
JUDGE_KERNELS(uint32, 8)

""" + SHA256_KERNEL

JUDGE_SOURCE = DEVICE_PRELUDE + PORTABLE_SOURCE + DEVICE_KERNELS
