"""The judging kernels' rule, element by element, in C++ for the device and the host alike (the PORTABLE part of
harness/worker_side/judge_source.py): an element's value by dtype, harness/compare.py's rule for one pair, a
thread's share of a judging's totals, the first mismatch after an index, the spread of an expected output.

float32, float16 and bfloat16 values are float32 values: most of their pairs are settled in float32 arithmetic
rounded outward (judge_narrow_settled), which says "pass" only where the float64 rule says so too, at a fraction
of the float64 work; the others take the float64 rule.
"""

RULE_SOURCE = r"""typedef unsigned long long judge_u64;
typedef unsigned int judge_u32;


// IEEE binary16 -> double, exactly (subnormals, infinities and NaN included).
JUDGE_HD inline double judge_from_half(judge_u32 h) {
    judge_u32 sign = (h >> 15) & 1u, exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
    judge_u64 s = (judge_u64)sign << 63;
    if (exponent == 0x1Fu)
        return judge_double_of_bits(s | 0x7FF0000000000000ull | ((judge_u64)mantissa << 42));
    if (exponent == 0) {
        if (mantissa == 0) return judge_double_of_bits(s);
        int e = -14;
        while ((mantissa & 0x400u) == 0) { mantissa <<= 1; --e; }
        mantissa &= 0x3FFu;
        return judge_double_of_bits(s | ((judge_u64)(e + 1023) << 52) | ((judge_u64)mantissa << 42));
    }
    return judge_double_of_bits(s | ((judge_u64)(exponent - 15 + 1023) << 52) | ((judge_u64)mantissa << 42));
}

// An element's bits (zero-extended) and its value as a double, by kind (JUDGE_KINDS); the narrow kinds' values
// are float32 values too.
template <int KIND> struct JudgeType;
template <> struct JudgeType<0> {
    typedef judge_u32 Bits; enum { narrow = 1 };
    JUDGE_HD static double value(judge_u64 b) { return (double)judge_float_of_bits((judge_u32)b); }
    JUDGE_HD static float value32(judge_u64 b) { return judge_float_of_bits((judge_u32)b); }
};
template <> struct JudgeType<1> {
    typedef unsigned short Bits; enum { narrow = 1 };
    JUDGE_HD static double value(judge_u64 b) { return judge_from_half((judge_u32)b); }
    JUDGE_HD static float value32(judge_u64 b) { return judge_float_of_half((judge_u32)b); }
};
template <> struct JudgeType<2> {
    typedef unsigned short Bits; enum { narrow = 1 };
    JUDGE_HD static double value(judge_u64 b) { return (double)judge_float_of_bits((judge_u32)b << 16); }
    JUDGE_HD static float value32(judge_u64 b) { return judge_float_of_bits((judge_u32)b << 16); }
};
template <> struct JudgeType<3> {
    typedef judge_u64 Bits; enum { narrow = 0 };
    JUDGE_HD static double value(judge_u64 b) { return judge_double_of_bits(b); }
};
template <> struct JudgeType<4> {
    typedef unsigned char Bits; enum { narrow = 0 };
    JUDGE_HD static double value(judge_u64 b) { return (double)(signed char)(unsigned char)b; }
};
template <> struct JudgeType<5> {
    typedef judge_u32 Bits; enum { narrow = 0 };
    JUDGE_HD static double value(judge_u64 b) { return (double)(int)(judge_u32)b; }
};
template <> struct JudgeType<6> {
    typedef judge_u64 Bits; enum { narrow = 0 };
    JUDGE_HD static double value(judge_u64 b) { return (double)(long long)b; }
};
template <> struct JudgeType<7> {
    typedef unsigned char Bits; enum { narrow = 0 };
    JUDGE_HD static double value(judge_u64 b) { return (double)(unsigned char)b; }
};
template <> struct JudgeType<8> {
    typedef judge_u32 Bits; enum { narrow = 0 };
    JUDGE_HD static double value(judge_u64 b) { return (double)(judge_u32)b; }
};

// A judging's tolerances, with float32 values no greater than each for judge_narrow_settled.
struct JudgeRule { double rtol, atol; float rtol_down, atol_down; };

JUDGE_HD inline JudgeRule judge_rule(double rtol, double atol) {
    JudgeRule rule = {rtol, atol, judge_float_down(rtol), judge_float_down(atol)};
    return rule;
}

// The relative error of an element is abs_error / scale.
struct JudgeElement { bool ok; bool nonfinite_mismatch; double abs_error; double scale; };

// atol + rtol * |expected| for an expected magnitude `scale`, each operation rounded once.
JUDGE_HD inline double judge_tolerance(double scale, double rtol, double atol) {
    return judge_add(judge_mul(scale, rtol), atol);
}

// harness/compare.py's rule for one pair, in float64, each operation rounded once.
JUDGE_HD inline JudgeElement judge_element(double e, double g, double rtol, double atol) {
    JudgeElement r;
    if (!judge_finite(e) || !judge_finite(g)) {
        r.ok = (judge_nan(e) && judge_nan(g)) || e == g;
        r.nonfinite_mismatch = !r.ok;
        r.abs_error = 0.0;
        r.scale = 1.0;
        return r;
    }
    double d = judge_abs(judge_sub(g, e));
    double scale = judge_abs(e);
    r.ok = d <= judge_tolerance(scale, rtol, atol);
    r.nonfinite_mismatch = false;
    r.abs_error = d;
    r.scale = scale > 1e-30 ? scale : 1e-30;
    return r;
}

// One thread's share of a judging: the totals of the elements first, first + stride, ... below n.
struct JudgePartial {
    judge_u64 mismatches, nonfinite_mismatches, max_abs_bits, max_rel_bits, first_mismatch;
    judge_u64 unwritten, first_unwritten, pair_differ_bits, pair_mismatches;
    float max_abs_down, max_rel_down;  // at most the maxima: float32 bounds for judge_narrow_settled
};

JUDGE_HD inline void judge_partial_start(JudgePartial& p) {
    p.mismatches = p.nonfinite_mismatches = p.max_abs_bits = p.max_rel_bits = 0;
    p.unwritten = p.pair_differ_bits = p.pair_mismatches = 0;
    p.first_mismatch = p.first_unwritten = ~0ull;
    p.max_abs_down = p.max_rel_down = 0.0f;
}

// The error maxima of a thread's share, with a pair's error and scale.
JUDGE_HD inline void judge_errors(double abs_error, double magnitude, JudgePartial& p) {
    // Non-negative doubles order as their bits do.
    if (abs_error > judge_double_of_bits(p.max_abs_bits)) p.max_abs_bits = judge_bits_of_double(abs_error);
    // The relative error divides by the scale, max(|expected|, 1e-30); the division only where it can raise
    // the maximum m. d <= (m * |expected| rounded down) <= m * scale means d / scale <= m exactly, so its
    // rounded quotient is no greater than m either.
    if (abs_error > judge_mul_down(judge_double_of_bits(p.max_rel_bits), magnitude)) {
        double scale = magnitude < 1e-30 ? 1e-30 : magnitude;
        judge_u64 rel_bits = judge_bits_of_double(judge_div(abs_error, scale));
        if (rel_bits > p.max_rel_bits) p.max_rel_bits = rel_bits;
    }
}

// A pair of float32 values settled in float32 arithmetic rounded outward, where it can be: true when the pair
// passes and leaves the maxima as they were, or passes and its errors are added; false when only judge_step's
// float64 rule can say. d bounds the float64 |g - e| from above (NaN where either is NaN), and the tolerance
// bounds atol + rtol * |e|, each operation rounded in float64, from below; a product of two float32 values is
// exact in float64. So d <= tolerance means a pass under the float64 rule, and d no greater than the bounds
// below the maxima means neither maximum rises.
JUDGE_HD inline bool judge_narrow_settled(float e, float g, const JudgeRule& rule, JudgePartial& p) {
    float d = judge_fmax(judge_fsub_up(g, e), judge_fsub_up(e, g)), scale = judge_fabs(e);
    float tolerance = judge_fadd_down(judge_fmul_down(scale, rule.rtol_down), rule.atol_down);
    if (!(d <= 3.4028234663852886e38f && d <= tolerance)) return false;
    if (d <= p.max_abs_down && d <= judge_fmul_down(p.max_rel_down, scale)) return true;
    judge_errors(judge_abs(judge_sub((double)g, (double)e)), (double)scale, p);
    p.max_abs_down = judge_float_down(judge_double_of_bits(p.max_abs_bits));
    p.max_rel_down = judge_float_down(judge_double_of_bits(p.max_rel_bits));
    return true;
}

// Element i: its expected bits e, the first run's a and the second's b, added to a thread's totals.
template <int KIND>
JUDGE_HD inline void judge_step(judge_u64 i, judge_u64 e, judge_u64 a, judge_u64 b, const JudgeRule& rule,
                                judge_u64 poison_first, judge_u64 poison_second, JudgePartial& p) {
    double rtol = rule.rtol, atol = rule.atol;
    bool settled = false;
    if constexpr (JudgeType<KIND>::narrow)
        settled = judge_narrow_settled(JudgeType<KIND>::value32(e), JudgeType<KIND>::value32(a), rule, p);
    if (!settled) {
        double expected = JudgeType<KIND>::value(e), got = JudgeType<KIND>::value(a);
        double d = judge_abs(judge_sub(got, expected)), scale = judge_abs(expected);
        // The common case first, judge_element's finite branch: a finite difference means both values are
        // finite (an infinity or a NaN in either makes it infinite or NaN), and within tolerance is a pass.
        if (d <= 1.7976931348623157e308 && d <= judge_tolerance(scale, rtol, atol)) {
            judge_errors(d, scale, p);
        } else {
            JudgeElement r = judge_element(expected, got, rtol, atol);
            if (!r.ok) {
                p.mismatches += 1;
                p.nonfinite_mismatches += r.nonfinite_mismatch;
                if (i < p.first_mismatch) p.first_mismatch = i;
            }
            judge_errors(r.abs_error, r.scale, p);
        }
    }
    if (a != b || a == poison_first) {  // else: written (not the first poison) and the runs agree
        if (a == poison_first && b == poison_second) {
            p.unwritten += 1;
            if (i < p.first_unwritten) p.first_unwritten = i;
        } else if (a != b) {
            p.pair_differ_bits += 1;
            p.pair_mismatches += !judge_element(JudgeType<KIND>::value(a), JudgeType<KIND>::value(b), rtol, atol).ok;
        }
    }
}

template <int KIND>
JUDGE_HD void judge_range(const void* expected, const void* first_run, const void* second_run, judge_u64 n,
                          double rtol, double atol, judge_u64 poison_first, judge_u64 poison_second,
                          judge_u64 start, judge_u64 stride, JudgePartial& p) {
    typedef typename JudgeType<KIND>::Bits Bits;
    const Bits* exp = (const Bits*)expected;
    const Bits* one = (const Bits*)first_run;
    const Bits* two = (const Bits*)second_run;
    JudgeRule rule = judge_rule(rtol, atol);
    JUDGE_UNROLL
    for (judge_u64 i = start; i < n; i += stride)
        judge_step<KIND>(i, exp[i], one[i], two[i], rule, poison_first, poison_second, p);
}

// The index of the first element at or after `from` beyond tolerance (~0 when none), one thread's share.
template <int KIND>
JUDGE_HD judge_u64 judge_first_after(const void* expected, const void* got, judge_u64 n, double rtol, double atol,
                                     judge_u64 from, judge_u64 start, judge_u64 stride) {
    typedef typename JudgeType<KIND>::Bits Bits;
    const Bits* exp = (const Bits*)expected;
    const Bits* run = (const Bits*)got;
    for (judge_u64 i = from + start; i < n; i += stride)
        if (!judge_element(JudgeType<KIND>::value(exp[i]), JudgeType<KIND>::value(run[i]), rtol, atol).ok) return i;
    return ~0ull;
}

// Order-preserving key of a double (as unsigned), for minima and maxima of signed values.
JUDGE_HD inline judge_u64 judge_order_key(double x) {
    judge_u64 b = judge_bits_of_double(x);
    return (b >> 63) ? ~b : (b | 0x8000000000000000ull);
}

// One thread's share of the expected output's spread: non-finite elements, finite minimum and maximum.
template <int KIND>
JUDGE_HD void judge_spread(const void* values, judge_u64 n, judge_u64 start, judge_u64 stride,
                           judge_u64& nonfinite, judge_u64& min_key, judge_u64& max_key) {
    typedef typename JudgeType<KIND>::Bits Bits;
    const Bits* v = (const Bits*)values;
    for (judge_u64 i = start; i < n; i += stride) {
        double x = JudgeType<KIND>::value(v[i]);
        if (!judge_finite(x)) { nonfinite += 1; continue; }
        judge_u64 key = judge_order_key(x);
        if (key < min_key) min_key = key;
        if (key > max_key) max_key = key;
    }
}

"""
