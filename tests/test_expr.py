import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.expr import (
    MAX_DEPTH,
    MAX_TEXT_LENGTH,
    Expr,
    ExprError,
    evaluate,
    evaluate_int,
    parse,
)

DIMS = {"m": 31, "n": 37, "k": 29}


# ----------------------------------------------------------- allowed syntax

@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7", 7),
        ("2.5", 2.5),
        ("1e3", 1000.0),
        ("m", 31),
        ("m + n", 68),
        ("m - n", -6),
        ("m * n * k", 31 * 37 * 29),
        ("m / 2", 15.5),
        ("m // 2", 15),
        ("-m // 2", -16),
        ("m % 5", 1),
        ("-m % 5", 4),
        ("m ** 2", 961),
        ("2 ** 0", 1),
        ("2 ** 64", 2**64),
        ("-m", -31),
        ("+m", 31),
        ("--m", 31),
        ("(m + n) * k", 68 * 29),
        ("ceil_div(n, 16)", 3),
        ("ceil_div(32, 16)", 2),
        ("ceil_div(-5, 2)", -2),
        ("min(m, n)", 31),
        ("min(m, n, k)", 29),
        ("max(m, n, k, 100)", 100),
        ("max(m / 2, 1)", 15.5),
        ("2 * m * n * k", 2 * 31 * 37 * 29),
        ("4 * (m * k + k * n + m * n)", 4 * (31 * 29 + 29 * 37 + 31 * 37)),
        ("  m + 1  ", 32),
        ("m < n", 1),
        ("m > n", 0),
        ("m <= 31", 1),
        ("m >= 32", 0),
        ("m == 31", 1),
        ("m != 31", 0),
        ("m / 2 > 15", 1),
        ("1 <= m < n", 1),
        ("1 <= m < 31", 0),
        ("4 * m * (m <= 16384)", 4 * 31),
        ("4 * m * (m > 16384)", 0),
        ("where(m <= 32, 256, 1024)", 256),
        ("where(m > 32, 256, 1024)", 1024),
        ("where(m - 31, 1, 2.5)", 2.5),
        ("where(0.5, m, n)", 31),
        ("ceil_div(n, where(n < 64, 32, 128))", 2),
    ],
)
def test_allowed_constructs_evaluate(text, expected):
    result = evaluate(text, DIMS)
    assert result == expected
    assert type(result) is type(expected)


def test_a_row_limit_reads_as_a_comparison():
    # what an author had to write as `4 * cols * (1 - min(cols // 16385, 1))` for "cols <= 16384"
    for cols in (1, 16383, 16384, 16385, 1 << 20):
        assert evaluate("4 * cols * (cols <= 16384)", {"cols": cols}) == \
            evaluate("4 * cols * (1 - min(cols // 16385, 1))", {"cols": cols})


def test_where_evaluates_only_the_branch_taken():
    assert evaluate("where(n > 0, m // n, 0)", {"m": 8, "n": 0}) == 0
    assert evaluate("where(n > 0, m // n, 0)", {"m": 8, "n": 4}) == 2
    with pytest.raises(ExprError, match="division by zero"):
        evaluate("where(n == 0, m // n, 0)", {"m": 8, "n": 0})


def test_a_chain_stops_at_the_first_link_that_fails():
    # as in Python: 0 > 1 is false, so 1 // n is never evaluated
    assert evaluate("0 > 1 < 1 // n", {"n": 0}) == 0


def test_names_in_both_branches_of_where_are_recorded():
    assert parse("where(a < b, c, d)").names == frozenset("abcd")


def test_int_only_arithmetic_stays_exact():
    big = evaluate("m ** 40 * n ** 20", DIMS)
    assert big == 31**40 * 37**20
    assert isinstance(big, int)


def test_true_division_is_float_even_when_exact():
    assert evaluate("8 / 2", {}) == 4.0
    assert isinstance(evaluate("8 / 2", {}), float)


def test_expr_exposes_text_and_names():
    e = parse("ceil_div(n, 16) * max(m, k) + n")
    assert isinstance(e, Expr)
    assert e.text == "ceil_div(n, 16) * max(m, k) + n"
    assert e.names == frozenset({"n", "m", "k"})
    assert str(e) == e.text


def test_function_names_are_not_reported_as_names():
    assert parse("min(1, 2)").names == frozenset()


def test_expr_is_frozen_and_reusable():
    e = parse("m + n")
    with pytest.raises(AttributeError):
        e.text = "k"  # type: ignore[misc]
    assert e.evaluate({"m": 1, "n": 2}) == 3
    assert e.evaluate({"m": 10, "n": 20}) == 30


def test_parse_equality_follows_text():
    assert parse("m + 1") == parse("m + 1")
    assert parse("m + 1") != parse("m+1")


