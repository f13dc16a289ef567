"""The C side of a task: how each dtype is spelled in C, and reading a kernel's signature.

:func:`parse_signature` reads ``extern "C" __global__ void NAME(TYPE a, ...)``,
the subset a kernel entry point needs: scalars by value and single pointers,
with ``const`` and ``__restrict__`` qualifiers. The dtype names are those of
:data:`harness.task_model.DTYPES`.
"""

from __future__ import annotations

from typing import NamedTuple

# Canonical spellings are builtin types (or the cuda_fp16/bf16 ones) so generated
# code compiles under NVRTC without <cstdint>.
C_TYPES: dict[str, str] = {
    "float32": "float",
    "float16": "__half",
    "bfloat16": "__nv_bfloat16",
    "float64": "double",
    "int8": "signed char",
    "int32": "int",
    "int64": "long long",
    "uint8": "unsigned char",
    "uint32": "unsigned int",
}

# Every spelling accepted in a kernel signature, per dtype. size_t is left out
# on purpose: its width is not part of the kernel's contract.
C_TYPE_SPELLINGS: dict[str, frozenset[str]] = {
    "float32": frozenset({"float"}),
    "float16": frozenset({"__half", "half"}),
    "bfloat16": frozenset({"__nv_bfloat16", "nv_bfloat16"}),
    "float64": frozenset({"double"}),
    "int8": frozenset({"signed char", "int8_t"}),
    "int32": frozenset({"int", "signed int", "signed", "int32_t"}),
    "int64": frozenset(
        {"long long", "long long int", "signed long long", "signed long long int",
         "long", "long int", "int64_t"}
    ),
    "uint8": frozenset({"unsigned char", "uint8_t"}),
    "uint32": frozenset({"unsigned int", "unsigned", "uint32_t"}),
}


def dtype_of_ctype(ctype: str) -> str | None:
    """The dtype a C type spelling stands for, or None."""
    return next((d for d, spellings in C_TYPE_SPELLINGS.items() if ctype in spellings), None)


class CParam(NamedTuple):
    name: str
    ctype: str          # the base type as spelled, words joined by one space
    pointer: bool
    const: bool         # for pointers: the pointee is const


class Signature(NamedTuple):
    name: str
    params: tuple[CParam, ...]


_QUALIFIERS = frozenset({"const", "__restrict__", "__restrict"})


def is_identifier(text: str) -> bool:
    """A C identifier: ASCII letters, digits and _, not starting with a digit."""
    return text.isascii() and text.isidentifier()


def parse_signature(text: str) -> Signature:
    """Read ``extern "C" __global__ void NAME(TYPE a, ...)``; raises ValueError."""
    head, paren, rest = text.partition("(")
    rest = rest.rstrip().rstrip(";").rstrip()
    if not paren or not rest.endswith(")"):
        raise ValueError("expected extern \"C\" __global__ void NAME(TYPE a, ...)")
    body = rest[:-1]
    if "(" in body or ")" in body:
        raise ValueError("the parameter list cannot contain parentheses")
    words = head.split()
    if words[:2] != ["extern", '"C"']:
        raise ValueError('must start with extern "C" so the kernel name is not mangled')
    if words[2:3] != ["__global__"]:
        raise ValueError('expected __global__ after extern "C"')
    if len(words) != 5 or words[3] != "void":
        raise ValueError("a kernel must return void: extern \"C\" __global__ void NAME(...)")
    name = words[4]
    if not is_identifier(name):
        raise ValueError(f"kernel name {name!r} is not a C identifier")
    pieces = [] if body.strip() in ("", "void") else body.split(",")
    return Signature(name, tuple(_parse_c_param(p, i + 1) for i, p in enumerate(pieces)))


def _parse_c_param(text: str, position: int) -> CParam:
    tokens = text.replace("*", " * ").split()
    if not tokens or not is_identifier(tokens[-1]) or tokens[-1] in _QUALIFIERS:
        raise ValueError(f"parameter {position} ({text.strip()!r}) needs a type and a name")
    name, before = tokens[-1], tokens[:-1]
    if before.count("*") > 1:
        raise ValueError(f"parameter {name!r}: pointers to pointers are not supported")
    pointer = "*" in before
    stars = before.index("*") if pointer else len(before)
    base, after = before[:stars], before[stars + 1:]
    bad = [t for t in after if t not in _QUALIFIERS] + [t for t in base if not is_identifier(t)]
    if bad or any(t.startswith("__restrict") for t in base):
        raise ValueError(f"parameter {name!r}: cannot read {text.strip()!r}")
    type_words = [t for t in base if t != "const"]
    if not type_words:
        raise ValueError(f"parameter {name!r} has no type")
    return CParam(name, " ".join(type_words), pointer, "const" in base)
