import json

import ml_dtypes
import numpy as np
import pytest

import harness.compare as compare_module
from harness.compare import (
    Agreement,
    Mismatch,
    OutputCheck,
    agreement,
    compare_output,
    degenerate_warning,
)

NAN, INF = float("nan"), float("inf")


def random_output(size: int = 1000, seed: int = 0, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(size).astype(dtype)


# --- the tolerance rule -------------------------------------------------------------


def test_exactly_equal_passes():
    expected = random_output()
    check = compare_output("out", expected, expected.copy(), rtol=0.0, atol=0.0)
    assert check.passed
    assert check.name == "out"
    assert check.elements == 1000
    assert check.mismatches == 0 and check.nonfinite_mismatches == 0
    assert check.max_abs_error == 0.0 and check.max_rel_error == 0.0
    assert check.first_mismatches == []
    assert check.warning is None


def test_within_tolerance_passes_and_reports_errors():
    expected = np.array([1.0, 2.0, -4.0], dtype=np.float64)
    got = expected + np.array([1e-4, -2e-4, 4e-4])
    check = compare_output("out", expected, got, rtol=1e-3, atol=0.0)
    assert check.passed
    assert check.max_abs_error == pytest.approx(4e-4)
    assert check.max_rel_error == pytest.approx(1e-4)


@pytest.mark.parametrize("expected_value", [0.0, 1.0, -8.0, 1000.0])
def test_boundary_of_atol_plus_rtol_times_expected(expected_value):
    rtol, atol = 0.125, 0.25  # powers of two keep the boundary exact in float64
    bound = atol + rtol * abs(expected_value)
    expected = np.array([expected_value] * 4)
    got = expected + np.array([bound, -bound, bound * 1.001, -bound * 1.001])
    check = compare_output("out", expected, got, rtol=rtol, atol=atol)
    assert check.mismatches == 2
    assert [m.index for m in check.first_mismatches] == [(2,), (3,)]


def test_relative_error_uses_floor_for_zero_expected():
    check = compare_output("out", np.array([0.0, 1.0]), np.array([1e-3, 1.0]), rtol=0.0, atol=1e-2)
    assert check.passed
    assert check.max_abs_error == pytest.approx(1e-3)
    assert check.max_rel_error == pytest.approx(1e-3 / 1e-30)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64])
def test_float_dtypes_compare_in_float64(dtype):
    expected = np.array([1.0, 2.0, 3.0, 4.0], dtype=dtype)
    got = expected.copy()
    got[2] = dtype(3.5)
    check = compare_output("out", expected, got, rtol=0.1, atol=0.0)
    assert check.mismatches == 1
    assert check.first_mismatches == [Mismatch(index=(2,), expected=3.0, got=3.5)]
    assert check.max_abs_error == pytest.approx(0.5)
    assert check.max_rel_error == pytest.approx(0.5 / 3.0)


def test_bfloat16_rounding_error_within_tolerance():
    values = np.random.default_rng(1).standard_normal(4096)
    expected = values.astype(ml_dtypes.bfloat16)
    got = (values * (1 + 2**-9)).astype(ml_dtypes.bfloat16)  # about one bfloat16 ulp
    assert not compare_output("out", expected, got, rtol=0.0, atol=0.0).passed
    assert compare_output("out", expected, got, rtol=1.6e-2, atol=1e-5).passed


def test_int32_inputs():
    expected = np.array([[1, -2], [2_000_000_000, 7]], dtype=np.int32)
    got = np.array([[1, -3], [2_000_000_000, 7]], dtype=np.int32)
    check = compare_output("out", expected, got, rtol=0.0, atol=0.5)
    assert check.mismatches == 1
    assert check.first_mismatches == [Mismatch(index=(0, 1), expected=-2.0, got=-3.0)]
    assert compare_output("out", expected, got, rtol=0.0, atol=1.0).passed


def test_int32_difference_does_not_wrap():
    info = np.iinfo(np.int32)
    expected = np.array([info.max], dtype=np.int32)
    got = np.array([info.min], dtype=np.int32)
    check = compare_output("out", expected, got, rtol=0.0, atol=0.0)
    assert check.max_abs_error == float(info.max) - float(info.min)