def test_env_accepts_numpy_numbers():
    np = pytest.importorskip("numpy")
    assert evaluate("m * 2", {"m": np.int64(4)}) == 8
    assert isinstance(evaluate("m * 2", {"m": np.int64(4)}), int)
    assert evaluate("x * 2", {"x": np.float32(1.5)}) == 3.0


def test_evaluate_int_accepts_integral_results():
    assert evaluate_int("m * 2", DIMS) == 62
    result = evaluate_int("8 / 2", {})
    assert result == 4 and type(result) is int


def test_evaluate_int_rejects_fractions():
    with pytest.raises(ExprError, match=r"15\.5, which is not an integer"):
        evaluate_int("m / 2", DIMS)


# --------------------------------------------------------- forbidden syntax

@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("os.path", "attribute access is not allowed"),
        ("m.real", "attribute access is not allowed"),
        ("__import__('os')", "unknown function '__import__' (allowed: ceil_div, min, max, where)"),
        ("foo(m)", "unknown function 'foo' (allowed: ceil_div, min, max, where)"),
        ("m.bit_length()", "cannot call 'm.bit_length'"),
        ("(lambda: 1)()", "cannot call"),
        ("lambda: 1", "lambda is not allowed"),
        ("a[0]", "subscript is not allowed"),
        ("m is n", "operator 'is' is not allowed (comparisons: < <= > >= == !=)"),
        ("m is not n", "operator 'is not' is not allowed"),
        ("m in n", "operator 'in' is not allowed"),
        ("m < n in k", "operator 'in' is not allowed"),
        ("where(m, n)", "where() takes exactly 3 arguments (condition, if_nonzero, if_zero), got 2"),
        ("where(m, n, k, 1)", "where() takes exactly 3 arguments"),
        ("where", "'where' is a function; call it as where(...)"),
        ("m and n", "boolean operator is not allowed"),
        ("not m", "'not' is not allowed"),
        ("m if n else k", "conditional expression is not allowed"),
        ("m << 2", "'<<' is not allowed"),
        ("m & 1", "'&' is not allowed"),
        ("m | 1", "'|' is not allowed"),
        ("m ^ 1", "'^' is not allowed"),
        ("~m", "'~' is not allowed"),
        ("m @ n", "'@' is not allowed"),
        ("True", "literal True is not allowed"),
        ("None", "literal None is not allowed"),
        ("'m'", "literal 'm' is not allowed"),
        ("b'x'", "literal b'x' is not allowed"),
        ("1j", "literal 1j is not allowed"),
        ("[m, n]", "List expression is not allowed"),
        ("(m, n)", "Tuple expression is not allowed"),
        ("{m: 1}", "Dict expression is not allowed"),
        ("f'{m}'", "JoinedStr expression is not allowed"),
        ("[x for x in m]", "ListComp expression is not allowed"),
        ("(x := 1)", "NamedExpr expression is not allowed"),
        ("min", "'min' is a function; call it as min(...)"),
        ("ceil_div(m)", "ceil_div() takes exactly 2 arguments, got 1"),
        ("ceil_div(m, n, k)", "ceil_div() takes exactly 2 arguments, got 3"),
        ("min(m)", "min() takes at least 2 arguments, got 1"),
        ("max()", "max() takes at least 2 arguments, got 0"),
        ("max(m, key=n)", "max() takes no keyword arguments"),
        ("max(*m)", "max() does not accept *arguments"),
        ("2 ** 65", "exponent '65'"),
        ("2 ** -1", "exponent '-1'"),
        ("2 ** m", "exponent 'm'"),
        ("2 ** 2.0", "exponent '2.0'"),
        ("9 ** 9 ** 9", "exponent '9 ** 9'"),
        ("m +", "invalid syntax"),
        ("m = 1", "invalid syntax"),
        ("import os", "invalid syntax"),
        ("", "expression is empty"),
        ("   ", "expression is empty"),
        ("\u00e9 + 1", "not an ASCII identifier"),
    ],
)
def test_forbidden_constructs_are_rejected_at_parse(text, message):
    with pytest.raises(ExprError) as err:
        parse(text)
    assert message in str(err.value)


def test_exponent_message_names_the_limit():
    with pytest.raises(ExprError, match="integer literal from 0 to 64"):
        parse("m ** 100")


def test_too_long_text_is_rejected():
    text = "+".join(["1"] * 300)
    assert len(text) > MAX_TEXT_LENGTH
    with pytest.raises(ExprError, match=rf"{len(text)} characters long \(limit {MAX_TEXT_LENGTH}\)"):
        parse(text)


def test_deep_nesting_is_rejected():
    text = "-" * (MAX_DEPTH + 1) + "m"
    with pytest.raises(ExprError, match="nested more than 32 levels"):
        parse(text)


def test_nesting_up_to_the_limit_is_allowed():
    assert evaluate("-" * (MAX_DEPTH - 1) + "m", {"m": 2}) == -2


