"""The declarative task manifest: a folder with ``task.toml`` and the .cu files it names.

``load_task`` refuses any manifest it cannot use and says where: every
problem becomes a :class:`TaskError` carrying the file, a field path in the
TOML (``params[2].shape[0]``, ``inputs.a.low``) and what is wrong, so a
task author can fix a manifest without reading this code. The format is
documented in docs/task-format.md.
"""

from __future__ import annotations

import difflib
import hashlib
import io
import math
import re
import tomllib
import zlib
from collections.abc import Mapping
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, NamedTuple, NoReturn, Union, get_args, get_origin

import ml_dtypes
import numpy as np
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from harness import expr

DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float64": np.dtype(np.float64),
    "int8": np.dtype(np.int8),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
    "uint32": np.dtype(np.uint32),
}

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

INTEGER_DTYPES = frozenset(name for name, dt in DTYPES.items() if dt.kind in "iu")

# Limits every CUDA device shares; a launch beyond them can never run.
_MAX_BLOCK = (1024, 1024, 64)
_MAX_THREADS_PER_BLOCK = 1024
_MAX_GRID = (2**31 - 1, 65535, 65535)


class TaskError(Exception):
    """A task manifest that cannot be used."""

    def __init__(self, file: Path, field: str, message: str):
        super().__init__(file, field, message)
        self.file = Path(file)
        self.field = field
        self.message = message

    def __str__(self) -> str:
        return f"{self.file}: {self.field}: {self.message}"


# ---------------------------------------------------------------- field types

def _expr_text(value: Any) -> Any:
    """Let manifests write a constant expression as a bare TOML number."""
    if isinstance(value, bool):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value!r} is not a finite number")
    return repr(value) if isinstance(value, (int, float)) else value


def _expr_tuple(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_expr_text(item) for item in value)
    return value


def _dim3(value: Any) -> Any:
    """Accept 1 to 3 grid/block entries, padding the missing ones with "1"."""
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)):
        return value
    if not 1 <= len(value) <= 3:
        raise ValueError(f"needs 1 to 3 entries (x, y, z), got {len(value)}")
    return tuple(_expr_text(item) for item in value) + ("1",) * (3 - len(value))


def _plain_number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"must be a number, got {type(value).__name__} {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"must be finite, got {value!r}")
    return value


ExprText = Annotated[str, BeforeValidator(_expr_text)]
ExprTuple = Annotated[tuple[str, ...], BeforeValidator(_expr_tuple)]
Dim3 = Annotated[tuple[str, str, str], BeforeValidator(_dim3)]
# int stays int so integer bounds near 2**63 keep every digit
PlainNumber = Annotated[int | float, BeforeValidator(_plain_number)]

_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True)


# --------------------------------------------------------------------- models

class Param(BaseModel):
    model_config = _STRICT
    name: str
    kind: Literal["input", "output", "scalar"]
    dtype: str
    shape: ExprTuple = ()
    value: ExprText | None = None

    @property
    def is_array(self) -> bool:
        return self.kind != "scalar"


class Generator(BaseModel):
    model_config = _STRICT
    kind: Literal["uniform", "normal", "integers", "npy"]
    low: PlainNumber | None = None
    high: PlainNumber | None = None
    mean: PlainNumber | None = None
    std: PlainNumber | None = None
    file: str | None = None
    sha256: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_mean(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("kind") == "normal" and "mean" not in data:
            return {**data, "mean": 0.0}
        return data


class Tolerance(BaseModel):
    model_config = _STRICT
    rtol: float = Field(ge=0, allow_inf_nan=False)
    atol: float = Field(ge=0, allow_inf_nan=False)


class LaunchGeometry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int


class LaunchError(ValueError):
    """A launch expression that does not give a usable value; ``where`` names the entry."""

    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}")
        self.where = where
        self.reason = message


class LaunchSpec(BaseModel):
    model_config = _STRICT
    grid: Dim3
    block: Dim3
    shared_bytes: ExprText = "0"
    per_case: dict[str, LaunchSpec] = {}

    @field_validator("per_case")
    @classmethod
    def _flat_overrides(cls, value: dict[str, LaunchSpec]) -> dict[str, LaunchSpec]:
        for name, spec in value.items():
            if spec.per_case:
                raise ValueError(f"override {name!r} has its own per_case; overrides do not nest")
        return value

    def for_case(self, case_name: str) -> LaunchSpec:
        return self.per_case.get(case_name, self)

    def resolve(self, case: Case) -> LaunchGeometry:
        """Evaluate the geometry for ``case``; raises :class:`LaunchError` (a ValueError)."""
        spec = self.for_case(case.name)
        grid = tuple(_launch_int(spec.grid[i], case, f"grid[{i}]", 1) for i in range(3))
        block = tuple(_launch_int(spec.block[i], case, f"block[{i}]", 1) for i in range(3))
        shared = _launch_int(spec.shared_bytes, case, "shared_bytes", 0)
        _check_cuda_limits(grid, block, case)
        return LaunchGeometry(grid=grid, block=block, shared_bytes=shared)


