"""The judging kernels' rule is harness/compare.py's: their portable part, built with the host's C++ compiler,
gives the same digest as the host path on the same bytes, every dtype, NaN/Inf, poison, races and the edge
of the tolerance; their SHA-256 is hashlib's; NVRTC compiles the whole source for the device."""

from __future__ import annotations

import hashlib
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from harness.compare import compare_output
from harness.output_digest import FIRST_MISMATCHES, OutputDigest, digest_from_totals, digest_on_host
from harness.task_model import DTYPES
from harness.worker_side import buffers
from harness.worker_side.judge_source import JUDGE_KINDS, JUDGE_SOURCE
from harness.worker_side.nvrtc import compile_kernel
from tests.judge_host import HostJudge, compiler

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C++ compiler on this machine")
POISONS = buffers.POISON_BYTES


@pytest.fixture(scope="module")
def host_judge(tmp_path_factory) -> HostJudge:
    return HostJudge(tmp_path_factory.mktemp("judge"))


def device_style_digest(judge: HostJudge, dtype: str, expected, first, second, rtol, atol) -> OutputDigest:
    """What a GPU worker reports: totals, spread, then the first mismatches found one at a time."""
    totals = judge.judge(dtype, expected, first, second, rtol, atol, POISONS)
    found = first_mismatches(lambda start: judge.first_after(dtype, expected, first, rtol, atol, start),
                             expected, first, totals["mismatches"])
    return digest_from_totals("out", expected.shape, totals, judge.spread(dtype, expected), found, atol)


def first_mismatches(first_after, expected, first, mismatches: int) -> list[tuple[int, float, float]]:
    """(index, expected, got) of the first mismatches, found one at a time by `first_after(start)`, as the
    judging job finds them."""
    found, start = [], 0
    while len(found) < min(FIRST_MISMATCHES, mismatches):
        index = first_after(start)
        assert index is not None
        found.append((index, float(expected.reshape(-1)[index]), float(first.reshape(-1)[index])))
        start = index + 1
    return found


def assert_same(host: OutputDigest, device: OutputDigest) -> None:
    """Equal field for field (as JSON: a NaN value in a reported mismatch equals itself there)."""
    assert device.model_dump_json(exclude={"judged_on"}) == host.model_dump_json(exclude={"judged_on"})


def poison(shape, dtype, byte):
    """An array of `shape` whose every byte is `byte`."""
    count = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer(bytes([byte]) * count, dtype=dtype).reshape(shape).copy()


def sample(dtype: str, rng: np.random.Generator, shape) -> np.ndarray:
    dt = DTYPES[dtype]
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), size=shape, endpoint=True).astype(dt)
    return (rng.standard_normal(shape) * 3).astype(dt)


def variants(dtype: str, rng: np.random.Generator):
    """(label, expected, first run, second run) pairs that exercise every branch of the rule."""
    shape = (37, 53)
    dt = DTYPES[dtype]
    expected = sample(dtype, rng, shape)
    yield "exact", expected, expected.copy(), expected.copy()
    if dt.kind == "f":
        noisy = (expected.astype(np.float64) * (1 + rng.standard_normal(shape) * 1e-3)).astype(dt)
        yield "noisy", expected, noisy, noisy.copy()
        special = expected.copy()
        special.reshape(-1)[[3, 17, 400, 401, 402, 999]] = np.array([np.nan, np.inf, -np.inf, np.nan, 0.0, -0.0],
                                                                    dtype=np.float64).astype(dt)
        got = special.copy()
        got.reshape(-1)[[3, 17, 400, 401]] = np.array([np.nan, -np.inf, -np.inf, 1.0]).astype(dt)
        yield "nan-and-inf", special, got, got.copy()
        raced = noisy.copy()
        raced.reshape(-1)[::97] = (raced.reshape(-1)[::97].astype(np.float64) + 5).astype(dt)
        yield "race", expected, noisy, raced
        jitter = noisy.copy()
        step = 1 + 2 * float(ml_dtypes.finfo(dt).eps)  # an ulp or two of the dtype itself
        jitter.reshape(-1)[::89] = (jitter.reshape(-1)[::89].astype(np.float64) * step).astype(dt)
        yield "nondeterministic-within", expected, noisy, jitter
    wrong = expected.copy()
    wrong.reshape(-1)[[5, 6, 700, 1900]] += np.array(3).astype(dt)
    yield "wrong", expected, wrong, wrong.copy()
    first, second = expected.copy(), expected.copy()
    first.reshape(-1)[100:140] = poison((40,), dt, POISONS[0])
    second.reshape(-1)[100:140] = poison((40,), dt, POISONS[1])
    yield "unwritten", expected, first, second
    yield "nothing-written", expected, poison(shape, dt, POISONS[0]), poison(shape, dt, POISONS[1])
    yield "constant", np.full(shape, 2, dtype=dt), np.full(shape, 2, dtype=dt), np.full(shape, 2, dtype=dt)
    yield "zero", np.zeros(shape, dtype=dt), np.zeros(shape, dtype=dt), np.zeros(shape, dtype=dt)


