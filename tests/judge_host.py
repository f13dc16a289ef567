"""The judging kernels' portable part (harness/worker_side/judge_source.py) built with the host's C++
compiler and called through ctypes: the same element rule, thread partition and SHA-256 as on the device,
run on numpy arrays so that the tests can hold them to harness/compare.py and hashlib."""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from pathlib import Path

import numpy as np

from harness.worker_side.judge_source import JUDGE_KINDS, NO_INDEX, PORTABLE_SOURCE, STATS_FIELDS, TOTALS_FIELDS

# What the device prelude (harness/worker_side/judge_source.py) defines, in host C++ (g++ -ffp-contract=off).
HOST_PRELUDE = r"""
#include <cmath>
#include <cstring>
#define JUDGE_HD
#define JUDGE_CONST static const
#define JUDGE_UNROLL
inline unsigned long long judge_bits_of_double(double x) { unsigned long long b; std::memcpy(&b, &x, 8); return b; }
inline double judge_double_of_bits(unsigned long long b) { double x; std::memcpy(&x, &b, 8); return x; }
inline float judge_float_of_bits(unsigned int b) { float x; std::memcpy(&x, &b, 4); return x; }
inline double judge_add(double a, double b) { return a + b; }
inline double judge_sub(double a, double b) { return a - b; }
inline double judge_mul(double a, double b) { return a * b; }
inline double judge_div(double a, double b) { return a / b; }
// At most the exact product of two non-negative doubles: the nearest one step toward zero.
inline double judge_mul_down(double a, double b) { return std::nextafter(a * b, 0.0); }
// By the bits, as IEEE 754 defines them (the device uses its instructions for the same).
inline bool judge_finite(double x) { return ((judge_bits_of_double(x) >> 52) & 0x7FFull) != 0x7FFull; }
inline bool judge_nan(double x) {
    unsigned long long b = judge_bits_of_double(x);
    return ((b >> 52) & 0x7FFull) == 0x7FFull && (b & 0xFFFFFFFFFFFFFull) != 0;
}
inline double judge_abs(double x) { return judge_double_of_bits(judge_bits_of_double(x) & 0x7FFFFFFFFFFFFFFFull); }
inline double judge_from_half(unsigned int h);
inline float judge_float_of_half(unsigned int h) { return (float)judge_from_half(h); }
// float32 operations rounded up or down, as the device's __fsub_ru, __fadd_rd, __fmul_rd and __double2float_rd
// round: the nearest result, moved one step where its exact error (Knuth's two-sum; a float32 product is exact
// in float64) lies on the other side.
inline float judge_float_toward(double x, bool up) {
    float r = (float)x;
    if (up ? (double)r < x : (double)r > x) r = std::nextafter(r, up ? INFINITY : -INFINITY);
    return r;
}
inline float judge_fadd_toward(float a, float b, bool up) {
    float s = a + b;
    if (std::isinf(s) && std::isfinite(a) && std::isfinite(b)) return (s > 0) == up ? s : std::nextafter(s, 0.0f);
    if (!std::isfinite(s)) return s;
    float bp = s - a, ap = s - bp, error = (a - ap) + (b - bp);
    if (up ? error > 0 : error < 0) s = std::nextafter(s, up ? INFINITY : -INFINITY);
    return s;
}
inline float judge_fsub_up(float a, float b) { return judge_fadd_toward(a, -b, true); }
inline float judge_fadd_down(float a, float b) { return judge_fadd_toward(a, b, false); }
inline float judge_fmul_down(float a, float b) { return judge_float_toward((double)a * (double)b, false); }
inline float judge_float_down(double x) { return judge_float_toward(x, false); }
inline float judge_fmax(float a, float b) { return std::fmax(a, b); }
inline float judge_fabs(float x) { return std::fabs(x); }
"""