def _launch_int(text: str, case: Case, where: str, minimum: int) -> int:
    try:
        value = expr.evaluate_int(text, case.dims)
    except expr.ExprError as err:
        raise LaunchError(where, f"{err} (case {case.name!r})") from None
    if value < minimum:
        raise LaunchError(where, f"{text!r} is {value} for case {case.name!r}; must be >= {minimum}")
    return value


def _check_cuda_limits(grid: tuple[int, ...], block: tuple[int, ...], case: Case) -> None:
    for axis in range(3):
        if block[axis] > _MAX_BLOCK[axis]:
            raise LaunchError(f"block[{axis}]", f"{block[axis]} exceeds the CUDA limit of "
                              f"{_MAX_BLOCK[axis]} (case {case.name!r})")
        if grid[axis] > _MAX_GRID[axis]:
            raise LaunchError(f"grid[{axis}]", f"{grid[axis]} exceeds the CUDA limit of "
                              f"{_MAX_GRID[axis]} (case {case.name!r})")
    threads = block[0] * block[1] * block[2]
    if threads > _MAX_THREADS_PER_BLOCK:
        raise LaunchError("block", f"{threads} threads per block exceeds the CUDA limit of "
                          f"{_MAX_THREADS_PER_BLOCK} (case {case.name!r})")


class Case(BaseModel):
    model_config = _STRICT
    name: str
    role: Literal["correctness", "performance", "holdout"]
    dims: dict[str, int]
    seed: int = Field(ge=0)


class Cost(BaseModel):
    model_config = _STRICT
    flops: ExprText | None = None
    bytes: ExprText | None = None