def narrow_edge_cases(dtype: str, rng: np.random.Generator, n: int):
    """(rtol, atol, expected, got) for a float dtype the kernels settle in float32 where they can: `got` a few of
    the dtype's ulps from `expected`, at magnitudes across its range (subnormals and the largest values
    included), under tolerances of about those ulps (some exact, some not representable in float32): elements
    on both sides of the edge and on it."""
    dt = DTYPES[dtype]
    info = ml_dtypes.finfo(dt)
    unsigned = {2: np.uint16, 4: np.uint32}[dt.itemsize]
    magnitude_bits = (1 << (8 * dt.itemsize - 1)) - 1
    exponents = rng.uniform(np.log2(float(info.smallest_subnormal)), np.log2(float(info.max)), n)
    expected = (np.exp2(exponents) * rng.choice([-1.0, 1.0], n)).astype(dt)
    bits = expected.view(unsigned).astype(np.int64)
    steps = np.maximum(rng.integers(-4, 5, n), -(bits & magnitude_bits))  # toward or away from zero, not past it
    got = (bits + steps).astype(unsigned).view(dt)
    eps, tiny = float(info.eps), float(info.smallest_subnormal)
    for rtol in (eps, 2 * eps, 2.5 * eps, eps / 3, 3.0000001 * eps):
        for atol in (0.0, 3 * tiny, float(info.tiny)):
            yield rtol, atol, expected, got


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_float32_settling_falls_on_the_float64_side_of_the_edge(host_judge, dtype):
    """The narrow dtypes' pairs settled in float32 give the float64 rule's digest, at the edge of tolerances
    of a few ulps, over the dtype's whole range."""
    verdicts = set()
    for rtol, atol, expected, got in narrow_edge_cases(dtype, np.random.default_rng(5), 20_000):
        host = digest_on_host("out", expected, got, got.copy(), rtol, atol)
        verdicts.add(0 < host.check.mismatches < expected.size)
        assert_same(host, device_style_digest(host_judge, dtype, expected, got, got.copy(), rtol, atol))
    assert verdicts == {True}


def rounded_exactly(operation: str, a: np.float32, b: np.float32, x: float) -> np.float32:
    """The float32 nearest the exact result on the operation's side (by fractions, not floating point)."""
    exact = {"sub_up": lambda: Fraction(float(a)) - Fraction(float(b)),
             "add_down": lambda: Fraction(float(a)) + Fraction(float(b)),
             "mul_down": lambda: Fraction(float(a)) * Fraction(float(b)), "down": lambda: Fraction(x)}[operation]()
    up = operation.endswith("up")
    nearest = np.float32(float(exact))  # within one step of the exact value
    down, up_ = np.float32(-np.inf), np.float32(np.inf)
    for candidate in (np.nextafter(nearest, down), nearest, np.nextafter(nearest, up_)):
        value = Fraction(float(candidate)) if np.isfinite(candidate) else None
        if value is not None and (value >= exact if up else value > exact):  # the first at or above (above)
            return candidate if up else np.nextafter(candidate, down)
    return np.float32(np.inf) if up else np.float32(np.finfo(np.float32).max)


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")
def test_the_hosts_outward_roundings_are_exact(host_judge):
    """The host's stand-ins for __fsub_ru, __fadd_rd, __fmul_rd and __double2float_rd round as those do, so the
    host tests above meet the device's float32 bounds, not looser ones."""
    rng = np.random.default_rng(2)
    info = np.finfo(np.float32)
    exponents = rng.uniform(np.log2(float(info.smallest_subnormal)), np.log2(float(info.max)), (3000, 2))
    pairs = (np.exp2(exponents) * rng.choice([-1.0, 1.0], (3000, 2))).astype(np.float32)
    pairs[:1000, 1] = (pairs[:1000, 0] * (1 + rng.standard_normal(1000) * 1e-6)).astype(np.float32)  # cancelling
    pairs[1000:1100] = info.max  # overflowing
    for a, b in pairs:
        x = float(a) * (1 + 1e-9)
        for operation in ("sub_up", "add_down", "mul_down", "down"):
            assert host_judge.rounded(operation, a, b, x) == rounded_exactly(operation, a, b, x), (operation, a, b)


