"""Arithmetic expressions over named dimensions, parsed and interpreted, never eval'ed.

Task manifests describe shapes, launch geometry and costs as small formulas
such as ``ceil_div(n, 16)`` or ``2 * m * n * k``. Manifests come from outside
the referee, so the grammar is a tiny whitelist over Python's own parser:
numeric literals, names, ``+ - * / // % **``, unary ``+ -``, the comparisons
``< <= > >= == !=`` (1 when true, 0 when false) and calls of ``ceil_div``, ``min``, ``max``
and ``where(condition, if_nonzero, if_zero)``.
"""

from __future__ import annotations

import ast
import functools
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

MAX_TEXT_LENGTH = 500
MAX_DEPTH = 32
MAX_EXPONENT = 64
# Dimensions, byte counts and flop counts are far below this; the cap keeps a
# hostile ``((9**64)**64)**64`` from tying up the process.
MAX_INT_BITS = 4096

FUNCTIONS = ("ceil_div", "min", "max", "where")

Number = int | float


class ExprError(ValueError):
    """An expression that cannot be parsed or evaluated."""


@dataclass(frozen=True)
class Expr:
    """A parsed expression; evaluate it against a mapping of names to numbers."""

    text: str
    names: frozenset[str]
    _tree: ast.expr = field(repr=False, compare=False)

    def evaluate(self, env: Mapping[str, Number]) -> Number:
        result = _Evaluator(self.text, env).visit(self._tree)
        if isinstance(result, float) and not math.isfinite(result):
            raise ExprError(f"{self.text!r} evaluates to {result!r}, which is not finite")
        return result

    def __str__(self) -> str:
        return self.text


def parse(text: str) -> Expr:
    """Parse ``text`` into an :class:`Expr`, rejecting anything outside the grammar."""
    if not isinstance(text, str):
        raise ExprError(f"expression must be a string, got {type(text).__name__}")
    return _parse_cached(text)


def evaluate(text: str, env: Mapping[str, Number]) -> Number:
    return parse(text).evaluate(env)


def evaluate_int(text: str, env: Mapping[str, Number]) -> int:
    """Evaluate and require an integral result (``4.0`` is accepted as ``4``)."""
    result = evaluate(text, env)
    if isinstance(result, int):
        return result
    if result.is_integer():
        return int(result)
    raise ExprError(f"{text!r} evaluates to {result!r}, which is not an integer")


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str) -> Expr:
    if len(text) > MAX_TEXT_LENGTH:
        raise ExprError(f"expression is {len(text)} characters long (limit {MAX_TEXT_LENGTH})")
    if not text.strip():
        raise ExprError("expression is empty")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as err:
        where = f" at column {err.offset}" if err.offset else ""
        detail = "" if err.msg == "invalid syntax" else f" ({err.msg})"
        raise ExprError(f"invalid syntax{where}{detail} in {text!r}") from None
    except (ValueError, RecursionError, MemoryError) as err:
        raise ExprError(f"cannot parse {text!r}: {err}") from None
    names: set[str] = set()
    _check(tree.body, text, names, depth=1)
    return Expr(text=text, names=frozenset(names), _tree=tree.body)


_BINARY_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)
_UNARY_OPS = (ast.UAdd, ast.USub)
_COMPARISONS: dict[type, Callable[[Number, Number], bool]] = {
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
}


def _check(node: ast.AST, text: str, names: set[str], depth: int) -> None:
    """Reject every node type outside the whitelist, recording the names used."""
    if depth > MAX_DEPTH:
        raise ExprError(
            f"{text!r} is nested more than {MAX_DEPTH} levels deep "
            "(each operator, call or parenthesised term adds a level)"
        )
    if isinstance(node, ast.Constant):
        _check_literal(node, text)
    elif isinstance(node, ast.Name):
        _check_name(node.id, text)
        names.add(node.id)
    elif isinstance(node, ast.BinOp):
        if not isinstance(node.op, _BINARY_OPS):
            raise ExprError(f"operator {_describe(node.op)} is not allowed in {text!r}")
        if isinstance(node.op, ast.Pow):
            _check_exponent(node.right, text)
        _check(node.left, text, names, depth + 1)
        _check(node.right, text, names, depth + 1)
    elif isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, _UNARY_OPS):
            raise ExprError(f"operator {_describe(node.op)} is not allowed in {text!r}")
        _check(node.operand, text, names, depth + 1)
    elif isinstance(node, ast.Compare):
        for op in node.ops:
            if type(op) not in _COMPARISONS:
                raise ExprError(f"operator {_describe(op)} is not allowed (comparisons: < <= > >= == !=) in {text!r}")
        for operand in (node.left, *node.comparators):
            _check(operand, text, names, depth + 1)
    elif isinstance(node, ast.Call):
        _check_call(node, text)
        for arg in node.args:
            _check(arg, text, names, depth + 1)
    else:
        raise ExprError(
            f"{_describe(node)} is not allowed (allowed: numbers, names, "
            f"+ - * / // % **, < <= > >= == !=, {', '.join(FUNCTIONS)}) in {text!r}"
        )


def _check_literal(node: ast.Constant, text: str) -> None:
    # bool is an int subclass, so test the exact type
    if type(node.value) not in (int, float):
        raise ExprError(f"literal {node.value!r} is not allowed (only int and float) in {text!r}")


def _check_name(name: str, text: str) -> None:
    if name in FUNCTIONS:
        raise ExprError(f"{name!r} is a function; call it as {name}(...) in {text!r}")
    if not name.isascii():
        raise ExprError(f"name {name!r} in {text!r} is not an ASCII identifier")