class Task(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    root: Path
    name: str
    description: str
    kernel_name: str
    signature: str
    reference_file: str = "reference.cu"
    initial_file: str = "initial.cu"
    oracle_file: str | None = None
    params: tuple[Param, ...]
    inputs: dict[str, Generator]
    tolerances: dict[str, Tolerance]
    launch: LaunchSpec
    reference_launch: LaunchSpec | None = None
    initial_launch: LaunchSpec | None = None
    cost: Cost = Cost()
    cases: tuple[Case, ...]

    def case(self, name: str) -> Case:
        for case in self.cases:
            if case.name == name:
                return case
        known = ", ".join(c.name for c in self.cases)
        raise KeyError(f"task {self.name!r} has no case {name!r} (cases: {known})")

    def _cases_with(self, *roles: str) -> tuple[Case, ...]:
        return tuple(c for c in self.cases if c.role in roles)

    @property
    def visible_cases(self) -> tuple[Case, ...]:
        return self._cases_with("correctness", "performance")

    @property
    def correctness_cases(self) -> tuple[Case, ...]:
        return self._cases_with("correctness")

    @property
    def performance_cases(self) -> tuple[Case, ...]:
        return self._cases_with("performance")

    @property
    def holdout_cases(self) -> tuple[Case, ...]:
        return self._cases_with("holdout")

    def _params_of(self, *kinds: str) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.kind in kinds)

    @property
    def input_params(self) -> tuple[Param, ...]:
        return self._params_of("input")

    @property
    def output_params(self) -> tuple[Param, ...]:
        return self._params_of("output")

    @property
    def scalar_params(self) -> tuple[Param, ...]:
        return self._params_of("scalar")

    @property
    def array_params(self) -> tuple[Param, ...]:
        return self._params_of("input", "output")

    def shapes(self, dims: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        return {p.name: param_shape(p, dims) for p in self.array_params}

    def scalar_values(self, dims: Mapping[str, int]) -> dict[str, int | float]:
        return {p.name: scalar_value(p, dims) for p in self.scalar_params}

    def nbytes(self, dims: Mapping[str, int]) -> dict[str, int]:
        return {
            name: math.prod(shape) * DTYPES[self._param(name).dtype].itemsize
            for name, shape in self.shapes(dims).items()
        }

    def flops(self, dims: Mapping[str, int]) -> float | None:
        return None if self.cost.flops is None else float(expr.evaluate(self.cost.flops, dims))

    def bytes_moved(self, dims: Mapping[str, int]) -> float | None:
        return None if self.cost.bytes is None else float(expr.evaluate(self.cost.bytes, dims))

    def source(self, which: Literal["reference", "initial"]) -> str:
        files = {"reference": self.reference_file, "initial": self.initial_file}
        if which not in files:
            raise ValueError(f"which must be 'reference' or 'initial', got {which!r}")
        return (self.root / files[which]).read_text(encoding="utf-8")

    def files(self) -> list[Path]:
        """Every file the task consists of, sorted, so a hash over them pins the task."""
        names = {"task.toml", self.reference_file, self.initial_file}
        names |= {self.oracle_file} if self.oracle_file else set()
        names |= {g.file for g in self.inputs.values() if g.kind == "npy" and g.file}
        return sorted({self.root / name for name in names})

    def _param(self, name: str) -> Param:
        return next(p for p in self.params if p.name == name)


def param_shape(param: Param, dims: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(expr.evaluate_int(entry, dims) for entry in param.shape)


def scalar_value(param: Param, dims: Mapping[str, int]) -> int | float:
    """Evaluate a scalar's value and cast it the way the kernel will receive it."""
    assert param.value is not None
    if param.dtype not in INTEGER_DTYPES:
        value = float(expr.evaluate(param.value, dims))
        limit = float(ml_dtypes.finfo(DTYPES[param.dtype]).max)
        if abs(value) > limit:
            raise ValueError(f"{param.value!r} is {value:g}, outside the {param.dtype} range "
                             f"(largest magnitude {limit:g})")
        return value
    value = expr.evaluate_int(param.value, dims)
    info = np.iinfo(DTYPES[param.dtype])
    if not info.min <= value <= info.max:
        raise ValueError(f"{param.value!r} is {value}, outside {param.dtype} "
                         f"[{info.min}, {info.max}]")
    return value


# -------------------------------------------------------------- C signatures

class CParam(NamedTuple):
    name: str
    ctype: str          # the base type as spelled, words joined by one space
    pointer: bool
    const: bool         # for pointers: the pointee is const


class Signature(NamedTuple):
    name: str
    params: tuple[CParam, ...]


_QUALIFIERS = frozenset({"const", "__restrict__", "__restrict"})


def parse_signature(text: str) -> Signature:
    """Read ``extern "C" __global__ void NAME(TYPE a, ...)``; raises ValueError."""
    head, paren, rest = text.partition("(")
    if not paren or not rest.rstrip().rstrip(";").rstrip().endswith(")"):
        raise ValueError("expected extern \"C\" __global__ void NAME(TYPE a, ...)")
    body = rest.rstrip().rstrip(";").rstrip()[:-1]
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
    if not _is_identifier(name):
        raise ValueError(f"kernel name {name!r} is not a C identifier")
    pieces = [] if body.strip() in ("", "void") else body.split(",")
    return Signature(name, tuple(_parse_c_param(p, i + 1) for i, p in enumerate(pieces)))


def _parse_c_param(text: str, position: int) -> CParam:
    tokens = text.replace("*", " * ").split()
    if not tokens or not _is_identifier(tokens[-1]) or tokens[-1] in _QUALIFIERS:
        raise ValueError(f"parameter {position} ({text.strip()!r}) needs a type and a name")
    name, before = tokens[-1], tokens[:-1]
    if before.count("*") > 1:
        raise ValueError(f"parameter {name!r}: pointers to pointers are not supported")
    pointer = "*" in before
    stars = before.index("*") if pointer else len(before)
    base, after = before[:stars], before[stars + 1:]
    bad = [t for t in after if t not in _QUALIFIERS] + [t for t in base if not _is_identifier(t)]
    if bad or any(t.startswith("__restrict") for t in base):
        raise ValueError(f"parameter {name!r}: cannot read {text.strip()!r}")
    type_words = [t for t in base if t != "const"]
    if not type_words:
        raise ValueError(f"parameter {name!r} has no type")
    return CParam(name, " ".join(type_words), pointer, "const" in base)


def _is_identifier(text: str) -> bool:
    return text.isascii() and text.isidentifier()


def dtype_of_ctype(ctype: str) -> str | None:
    return next((d for d, spellings in C_TYPE_SPELLINGS.items() if ctype in spellings), None)


# -------------------------------------------------------------------- inputs

def make_inputs(task: Task, dims: Mapping[str, int], seed: int) -> dict[str, np.ndarray]:
    """Deterministic inputs for (task, dims, seed); each input gets its own stream."""
    shapes = task.shapes(dims)
    arrays: dict[str, np.ndarray] = {}
    for param in task.input_params:
        # keying the stream by name keeps an input's values stable when others are added
        entropy = [seed, zlib.crc32(param.name.encode())]
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))
        array = _draw(task, param, task.inputs[param.name], shapes[param.name], rng)
        arrays[param.name] = np.ascontiguousarray(array)
    return arrays