DRIVER = r"""
typedef void (*RangeFn)(const void*, const void*, const void*, judge_u64, double, double, judge_u64, judge_u64,
                        judge_u64, judge_u64, JudgePartial&);
static RangeFn ranges[9] = {judge_range<0>, judge_range<1>, judge_range<2>, judge_range<3>, judge_range<4>,
                            judge_range<5>, judge_range<6>, judge_range<7>, judge_range<8>};
typedef judge_u64 (*FirstFn)(const void*, const void*, judge_u64, double, double, judge_u64, judge_u64, judge_u64);
static FirstFn firsts[9] = {judge_first_after<0>, judge_first_after<1>, judge_first_after<2>, judge_first_after<3>,
                            judge_first_after<4>, judge_first_after<5>, judge_first_after<6>, judge_first_after<7>,
                            judge_first_after<8>};
typedef void (*SpreadFn)(const void*, judge_u64, judge_u64, judge_u64, judge_u64&, judge_u64&, judge_u64&);
static SpreadFn spreads[9] = {judge_spread<0>, judge_spread<1>, judge_spread<2>, judge_spread<3>, judge_spread<4>,
                              judge_spread<5>, judge_spread<6>, judge_spread<7>, judge_spread<8>};

// `threads` shares combined as the device's warps and atomics combine them.
extern "C" void host_judge(int kind, const void* e, const void* one, const void* two, judge_u64 n, double rtol,
                           double atol, judge_u64 p1, judge_u64 p2, judge_u64 threads, judge_u64* t) {
    t[0] = t[1] = t[2] = t[3] = t[5] = t[7] = t[8] = 0; t[4] = t[6] = ~0ull;
    for (judge_u64 s = 0; s < threads; ++s) {
        JudgePartial p; judge_partial_start(p);
        ranges[kind](e, one, two, n, rtol, atol, p1, p2, s, threads, p);
        t[0] += p.mismatches; t[1] += p.nonfinite_mismatches;
        if (p.max_abs_bits > t[2]) t[2] = p.max_abs_bits;
        if (p.max_rel_bits > t[3]) t[3] = p.max_rel_bits;
        if (p.first_mismatch < t[4]) t[4] = p.first_mismatch;
        t[5] += p.unwritten;
        if (p.first_unwritten < t[6]) t[6] = p.first_unwritten;
        t[7] += p.pair_differ_bits; t[8] += p.pair_mismatches;
    }
}
extern "C" judge_u64 host_first_after(int kind, const void* e, const void* g, judge_u64 n, double rtol, double atol,
                                      judge_u64 from, judge_u64 threads) {
    judge_u64 best = ~0ull;
    for (judge_u64 s = 0; s < threads; ++s) {
        judge_u64 i = firsts[kind](e, g, n, rtol, atol, from, s, threads);
        if (i < best) best = i;
    }
    return best;
}
extern "C" void host_spread(int kind, const void* v, judge_u64 n, judge_u64 threads, judge_u64* stats) {
    stats[0] = 0; stats[1] = ~0ull; stats[2] = 0;
    for (judge_u64 s = 0; s < threads; ++s) spreads[kind](v, n, s, threads, stats[0], stats[1], stats[2]);
}
extern "C" float host_rounded(int operation, float a, float b, double x) {
    if (operation == 0) return judge_fsub_up(a, b);
    if (operation == 1) return judge_fadd_down(a, b);
    if (operation == 2) return judge_fmul_down(a, b);
    return judge_float_down(x);
}
extern "C" void host_sha256(const unsigned char* data, judge_u64 n, unsigned char* digest) {
    judge_sha256(data, n, digest);
}
"""


def compiler() -> str | None:
    return shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


class HostJudge:
    """The portable judging code, compiled once into `folder`."""

    def __init__(self, folder: Path):
        source = folder / "judge_host.cpp"
        library = folder / "judge_host.so"
        source.write_text(HOST_PRELUDE + PORTABLE_SOURCE + DRIVER)
        subprocess.run([compiler(), "-O2", "-ffp-contract=off", "-shared", "-fPIC", "-o", str(library), str(source)],
                       check=True, capture_output=True, text=True)
        self.lib = ctypes.CDLL(str(library))
        u64, ptr, dbl = ctypes.c_uint64, ctypes.c_void_p, ctypes.c_double
        self.lib.host_judge.argtypes = [ctypes.c_int, ptr, ptr, ptr, u64, dbl, dbl, u64, u64, u64, ptr]
        self.lib.host_first_after.argtypes = [ctypes.c_int, ptr, ptr, u64, dbl, dbl, u64, u64]
        self.lib.host_first_after.restype = u64
        self.lib.host_spread.argtypes = [ctypes.c_int, ptr, u64, u64, ptr]
        self.lib.host_sha256.argtypes = [ptr, u64, ptr]
        self.lib.host_rounded.argtypes = [ctypes.c_int, ctypes.c_float, ctypes.c_float, dbl]
        self.lib.host_rounded.restype = ctypes.c_float

    def judge(self, dtype: str, expected, first, second, rtol, atol, poisons, threads=7) -> dict[str, int]:
        arrays = [np.ascontiguousarray(a) for a in (expected, first, second)]
        width = arrays[0].dtype.itemsize
        patterns = [int.from_bytes(bytes([p]) * width, "little") for p in poisons]
        totals = np.zeros(len(TOTALS_FIELDS), dtype=np.uint64)
        self.lib.host_judge(JUDGE_KINDS[dtype], *(a.ctypes.data for a in arrays), arrays[0].size, rtol, atol,
                            *patterns, threads, totals.ctypes.data)
        return dict(zip(TOTALS_FIELDS, (int(v) for v in totals)))

    def first_after(self, dtype: str, expected, got, rtol, atol, start: int, threads=5) -> int | None:
        e, g = np.ascontiguousarray(expected), np.ascontiguousarray(got)
        found = self.lib.host_first_after(JUDGE_KINDS[dtype], e.ctypes.data, g.ctypes.data, e.size, rtol, atol,
                                          start, threads)
        return None if found == NO_INDEX else int(found)

    def spread(self, dtype: str, values, threads=3) -> dict[str, int]:
        v = np.ascontiguousarray(values)
        stats = np.zeros(len(STATS_FIELDS), dtype=np.uint64)
        self.lib.host_spread(JUDGE_KINDS[dtype], v.ctypes.data, v.size, threads, stats.ctypes.data)
        return dict(zip(STATS_FIELDS, (int(s) for s in stats)))

    def rounded(self, operation: str, a: float = 0.0, b: float = 0.0, x: float = 0.0) -> np.float32:
        """The host's float32 operation rounded toward one side: "sub_up" a - b, "add_down" a + b,
        "mul_down" a * b, "down" x."""
        code = ("sub_up", "add_down", "mul_down", "down").index(operation)
        return np.float32(self.lib.host_rounded(code, a, b, x))

    def sha256(self, data: bytes) -> str:
        buffer = np.frombuffer(data, dtype=np.uint8) if data else np.zeros(1, dtype=np.uint8)
        digest = np.zeros(32, dtype=np.uint8)
        self.lib.host_sha256(buffer.ctypes.data, len(data), digest.ctypes.data)
        return digest.tobytes().hex()


def reference_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