def _check_exponent(node: ast.expr, text: str) -> None:
    value = node.value if isinstance(node, ast.Constant) else None
    if type(value) is not int or not 0 <= value <= MAX_EXPONENT:
        raise ExprError(
            f"exponent {ast.unparse(node)!r} in {text!r} must be an integer literal "
            f"from 0 to {MAX_EXPONENT}"
        )


def _check_call(node: ast.Call, text: str) -> None:
    if not isinstance(node.func, ast.Name):
        raise ExprError(
            f"cannot call {ast.unparse(node.func)!r} (allowed: {', '.join(FUNCTIONS)}) "
            f"in {text!r}"
        )
    name = node.func.id
    if name not in FUNCTIONS:
        raise ExprError(
            f"unknown function {name!r} (allowed: {', '.join(FUNCTIONS)}) in {text!r}"
        )
    if node.keywords:
        raise ExprError(f"{name}() takes no keyword arguments in {text!r}")
    if any(isinstance(arg, ast.Starred) for arg in node.args):
        raise ExprError(f"{name}() does not accept *arguments in {text!r}")
    count = len(node.args)
    if name == "ceil_div" and count != 2:
        raise ExprError(f"ceil_div() takes exactly 2 arguments, got {count} in {text!r}")
    if name == "where" and count != 3:
        raise ExprError(f"where() takes exactly 3 arguments (condition, if_nonzero, if_zero), got {count} "
                        f"in {text!r}")
    if name in ("min", "max") and count < 2:
        raise ExprError(f"{name}() takes at least 2 arguments, got {count} in {text!r}")


def _describe(node: ast.AST) -> str:
    symbols = {
        ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.LShift: "<<",
        ast.RShift: ">>", ast.MatMult: "@", ast.Invert: "~", ast.Not: "not",
        ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in",
    }
    symbol = symbols.get(type(node))
    if symbol:
        return repr(symbol)
    kinds = {
        ast.Attribute: "attribute access", ast.Subscript: "subscript",
        ast.BoolOp: "boolean operator",
        ast.Lambda: "lambda", ast.IfExp: "conditional expression",
    }
    return kinds.get(type(node), f"{type(node).__name__} expression")


class _Evaluator:
    """Interprets a tree that :func:`_check` has already accepted."""

    def __init__(self, text: str, env: Mapping[str, Number]):
        self.text = text
        self.env = env

    def visit(self, node: ast.expr) -> Number:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self.lookup(node.id)
        if isinstance(node, ast.UnaryOp):
            value = self.visit(node.operand)
            return -value if isinstance(node.op, ast.USub) else +value
        if isinstance(node, ast.BinOp):
            return self.binary(node.op, self.visit(node.left), self.visit(node.right))
        if isinstance(node, ast.Compare):
            return self.compare(node)
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        if node.func.id == "where":  # only the branch taken is evaluated: where(n > 0, m // n, 0)
            condition, if_nonzero, if_zero = node.args
            return self.visit(if_nonzero if self.visit(condition) != 0 else if_zero)
        args = [self.visit(arg) for arg in node.args]
        if node.func.id == "ceil_div":
            return self.ceil_div(*args)
        return min(args) if node.func.id == "min" else max(args)

    def lookup(self, name: str) -> Number:
        if name not in self.env:
            known = ", ".join(self.env) or "none"
            raise ExprError(f"unknown name {name!r} (known: {known}) in {self.text!r}")
        value = self.env[name]
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ExprError(f"{name!r} is {value!r}, not a number, in {self.text!r}")
        return int(value) if isinstance(value, numbers.Integral) else float(value)

    def compare(self, node: ast.Compare) -> int:
        """1 or 0; a chain (``1 <= m < 64``) holds when every link does, and stops at the first that does not."""
        left = self.visit(node.left)
        for op, operand in zip(node.ops, node.comparators):
            right = self.visit(operand)
            if not _COMPARISONS[type(op)](left, right):
                return 0
            left = right
        return 1

    def binary(self, op: ast.operator, left: Number, right: Number) -> Number:
        if isinstance(op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ExprError(f"division by zero in {self.text!r}")
        if isinstance(left, int) and isinstance(right, int):
            self.guard_size(op, left, right)
        try:
            return _OPERATIONS[type(op)](left, right)
        except (OverflowError, ZeroDivisionError) as err:
            raise ExprError(f"cannot evaluate {self.text!r}: {err}") from None

    def guard_size(self, op: ast.operator, left: int, right: int) -> None:
        """Refuse integer products and powers that would grow past MAX_INT_BITS."""
        if isinstance(op, ast.Pow):
            bits = abs(left).bit_length() * right
        elif isinstance(op, ast.Mult):
            bits = abs(left).bit_length() + abs(right).bit_length()
        else:
            return
        if bits > MAX_INT_BITS:
            raise ExprError(f"intermediate result in {self.text!r} exceeds {MAX_INT_BITS} bits")

    def ceil_div(self, a: Number, b: Number) -> int:
        a, b = self.as_int(a, "ceil_div"), self.as_int(b, "ceil_div")
        if b == 0:
            raise ExprError(f"ceil_div by zero in {self.text!r}")
        return -(-a // b)

    def as_int(self, value: Number, where: str) -> int:
        if isinstance(value, int):
            return value
        if value.is_integer():
            return int(value)
        raise ExprError(f"{where}() needs integers, got {value!r} in {self.text!r}")


_OPERATIONS: dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b,
}