def _draw(task: Task, param: Param, gen: Generator, shape: tuple[int, ...],
          rng: np.random.Generator) -> np.ndarray:
    dtype = DTYPES[param.dtype]
    if gen.kind == "uniform":
        return rng.uniform(gen.low, gen.high, shape).astype(dtype)
    if gen.kind == "normal":
        mean = 0.0 if gen.mean is None else gen.mean
        return rng.normal(mean, gen.std, shape).astype(dtype)
    if gen.kind == "integers":
        return rng.integers(gen.low, gen.high, shape, dtype=np.int64).astype(dtype)
    assert gen.file is not None and gen.sha256 is not None
    return _read_npy(task.root / "task.toml", f"inputs.{param.name}", task.root / gen.file,
                     gen.sha256, dtype, shape)


def _read_npy(file: Path, field: str, path: Path, sha256: str, dtype: np.dtype,
              shape: tuple[int, ...]) -> np.ndarray:
    """Load a pinned .npy; the hash is checked again in case the file changed since load."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise TaskError(file, f"{field}.file", f"cannot read {path}: {err.strerror or err}") from None
    digest = hashlib.sha256(raw).hexdigest()
    if digest != sha256.lower():
        raise TaskError(file, f"{field}.sha256",
                        f"does not match {path.name} (its SHA-256 is {digest})")
    try:
        array = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise TaskError(file, f"{field}.file", f"{path.name} is not a readable .npy: {err}") from None
    if not isinstance(array, np.ndarray):
        raise TaskError(file, f"{field}.file", f"{path.name} is not a single .npy array")
    if array.dtype.kind == "V" and dtype.kind == "V" and array.dtype.itemsize == dtype.itemsize:
        # .npy has no code for ml_dtypes types; bfloat16 arrays come back as raw 2-byte voids
        array = array.view(dtype)
    if array.dtype != dtype:
        raise TaskError(file, f"{field}.file", f"{path.name} holds {array.dtype}, expected {dtype.name}")
    if array.shape != tuple(shape):
        raise TaskError(file, f"{field}.file",
                        f"{path.name} has shape {array.shape}, expected {tuple(shape)}")
    return array


# ------------------------------------------------------------------- loading

class _Kernel(BaseModel):
    model_config = _STRICT
    name: str
    signature: str
    reference: str = "reference.cu"
    initial: str = "initial.cu"


class _Manifest(BaseModel):
    """task.toml as written; :class:`Task` is the flattened form the referee uses."""

    model_config = _STRICT
    name: str
    description: str
    oracle: str | None = None
    kernel: _Kernel
    params: list[Param]
    inputs: dict[str, Generator] = {}
    tolerance: dict[str, Tolerance] = {}
    launch: LaunchSpec
    reference_launch: LaunchSpec | None = None
    initial_launch: LaunchSpec | None = None
    cost: Cost = Cost()
    cases: list[Case]


def load_task(path: str | Path) -> Task:
    """Load and fully check the task in folder ``path`` (or at ``path`` = its task.toml)."""
    path = Path(path)
    file = path if path.suffix == ".toml" and not path.is_dir() else path / "task.toml"
    file = file.resolve()
    data = _read_toml(file)
    try:
        manifest = _Manifest.model_validate(data)
    except ValidationError as err:
        raise _from_validation_error(file, err) from None
    task = Task(
        root=file.parent, name=manifest.name, description=manifest.description,
        kernel_name=manifest.kernel.name, signature=manifest.kernel.signature,
        reference_file=manifest.kernel.reference, initial_file=manifest.kernel.initial,
        oracle_file=manifest.oracle, params=tuple(manifest.params), inputs=manifest.inputs,
        tolerances=manifest.tolerance, launch=manifest.launch,
        reference_launch=manifest.reference_launch, initial_launch=manifest.initial_launch,
        cost=manifest.cost, cases=tuple(manifest.cases),
    )
    _Checker(task, file).run()
    return task


WHOLE_FILE = "(file)"


def _read_toml(file: Path) -> dict[str, Any]:
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        raise TaskError(file, WHOLE_FILE, "not found; a task folder must contain task.toml") from None
    except OSError as err:
        raise TaskError(file, WHOLE_FILE, f"cannot read: {err.strerror or err}") from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise TaskError(file, WHOLE_FILE, f"not valid UTF-8 (byte {err.start})") from None
    except tomllib.TOMLDecodeError as err:
        raise TaskError(file, WHOLE_FILE, f"invalid TOML: {err}") from None


_PLAIN_MESSAGES = {
    "missing": "missing required key",
    "model_type": "must be a table",
    "dict_type": "must be a table",
    "list_type": "must be an array",
    "tuple_type": "must be an array",
}


def _from_validation_error(file: Path, err: ValidationError) -> TaskError:
    first = err.errors(include_url=False)[0]
    kind, value = first["type"], first.get("input")
    message = _PLAIN_MESSAGES.get(kind) or first["msg"].removeprefix("Value error, ")
    if kind == "extra_forbidden":
        message = _unknown_key_message(first["loc"])
    if kind not in ("missing", "extra_forbidden", "value_error"):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        message += f" (got {type(value).__name__} {shown})"
    return TaskError(file, _field_path(first["loc"]) or WHOLE_FILE, message)


def _unknown_key_message(loc: tuple[int | str, ...]) -> str:
    allowed = _keys_at(loc[:-1])
    if not allowed:
        return "unknown key"
    close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown key (allowed here: {', '.join(allowed)}){hint}"


def _keys_at(loc: tuple[int | str, ...]) -> list[str]:
    """The keys the manifest schema accepts in the table at ``loc``."""
    node: Any = _Manifest
    for part in loc:
        node = _unwrap(node)
        if isinstance(node, type) and issubclass(node, BaseModel):
            field = node.model_fields.get(str(part))
            node = field.annotation if field else None
        elif get_origin(node) in (list, tuple, dict):
            args = [a for a in get_args(node) if a is not Ellipsis]
            node = args[-1] if args else None
        else:
            return []
    node = _unwrap(node)
    return list(node.model_fields) if isinstance(node, type) and issubclass(node, BaseModel) else []


def _unwrap(annotation: Any) -> Any:
    """Strip Annotated[...] and the None of X | None."""
    while True:
        if get_origin(annotation) is Annotated:
            annotation = get_args(annotation)[0]
        elif get_origin(annotation) in (Union, UnionType):
            members = [a for a in get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                return annotation
            annotation = members[0]
        else:
            return annotation


def _field_path(loc: tuple[int | str, ...]) -> str:
    """("params", 2, "shape", 0) -> "params[2].shape[0]"."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            key = part if _is_identifier(part) else f'"{part}"'
            path += f".{key}" if path else key
    return path