def test_deeply_nested_calls_are_rejected():
    text = "min(" * (MAX_DEPTH + 1) + "m" + ", 1)" * (MAX_DEPTH + 1)
    with pytest.raises(ExprError, match="nested more than 32 levels"):
        parse(text)


def test_redundant_parentheses_do_not_count_as_nesting():
    assert evaluate("(" * 40 + "m" + ")" * 40, {"m": 3}) == 3


def test_parser_nesting_limit_becomes_expr_error():
    text = "(" * 240 + "m" + ")" * 240
    assert len(text) <= MAX_TEXT_LENGTH
    with pytest.raises(ExprError, match="invalid syntax"):
        parse(text)


def test_non_string_is_rejected():
    with pytest.raises(ExprError, match="must be a string"):
        parse(5)  # type: ignore[arg-type]


def test_expr_error_is_a_value_error():
    assert issubclass(ExprError, ValueError)


# ------------------------------------------------------- evaluation errors

def test_unknown_name_lists_known_names():
    with pytest.raises(ExprError) as err:
        evaluate("q + m", DIMS)
    assert "unknown name 'q' (known: m, n, k)" in str(err.value)


def test_unknown_name_with_empty_env():
    with pytest.raises(ExprError, match=r"unknown name 'm' \(known: none\)"):
        evaluate("m", {})


@pytest.mark.parametrize("text", ["m / 0", "m // (n - n)", "m % 0", "1.5 % 0.0", "m / 0.0"])
def test_division_by_zero(text):
    with pytest.raises(ExprError, match="division by zero"):
        evaluate(text, DIMS)


def test_ceil_div_by_zero():
    with pytest.raises(ExprError, match="ceil_div by zero"):
        evaluate("ceil_div(m, n - n)", DIMS)


def test_ceil_div_needs_integers():
    with pytest.raises(ExprError, match=r"ceil_div\(\) needs integers, got 15.5"):
        evaluate("ceil_div(m / 2, 2)", DIMS)
    assert evaluate("ceil_div(m / 1, 2)", DIMS) == 16


def test_ceil_div_with_negative_divisor_rounds_up():
    assert evaluate("ceil_div(7, -2)", {}) == -3


def test_huge_integer_powers_are_refused():
    with pytest.raises(ExprError, match="exceeds 4096 bits"):
        evaluate("((9 ** 64) ** 64) ** 64", {})


def test_huge_integer_products_are_refused():
    with pytest.raises(ExprError, match="exceeds 4096 bits"):
        evaluate("(m ** 64) * (m ** 64) * (m ** 64) * (m ** 64)", {"m": 2**30})


def test_float_overflow_is_reported():
    with pytest.raises(ExprError, match="cannot evaluate"):
        evaluate("x ** 64", {"x": 1e300})


def test_non_finite_result_is_reported():
    with pytest.raises(ExprError, match="not finite"):
        evaluate("x * 10", {"x": 1e308})


@pytest.mark.parametrize("value", [True, "3", None, [1]])
def test_non_numeric_env_values_are_rejected(value):
    with pytest.raises(ExprError, match="not a number"):
        evaluate("m + 1", {"m": value})


# ------------------------------------------------ agreement with Python itself

_leaves = st.one_of(st.integers(-1000, 1000).map(str), st.sampled_from(["m", "n", "k"]))


def _combine(children):
    binary = st.tuples(children, st.sampled_from(["+", "-", "*", "//", "%", "/"]), children).map(
        lambda t: f"({t[0]} {t[1]} {t[2]})")
    unary = st.tuples(st.sampled_from(["-", "+"]), children).map(lambda t: f"{t[0]}{t[1]}")
    calls = st.tuples(st.sampled_from(["min", "max"]), st.lists(children, min_size=2, max_size=3)
                      ).map(lambda t: f"{t[0]}({', '.join(t[1])})")
    comparisons = st.tuples(children, st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), children).map(
        lambda t: f"({t[0]} {t[1]} {t[2]})")
    return st.one_of(binary, unary, calls, comparisons)


@settings(max_examples=300, deadline=None)
@given(st.recursive(_leaves, _combine, max_leaves=12))
def test_matches_python_arithmetic(text):
    if len(text) > 500:
        return
    env = {"m": 31, "n": -7, "k": 4}
    try:
        # the generated text is trusted test input; eval is the reference semantics
        expected = eval(text, {"__builtins__": {"min": min, "max": max}}, dict(env))  # noqa: S307
    except ZeroDivisionError:
        with pytest.raises(ExprError):
            evaluate(text, env)
        return
    try:
        result = evaluate(text, env)
    except ExprError as err:
        assert "nested more than" in str(err) or "not finite" in str(err)
        return
    if isinstance(expected, bool):  # a comparison gives 1 or 0 here, True or False in Python
        expected = int(expected)
    assert result == expected and type(result) is type(expected)