def test_first_mismatches_are_in_c_order_and_capped():
    expected = np.zeros((4, 5, 6), dtype=np.float32)
    got = expected.copy()
    bad = [(3, 4, 5), (0, 1, 2), (2, 0, 0), (0, 0, 1), (1, 4, 0), (0, 1, 3), (3, 0, 0)]
    for n, index in enumerate(bad):
        got[index] = n + 1
    check = compare_output("out", expected, got, rtol=0.0, atol=0.0)
    assert check.mismatches == len(bad)
    assert [m.index for m in check.first_mismatches] == sorted(bad)[:5]
    for mismatch in check.first_mismatches:
        assert mismatch.expected == 0.0
        assert mismatch.got == float(got[mismatch.index])
    assert len(compare_output("out", expected, got, 0.0, 0.0, max_report=2).first_mismatches) == 2
    assert compare_output("out", expected, got, 0.0, 0.0, max_report=0).first_mismatches == []


def test_first_mismatches_across_chunks(monkeypatch):
    monkeypatch.setattr(compare_module, "CHUNK_ELEMENTS", 16)
    expected = np.arange(100, dtype=np.float64)
    got = expected.copy()
    got[[7, 40, 41, 99]] += 1.0
    check = compare_output("out", expected, got, rtol=0.0, atol=0.0, max_report=3)
    assert check.mismatches == 4
    assert [m.index for m in check.first_mismatches] == [(7,), (40,), (41,)]


def test_non_contiguous_input_uses_logical_c_order():
    expected = np.zeros((3, 4))
    got = np.zeros((3, 4))
    got[2, 1] = 1.0
    check = compare_output("out", expected.T, got.T, rtol=0.0, atol=0.0)
    assert [m.index for m in check.first_mismatches] == [(1, 2)]


@pytest.mark.parametrize("seed", range(40))
def test_agrees_with_numpy_isclose_reference(seed, monkeypatch):
    # np.isclose applies the same rule (|a - b| <= atol + rtol * |b|, NaN == NaN, signed Inf);
    # a tiny chunk size exercises chunk boundaries and mixed fast/slow chunks.
    monkeypatch.setattr(compare_module, "CHUNK_ELEMENTS", 7)
    rng = np.random.default_rng(seed)
    specials = np.array([NAN, INF, -INF, 0.0, -0.0])
    expected = rng.standard_normal(60)
    expected = np.where(rng.random(60) < 0.15, rng.choice(specials, size=60), expected)
    got = expected + rng.normal(0.0, 1e-3, size=60) * (rng.random(60) < 0.5)
    got = np.where(rng.random(60) < 0.1, rng.choice(specials, size=60), got)
    rtol, atol = 1e-3, 1e-3
    reference_ok = np.isclose(got, expected, rtol=rtol, atol=atol, equal_nan=True)
    finite = np.isfinite(expected) & np.isfinite(got)
    check = compare_output("out", expected, got, rtol=rtol, atol=atol, max_report=100)
    assert check.mismatches == np.count_nonzero(~reference_ok)
    assert check.nonfinite_mismatches == np.count_nonzero(~reference_ok & ~finite)
    assert [m.index[0] for m in check.first_mismatches] == list(np.flatnonzero(~reference_ok))
    abs_err = np.abs(got[finite] - expected[finite])
    assert check.max_abs_error == (abs_err.max() if abs_err.size else 0.0)


def test_zero_dimensional_arrays():
    check = compare_output("out", np.array(1.0), np.array(2.0), rtol=0.0, atol=0.0)
    assert check.first_mismatches == [Mismatch(index=(), expected=1.0, got=2.0)]


# --- NaN and Inf ----------------------------------------------------------------------


def test_matching_nan_and_inf_positions_pass():
    expected = np.array([NAN, INF, -INF, 1.0], dtype=np.float32)
    check = compare_output("out", expected, expected.copy(), rtol=0.0, atol=0.0)
    assert check.passed
    assert check.nonfinite_mismatches == 0
    assert check.max_abs_error == 0.0