# -------------------------------------------------------------------- checks

_GENERATOR_FIELDS = {
    "uniform": ("low", "high"),
    "normal": ("mean", "std"),
    "integers": ("low", "high"),
    "npy": ("file", "sha256"),
}


# Task and case names never reach C code but do end up in file names and reports.
_LABEL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


class _Checker:
    """The semantic checks pydantic cannot express; each failure names its TOML field."""

    def __init__(self, task: Task, file: Path):
        self.task = task
        self.file = file

    def fail(self, field: str, message: str) -> NoReturn:
        raise TaskError(self.file, field, message)

    def run(self) -> None:
        self.check_names()
        self.check_params()
        self.check_generators()
        self.check_tolerances()
        self.check_cases()
        self.check_expressions()
        for case in self.task.cases:
            self.check_case_values(case)
        self.check_npy_contents()
        self.check_signature()
        self.check_files()

    def identifier(self, field: str, text: str) -> None:
        if not _is_identifier(text):
            self.fail(field, f"{text!r} is not a C identifier "
                             "(ASCII letters, digits and _, not starting with a digit)")

    def label(self, field: str, text: str) -> None:
        if not _LABEL.fullmatch(text):
            self.fail(field, f"{text!r} is not a valid name (1 to 64 ASCII letters, digits, "
                             "_ . -, starting with a letter, digit or _)")

    def check_names(self) -> None:
        task = self.task
        self.label("name", task.name)
        self.identifier("kernel.name", task.kernel_name)
        for table, names, check in (("params", [p.name for p in task.params], self.identifier),
                                    ("cases", [c.name for c in task.cases], self.label)):
            for i, name in enumerate(names):
                check(f"{table}[{i}].name", name)
                if name in names[:i]:
                    self.fail(f"{table}[{i}].name", f"duplicate name {name!r}")
        for i, case in enumerate(task.cases):
            for dim in case.dims:
                self.identifier(_field_path(("cases", i, "dims", dim)), dim)

    def check_params(self) -> None:
        for i, p in enumerate(self.task.params):
            field = f"params[{i}]"
            if p.dtype not in DTYPES:
                self.fail(f"{field}.dtype",
                          f"unknown dtype {p.dtype!r} (allowed: {', '.join(DTYPES)})")
            if p.is_array and p.value is not None:
                self.fail(f"{field}.value",
                          f"{p.kind} {p.name!r} is an array: give it a shape, not a value")
            if p.is_array and not p.shape:
                self.fail(f"{field}.shape", f"array {p.name!r} needs at least one shape entry")
            if not p.is_array and p.shape:
                self.fail(f"{field}.shape", f"scalar {p.name!r} takes a value, not a shape")
            if not p.is_array and p.value is None:
                self.fail(f"{field}.value", f"scalar {p.name!r} needs a value expression")
        if not self.task.output_params:
            self.fail("params", 'no parameter has kind = "output"; a kernel must write an output')

    def check_correspondence(self, table: str, given: Mapping[str, Any], kind: str,
                             what: str) -> None:
        """``given`` must have exactly one entry per parameter of ``kind``."""
        params = {p.name: p for p in self.task.params}
        for name in given:
            if name not in params:
                self.fail(f"{table}.{name}", f"there is no parameter named {name!r}")
            if params[name].kind != kind:
                self.fail(f"{table}.{name}", f"{name!r} is {params[name].kind}, not {kind}; "
                                             f"only {kind}s take {what}")
        for p in self.task.params:
            if p.kind == kind and p.name not in given:
                self.fail(table, f"{kind} {p.name!r} has no {what}; add [{table}.{p.name}]")

    def check_tolerances(self) -> None:
        self.check_correspondence("tolerance", self.task.tolerances, "output", "tolerance")

    def check_generators(self) -> None:
        self.check_correspondence("inputs", self.task.inputs, "input", "generator")
        for p in self.task.input_params:
            self.check_generator(f"inputs.{p.name}", self.task.inputs[p.name], p)

    def check_generator(self, field: str, gen: Generator, param: Param) -> None:
        takes = _GENERATOR_FIELDS[gen.kind]
        for key in ("low", "high", "mean", "std", "file", "sha256"):
            if getattr(gen, key) is not None and key not in takes:
                self.fail(f"{field}.{key}", f'{key} does not apply to kind = "{gen.kind}" '
                                            f"(it takes: {', '.join(takes)})")
        for key in takes:
            if getattr(gen, key) is None:
                self.fail(f"{field}.{key}", f'kind = "{gen.kind}" needs {key}')
        is_int = param.dtype in INTEGER_DTYPES
        if is_int != (gen.kind == "integers") and gen.kind != "npy":
            need = ("an integer dtype" if gen.kind == "integers"
                    else 'a float dtype (use kind = "integers")')
            self.fail(f"{field}.kind", f'kind = "{gen.kind}" needs {need}, but {param.name!r} '
                                       f"is {param.dtype}")
        if gen.kind == "npy":
            self.check_npy(field, gen)
        elif gen.kind == "integers":
            self.check_integer_range(field, gen, param.dtype)
        else:
            self.check_float_range(field, gen, param.dtype)

    def check_float_range(self, field: str, gen: Generator, dtype: str) -> None:
        if gen.kind == "uniform" and not gen.low < gen.high:
            self.fail(f"{field}.high", f"high ({gen.high}) must be greater than low ({gen.low})")
        if gen.kind == "normal" and not gen.std > 0:
            self.fail(f"{field}.std", f"std must be > 0, got {gen.std}")
        limit = float(ml_dtypes.finfo(DTYPES[dtype]).max)
        for key in _GENERATOR_FIELDS[gen.kind]:
            if abs(getattr(gen, key)) > limit:
                self.fail(f"{field}.{key}", f"{getattr(gen, key)} is outside the {dtype} range "
                                            f"(largest magnitude {limit:g})")

    def check_integer_range(self, field: str, gen: Generator, dtype: str) -> None:
        for key in ("low", "high"):
            if not isinstance(getattr(gen, key), int):
                self.fail(f"{field}.{key}", f'kind = "integers" needs an integer {key}, '
                                            f"got {getattr(gen, key)!r}")
        if not gen.low < gen.high:
            self.fail(f"{field}.high", f"high ({gen.high}, exclusive) must be greater than "
                                       f"low ({gen.low})")
        info = np.iinfo(DTYPES[dtype])
        if gen.low < info.min:
            self.fail(f"{field}.low", f"{gen.low} is below the {dtype} minimum {info.min}")
        if gen.high - 1 > info.max:
            self.fail(f"{field}.high", f"high is exclusive, and high - 1 = {gen.high - 1} is above "
                                       f"the {dtype} maximum {info.max}")

    def check_npy(self, field: str, gen: Generator) -> None:
        if not (len(gen.sha256) == 64 and all(c in "0123456789abcdefABCDEF" for c in gen.sha256)):
            self.fail(f"{field}.sha256", "must be 64 hexadecimal digits (the file's SHA-256)")
        self.task_file(f"{field}.file", gen.file)

    def check_npy_contents(self) -> None:
        """Hash, dtype and shape of each .npy, once every case's shapes are known to evaluate."""
        for p in self.task.input_params:
            gen = self.task.inputs[p.name]
            if gen.kind != "npy":
                continue
            first, *others = self.task.cases
            shape = param_shape(p, first.dims)
            _read_npy(self.file, f"inputs.{p.name}", self.task.root / gen.file, gen.sha256,
                      DTYPES[p.dtype], shape)
            for case in others:
                if param_shape(p, case.dims) != shape:
                    self.fail(f"inputs.{p.name}.file", f"{gen.file} has one shape, but {p.name!r} "
                              f"is {shape} for case {first.name!r} and "
                              f"{param_shape(p, case.dims)} for case {case.name!r}")

    def task_file(self, field: str, name: str) -> Path:
        """A file named by the manifest: relative, inside the task folder, present."""
        root = self.task.root
        if Path(name).is_absolute() or name.startswith(("/", "\\")):
            self.fail(field, f"{name!r} must be a path relative to the task folder")
        path = (root / name).resolve()
        if not path.is_relative_to(root):
            self.fail(field, f"{name!r} escapes the task folder")
        if not path.is_file():
            self.fail(field, f"{name!r} does not exist in {root}")
        return path

    def check_files(self) -> None:
        self.task_file("kernel.reference", self.task.reference_file)
        self.task_file("kernel.initial", self.task.initial_file)
        if self.task.oracle_file is not None:
            self.task_file("oracle", self.task.oracle_file)

    def launch_specs(self) -> list[tuple[str, LaunchSpec]]:
        specs = [("launch", self.task.launch), ("reference_launch", self.task.reference_launch),
                 ("initial_launch", self.task.initial_launch)]
        return [(field, spec) for field, spec in specs if spec is not None]

    def check_cases(self) -> None:
        names = [c.name for c in self.task.cases]
        if not self.task.performance_cases:
            self.fail("cases", 'no case has role = "performance"; at least one is needed '
                               "to time the kernel")
        for field, spec in self.launch_specs():
            for key in spec.per_case:
                if key not in names:
                    self.fail(f"{field}.per_case.{key}",
                              f"there is no case named {key!r} (cases: {', '.join(names)})")

    def expressions(self) -> list[tuple[str, str]]:
        """(field, text) for every expression in the manifest."""
        found = []
        for i, p in enumerate(self.task.params):
            found += [(f"params[{i}].shape[{j}]", s) for j, s in enumerate(p.shape)]
            found += [(f"params[{i}].value", p.value)] if p.value is not None else []
        for field, spec in self.launch_specs():
            overrides = [(f"{field}.per_case.{k}", v) for k, v in spec.per_case.items()]
            for where, s in [(field, spec), *overrides]:
                found += [(f"{where}.grid[{j}]", t) for j, t in enumerate(s.grid)]
                found += [(f"{where}.block[{j}]", t) for j, t in enumerate(s.block)]
                found.append((f"{where}.shared_bytes", s.shared_bytes))
        for key in ("flops", "bytes"):
            if getattr(self.task.cost, key) is not None:
                found.append((f"cost.{key}", getattr(self.task.cost, key)))
        return found

    def check_expressions(self) -> None:
        known = list(dict.fromkeys(d for c in self.task.cases for d in c.dims))
        used: dict[str, str] = {}
        for field, text in self.expressions():
            try:
                names = expr.parse(text).names
            except expr.ExprError as err:
                self.fail(field, str(err))
            for name in sorted(names - set(known)):
                self.fail(field, f"unknown name {name!r} in {text!r}: names must be dimensions "
                                 f"defined by the cases (dims: {', '.join(known) or 'none'})")
            for name in sorted(names):
                used.setdefault(name, field)
        for i, case in enumerate(self.task.cases):
            for name, where in used.items():
                if name not in case.dims:
                    self.fail(f"cases[{i}].dims", f"case {case.name!r} does not define "
                                                  f"dimension {name!r} (used by {where})")
            for name in case.dims:
                if name not in used:
                    self.fail(_field_path(("cases", i, "dims", name)),
                              f"unknown dimension {name!r}: no expression uses it "
                              f"(dims: {', '.join(used)})")

    def check_case_values(self, case: Case) -> None:
        """Evaluate every expression for ``case`` so a bad case fails at load, not at run."""
        for i, p in enumerate(self.task.params):
            try:
                if not p.is_array:
                    scalar_value(p, case.dims)
            except ValueError as err:
                self.fail(f"params[{i}].value", f"{err} (case {case.name!r})")
            for j, text in enumerate(p.shape):
                try:
                    size = expr.evaluate_int(text, case.dims)
                except expr.ExprError as err:
                    self.fail(f"params[{i}].shape[{j}]", f"{err} (case {case.name!r})")
                if size < 1:
                    self.fail(f"params[{i}].shape[{j}]", f"{text!r} is {size} for case "
                                                        f"{case.name!r}; shapes must be >= 1")
        for field, spec in self.launch_specs():
            try:
                spec.resolve(case)
            except LaunchError as err:
                sub = f".per_case.{case.name}" if case.name in spec.per_case else ""
                self.fail(f"{field}{sub}.{err.where}", err.reason)
        for key in ("flops", "bytes"):
            text = getattr(self.task.cost, key)
            try:
                value = None if text is None else expr.evaluate(text, case.dims)
            except expr.ExprError as err:
                self.fail(f"cost.{key}", f"{err} (case {case.name!r})")
            if value is not None and value < 0:
                self.fail(f"cost.{key}", f"{text!r} is {value} for case {case.name!r}; must be >= 0")

    def check_signature(self) -> None:
        task = self.task
        try:
            sig = parse_signature(task.signature)
        except ValueError as err:
            self.fail("kernel.signature", str(err))
        if sig.name != task.kernel_name:
            self.fail("kernel.signature", f"declares kernel {sig.name!r} but kernel.name is "
                                          f"{task.kernel_name!r}")
        if len(sig.params) != len(task.params):
            names = ", ".join(p.name for p in task.params)
            self.fail("kernel.signature", f"has {len(sig.params)} parameters but params lists "
                                          f"{len(task.params)} ({names})")
        for i, (cparam, param) in enumerate(zip(sig.params, task.params)):
            self.check_c_param(i, cparam, param)

    def check_c_param(self, i: int, c: CParam, p: Param) -> None:
        field = "kernel.signature"
        if c.name != p.name:
            self.fail(field, f"parameter {i + 1} is {c.name!r} but params[{i}] is {p.name!r}; "
                             "names and order must match")
        if c.pointer != p.is_array:
            shape = "a pointer" if c.pointer else "not a pointer"
            self.fail(field, f"{c.name!r} is {shape} but params[{i}] is {p.kind}; arrays are "
                             "passed as pointers and scalars by value")
        if c.ctype not in C_TYPE_SPELLINGS[p.dtype]:
            actual = dtype_of_ctype(c.ctype)
            actual = f"which is {actual}" if actual else "which is not a supported C type"
            others = ", ".join(sorted(C_TYPE_SPELLINGS[p.dtype] - {C_TYPES[p.dtype]}))
            others = f" (or {others})" if others else ""
            self.fail(field, f"{c.name!r} is declared {c.ctype!r}, {actual}; params[{i}] is "
                             f"{p.dtype}, which needs {C_TYPES[p.dtype]!r}{others}")
        if p.kind == "output" and c.const:
            self.fail(field, f"output {c.name!r} is declared const; the kernel must write it")
        if p.kind == "input" and not c.const:
            self.fail(field, f"input {c.name!r} must be declared const (const {c.ctype}* {c.name}) "
                             "so the kernel cannot overwrite it")