@pytest.mark.parametrize("dtype", sorted(JUDGE_KINDS))
def test_every_dtype_same_digest_as_the_host(host_judge, dtype):
    rng = np.random.default_rng(list(JUDGE_KINDS).index(dtype))
    for rtol, atol in ((1e-3, 1e-3), (0.0, 0.0), (1e-2, 0.5)):
        for label, expected, first, second in variants(dtype, rng):
            host = digest_on_host("out", expected, first, second, rtol, atol)
            device = device_style_digest(host_judge, dtype, expected, first, second, rtol, atol)
            assert_same(host, device)


def test_the_variants_cover_every_verdict():
    """The comparisons above meet passes and failures, unwritten elements, NaN/Inf where they do not
    belong, a degenerate expected output, and all three agreements of the runs."""
    digests = [digest_on_host("out", e, one, two, 1e-3, 1e-3) for _, e, one, two in variants("float32",
                                                                                        np.random.default_rng(7))]
    assert {d.check.passed for d in digests} == {True, False}
    assert any(d.unwritten for d in digests)
    assert any(d.check.nonfinite_mismatches for d in digests)
    assert any(d.check.warning for d in digests)
    assert {d.agreement.value for d in digests} == {"identical", "within_tolerance", "differs"}


def test_the_edge_of_the_tolerance_falls_on_the_same_side(host_judge):
    """Elements at exactly atol + rtol * |e| and one ulp either side: a fused multiply-add would move some."""
    rng = np.random.default_rng(11)
    rtol, atol = 1e-3, 1e-5
    e = rng.standard_normal(50_000) * 10
    bound = np.abs(e) * rtol + atol
    g = np.concatenate([e + bound, np.nextafter(e + bound, np.inf), np.nextafter(e + bound, -np.inf), e - bound])
    e = np.concatenate([e] * 4)
    host = digest_on_host("out", e, g, g.copy(), rtol, atol)
    assert 0 < host.check.mismatches < e.size
    assert_same(host, device_style_digest(host_judge, "float64", e, g, g.copy(), rtol, atol))


def test_an_overflowing_difference_is_an_infinite_error(host_judge):
    big = np.finfo(np.float64).max
    e = np.array([big, -big, 1.0, 2.0])
    g = np.array([-big, big, 1.0, np.inf])
    host = digest_on_host("out", e, g, g.copy(), 1e-3, 1e-3)
    assert host.check.max_abs_error == np.inf and host.check.mismatches == 3
    assert_same(host, device_style_digest(host_judge, "float64", e, g, g.copy(), 1e-3, 1e-3))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_an_infinity_against_a_finite_value_fails_under_any_tolerance(host_judge, dtype):
    """|inf - x| is infinite, and so is inf * rtol: the bound does not let an infinity through, either way."""
    dt = DTYPES[dtype]
    e = np.array([np.inf, -np.inf, 3.0, 3.0, np.inf, 1.0], dtype=np.float64).astype(dt)
    g = np.array([3.0, 3.0, np.inf, -np.inf, np.inf, 1.0], dtype=np.float64).astype(dt)
    for rtol, atol in ((1e-3, 1e-3), (2.0, 0.0), (1e300, 1e300)):
        host = digest_on_host("out", e, g, g.copy(), rtol, atol)
        assert host.check.mismatches == 4 and host.check.nonfinite_mismatches == 4
        assert_same(host, device_style_digest(host_judge, dtype, e, g, g.copy(), rtol, atol))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_relative_error_divides_a_tiny_expected_value_by_the_floor_of_the_scale(host_judge, dtype):
    """Below 1e-30 the scale is 1e-30: zeros and tiny expected values, met after and before larger errors."""
    dt = DTYPES[dtype]
    e = np.array([1.0, 0.0, 1e-35, 0.0, -1e-38, 2.0, 0.0], dtype=np.float64).astype(dt)
    g = np.array([1.5, 9e-31, 2e-35, 0.0, 8e-31, 2.0, 7e-31], dtype=np.float64).astype(dt)
    for order in (slice(None), slice(None, None, -1)):
        host = digest_on_host("out", e[order], g[order], g[order].copy(), 1e-3, 1e-3)
        assert host.check.max_rel_error > 0.85  # 9e-31 against an expected 0: over the 1e-30 floor
        assert_same(host, device_style_digest(host_judge, dtype, e[order], g[order], g[order].copy(), 1e-3, 1e-3))