@pytest.mark.parametrize(
    "expected_value, got_value",
    [(NAN, 1.0), (1.0, NAN), (INF, -INF), (-INF, INF), (INF, NAN), (NAN, INF), (1.0, INF), (INF, 1e30)],
    ids=["nan-vs-finite", "finite-vs-nan", "inf-sign", "neg-inf-sign", "inf-vs-nan", "nan-vs-inf",
         "finite-vs-inf", "inf-vs-huge"],
)
def test_nonfinite_mismatches(expected_value, got_value):
    expected = np.array([2.0, expected_value, 3.0])
    got = np.array([2.0, got_value, 3.0])
    check = compare_output("out", expected, got, rtol=1.0, atol=1.0)
    assert not check.passed
    assert check.mismatches == 1 and check.nonfinite_mismatches == 1
    assert check.first_mismatches[0].index == (1,)
    # errors are measured over finite pairs only
    assert check.max_abs_error == 0.0 and check.max_rel_error == 0.0


def test_nonfinite_and_finite_mismatches_are_counted_separately():
    expected = np.array([1.0, NAN, 3.0, 4.0])
    got = np.array([1.0, 0.0, 30.0, 4.0])
    check = compare_output("out", expected, got, rtol=0.0, atol=1e-6)
    assert check.mismatches == 2 and check.nonfinite_mismatches == 1
    assert check.max_abs_error == pytest.approx(27.0)


def test_unwritten_nan_poison_fails_everywhere():
    expected = random_output(size=5000)
    got = np.full_like(expected, np.nan)
    check = compare_output("out", expected, got, rtol=1e-3, atol=1e-3)
    assert check.mismatches == check.nonfinite_mismatches == 5000


def test_float64_overflow_in_difference_is_an_infinite_error():
    expected = np.array([1e308, 1.0])
    got = np.array([-1e308, 1.0])
    check = compare_output("out", expected, got, rtol=0.5, atol=0.0)
    assert check.mismatches == 1 and check.nonfinite_mismatches == 0
    assert check.max_abs_error == INF


def test_inputs_are_not_modified():
    expected = np.array([NAN, 1.0, INF], dtype=np.float64)
    got = np.array([1.0, NAN, INF], dtype=np.float64)
    compare_output("out", expected, got, rtol=0.0, atol=0.0)
    assert np.isnan(expected[0]) and np.isnan(got[1])


def test_output_check_json_with_nonfinite_values():
    check = compare_output("out", np.array([INF, 1e308]), np.array([NAN, -1e308]), 0.0, 0.0)
    payload = json.loads(check.model_dump_json())
    assert payload["first_mismatches"][0] == {"index": [0], "expected": "Infinity", "got": "NaN"}
    assert payload["max_abs_error"] == "Infinity"
    assert isinstance(OutputCheck.model_validate(check.model_dump()), OutputCheck)


# --- argument errors --------------------------------------------------------------------


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="shape"):
        compare_output("out", np.zeros((2, 3)), np.zeros((3, 2)), rtol=0.0, atol=0.0)


def test_dtype_mismatch_raises():
    with pytest.raises(ValueError, match="dtype"):
        compare_output("out", np.zeros(3, np.float32), np.zeros(3, np.float64), rtol=0.0, atol=0.0)


@pytest.mark.parametrize("rtol, atol", [(-1e-3, 0.0), (0.0, -1.0), (NAN, 0.0), (0.0, INF)])
def test_bad_tolerances_raise(rtol, atol):
    with pytest.raises(ValueError):
        compare_output("out", np.zeros(3), np.zeros(3), rtol=rtol, atol=atol)


# --- degenerate expected outputs -------------------------------------------------------


def test_normal_random_data_is_not_degenerate():
    assert degenerate_warning(random_output(size=10_000), atol=1e-5) is None


def test_all_zeros_is_near_zero():
    warning = degenerate_warning(np.zeros((64, 64), dtype=np.float32), atol=0.0)
    assert warning is not None and "near-zero" in warning


