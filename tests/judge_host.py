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

from harness.worker_side.judge_source import (HOST_PRELUDE, JUDGE_KINDS, NO_INDEX, PORTABLE_SOURCE, STATS_FIELDS,
                                              TOTALS_FIELDS)

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

    def sha256(self, data: bytes) -> str:
        buffer = np.frombuffer(data, dtype=np.uint8) if data else np.zeros(1, dtype=np.uint8)
        digest = np.zeros(32, dtype=np.uint8)
        self.lib.host_sha256(buffer.ctypes.data, len(data), digest.ctypes.data)
        return digest.tobytes().hex()


def reference_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