def test_the_first_mismatches_are_the_first_in_order(host_judge):
    e = np.zeros(100_000, dtype=np.float32)
    g = e.copy()
    where = [99_999, 3, 50_000, 7, 12, 60_001, 8]
    g[where] = 1.0
    device = device_style_digest(host_judge, "float32", e, g, g.copy(), 0.0, 0.0)
    assert [m.index[0] for m in device.check.first_mismatches] == sorted(where)[:FIRST_MISMATCHES]
    assert device.check.mismatches == len(where)
    assert [m.index for m in device.check.first_mismatches] == \
           [m.index for m in compare_output("out", e, g, 0.0, 0.0).first_mismatches]


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_half_precision_conversion_is_exact_for_every_bit_pattern(host_judge):
    """All 65536 float16 and bfloat16 patterns: each one's value on the kernels' side equals numpy's."""
    for dtype, dt in (("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16)):
        values = np.arange(1 << 16, dtype=np.uint16).view(dt)
        host = digest_on_host("out", values, values, values.copy(), 0.0, 0.0)
        device = device_style_digest(host_judge, dtype, values, values, values.copy(), 0.0, 0.0)
        assert host.check.passed and device.check.passed
        spread = host_judge.spread(dtype, values)
        finite = values.astype(np.float64)[np.isfinite(values.astype(np.float64))]
        assert spread["nonfinite"] == values.size - finite.size
        shifted = values.astype(np.float64) + 1.0
        # The same values compared with a shifted copy: any conversion error shows as a different count.
        got = shifted.astype(dt)
        assert_same(digest_on_host("out", values, got, got.copy(), 1e-2, 0.0),
                    device_style_digest(host_judge, dtype, values, got, got.copy(), 1e-2, 0.0))


@pytest.mark.parametrize("length", [0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 1000, (1 << 20) + 13])
def test_sha256_is_hashlibs(host_judge, length):
    data = np.random.default_rng(length).integers(0, 256, size=length, dtype=np.uint8).tobytes()
    assert host_judge.sha256(data) == hashlib.sha256(data).hexdigest()


def test_tree_sha256_is_the_hash_of_the_chunk_digests(host_judge):
    data = np.random.default_rng(3).integers(0, 256, size=3 * buffers.TREE_CHUNK_BYTES + 999, dtype=np.uint8)
    chunks = [data[i:i + buffers.TREE_CHUNK_BYTES].tobytes() for i in range(0, data.size, buffers.TREE_CHUNK_BYTES)]
    digests = b"".join(bytes.fromhex(host_judge.sha256(c)) for c in chunks)
    assert buffers.tree_sha256(data) == hashlib.sha256(digests).hexdigest()
    assert buffers.tree_sha256(data) != buffers.tree_sha256(data[:-1])


def test_nvrtc_compiles_every_judging_kernel():
    names = [f"referee_{k}_{d}" for d in JUDGE_KINDS for k in ("judge", "first_after", "spread")]
    for name in names + ["referee_chunk_sha256"]:
        result = compile_kernel(JUDGE_SOURCE, name, arch="sm_90")
        assert result.ok, result.log
        assert result.lowered_name == name