def test_values_within_atol_of_zero_are_near_zero():
    values = random_output(size=1000, dtype=np.float64) * 1e-6
    assert "near-zero" in degenerate_warning(values, atol=1e-4)
    assert degenerate_warning(values, atol=1e-9) is None


def test_constant_output_is_near_constant():
    warning = degenerate_warning(np.full(1000, 3.5, dtype=np.float32), atol=1e-5)
    assert warning is not None and "near-constant" in warning


def test_relative_spread_below_one_in_a_million_is_near_constant():
    values = 1e6 + np.random.default_rng(4).uniform(0.0, 0.5, size=1000)
    assert "near-constant" in degenerate_warning(values, atol=0.0)
    assert degenerate_warning(1e6 + np.arange(1000.0), atol=0.0) is None


def test_single_element_output_is_not_called_constant():
    assert degenerate_warning(np.array([2.0]), atol=1e-5) is None


def test_mostly_nonfinite_output_warns():
    values = random_output(size=100, dtype=np.float64)
    values[:51] = np.nan
    warning = degenerate_warning(values, atol=1e-5)
    assert warning is not None and "NaN/Inf" in warning
    values[:51] = random_output(size=51, seed=3, dtype=np.float64)
    values[:50] = np.inf
    assert degenerate_warning(values, atol=1e-5) is None


def test_degenerate_warning_appears_on_output_check():
    zeros = np.zeros(100, dtype=np.float32)
    check = compare_output("out", zeros, zeros.copy(), rtol=1e-3, atol=1e-5)
    assert check.passed and check.warning is not None and "near-zero" in check.warning


def test_degenerate_warning_for_bfloat16_and_ints():
    assert "near-constant" in degenerate_warning(np.full(8, 2.0, dtype=ml_dtypes.bfloat16), atol=0.0)
    assert degenerate_warning(np.arange(8, dtype=np.int32), atol=0.0) is None


# --- agreement between two runs -----------------------------------------------------------


def test_identical_runs():
    first = random_output(dtype=ml_dtypes.bfloat16)
    assert agreement(first, first.copy(), rtol=0.0, atol=0.0) is Agreement.IDENTICAL


def test_identical_nan_bits_are_identical():
    first = np.array([NAN, 1.0], dtype=np.float32)
    assert agreement(first, first.copy(), rtol=0.0, atol=0.0) is Agreement.IDENTICAL


def test_signed_zero_is_within_tolerance_not_identical():
    assert agreement(np.array([0.0]), np.array([-0.0]), 0.0, 0.0) is Agreement.WITHIN_TOLERANCE


def test_reduction_order_noise_is_within_tolerance():
    first = random_output(dtype=np.float64)
    second = first * (1 + 1e-12)
    assert agreement(first, second, rtol=1e-6, atol=0.0) is Agreement.WITHIN_TOLERANCE


def test_race_differs():
    first = random_output(dtype=np.float32)
    second = first.copy()
    second[123] = 42.0
    assert agreement(first, second, rtol=1e-3, atol=1e-3) is Agreement.DIFFERS


def test_poison_leaking_as_nan_differs():
    first = random_output(dtype=np.float32)
    second = first.copy()
    second[7] = np.nan
    assert agreement(first, second, rtol=1e-3, atol=1e-3) is Agreement.DIFFERS


def test_agreement_value_strings():
    assert Agreement.IDENTICAL.value == "identical"
    assert Agreement.WITHIN_TOLERANCE == "within_tolerance"
    assert Agreement.DIFFERS.value == "differs"


def test_agreement_shape_mismatch_raises():
    with pytest.raises(ValueError):
        agreement(np.zeros(4), np.zeros(5), rtol=0.0, atol=0.0)


# --- speed ----------------------------------------------------------------------------------


def test_large_arrays_spanning_many_chunks_are_counted_exactly():
    expected = np.random.default_rng(0).standard_normal(8 * 1024 * 1024, dtype=np.float32)
    got = expected.copy()
    got[::1_000_003] += 1.0
    check = compare_output("big", expected, got, rtol=1e-5, atol=1e-5)
    assert check.mismatches == 9
    assert check.first_mismatches[1].index == (1_000_003,)
