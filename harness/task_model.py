"""The task's models: parameters, generators, tolerances, launches, cases and the :class:`Task` the
referee uses, with the shape and scalar arithmetic on them. Loading and checking a manifest is
:mod:`harness.task` (``load_task``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import ml_dtypes
import numpy as np
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from harness import expr
from harness.arithmetic import CUDA_CORES, Arithmetic
# re-exported, so the whole task API can be imported from this module
from harness.csig import C_TYPE_SPELLINGS, C_TYPES, CParam, Signature, dtype_of_ctype, parse_signature

__all__ = [
    "DTYPES", "C_TYPES", "C_TYPE_SPELLINGS", "INTEGER_DTYPES", "WHOLE_FILE", "TaskError", "ExprText",
    "ExprTuple", "Dim3", "PlainNumber", "Param", "Generator", "Tolerance", "LaunchGeometry",
    "LaunchError", "LaunchSpec", "Case", "Cost", "Vendor", "Task", "CParam", "Signature", "dtype_of_ctype",
    "param_shape", "scalar_value", "parse_signature",
]

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
    return _expr_tuple(value) + ("1",) * (3 - len(value))


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
        if shared > MAX_SHARED_BYTES:
            raise LaunchError("shared_bytes", f"{shared} exceeds {MAX_SHARED_BYTES} (case {case.name!r})")
        _check_cuda_limits(grid, block, case)
        return LaunchGeometry(grid=grid, block=block, shared_bytes=shared)


# No device has more shared memory per block than this; the bound keeps the value a C int.
MAX_SHARED_BYTES = 1 << 24


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
    """A case as the referee uses it: ``dims`` holds the case's own dimensions and the task's
    ``[constants]``, so every expression (and the oracle) sees both under their names."""

    model_config = _STRICT
    name: str
    role: Literal["correctness", "performance", "holdout"]
    dims: dict[str, int | float]
    seed: int = Field(ge=0)


class Cost(BaseModel):
    model_config = _STRICT
    flops: ExprText | None = None
    bytes: ExprText | None = None
    # Which compute peak bounds `flops` in the roofline (harness/peaks.py): CUDA-core float32 or
    # bfloat16 tensor cores with float32 accumulation.
    compute: Literal["fp32", "tensor_bf16"] = "fp32"


class Vendor(BaseModel):
    """A vendor library call computing the same result, timed as a yardstick ("vs cuBLAS").

    For ``op = "gemm"``: row-major C (m x n) = A (m x k) · B (k x n), where a, b and c name
    parameters and m, n and k are expressions of the case dimensions.
    """

    model_config = _STRICT
    library: Literal["cublas"]
    op: Literal["gemm"]
    a: str
    b: str
    c: str
    m: ExprText
    n: ExprText
    k: ExprText


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
    # The units a kernel may compute on (harness/arithmetic.py): "cuda-cores", "any" or tensor-core input types.
    arithmetic: Arithmetic = CUDA_CORES
    vendor: Vendor | None = None
    # Named numbers usable in every expression like a dimension (a pooling window, an epsilon); each case's
    # dims already hold them.
    constants: dict[str, int | float] = {}
    # Whether kernels may call the device heap (malloc, free, new): off, a kernel that calls it is refused
    # (ReasonCode.DEVICE_HEAP), since the heap outlives every launch (harness/worker_side/device_heap.py).
    device_heap: bool = False
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
        return {p.name: math.prod(param_shape(p, dims)) * DTYPES[p.dtype].itemsize
                for p in self.array_params}

    def flops(self, dims: Mapping[str, int]) -> float | None:
        return None if self.cost.flops is None else float(expr.evaluate(self.cost.flops, dims))

    def bytes_moved(self, dims: Mapping[str, int]) -> float | None:
        return None if self.cost.bytes is None else float(expr.evaluate(self.cost.bytes, dims))

    def own_launch(self, which: Literal["reference", "initial"]) -> LaunchSpec:
        """The launch of the task's own reference or initial kernel: its own section, else [launch]."""
        if which not in ("reference", "initial"):
            raise ValueError(f"which must be 'reference' or 'initial', got {which!r}")
        return (self.reference_launch if which == "reference" else self.initial_launch) or self.launch

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


WHOLE_FILE = "(file)"
