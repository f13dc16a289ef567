"""`kernel-referee new-task`'s inputs: the cases file (docs/task-format.md, "new-task's cases file") and what
is inferred from it and the signature, as a :class:`TaskPlan` harness/task_toml.py writes out.

Inferred: each parameter's kind from the signature (a const pointer is an input, any other pointer an
output, a value a scalar) and its dtype from the C type; a scalar named like a dimension takes that
dimension's value; with a single dimension, arrays are 1-D over it; a float input is drawn uniformly from
[-1, 1]; the dimensions are those of the cases; a case's seed is its position (from 1); a case without a
role is a performance case when it is at least 1/PERFORMANCE_SHARE the size of the largest case, else a
correctness case; without a holdout case one is proposed (commented out in task.toml); a GEMM-shaped
signature gets a `[vendor]` table (harness/new_task_vendor.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness import expr
from harness.arithmetic import CUDA_CORES, Arithmetic
from harness.csig import C_TYPE_SPELLINGS, parse_signature
from harness.new_task_vendor import gemm_vendor, said
from harness.task_model import (DTYPES, INTEGER_DTYPES, Case, Cost, Generator, LaunchSpec, Param, Tolerance, Vendor,
                                dtype_of_ctype)

PERFORMANCE_SHARE = 8
DEFAULT_FLOAT_INPUT = Generator(kind="uniform", low=-1.0, high=1.0)
_SPEC = ConfigDict(extra="forbid", frozen=True, strict=True)


class NewTaskError(ValueError):
    """An input of new-task that cannot make a task; the message is one line naming the input and field."""


class ParamSpec(BaseModel):
    model_config = _SPEC
    shape: list[str | int] | None = None
    dtype: str | None = None
    distribution: Generator | None = None
    value: str | int | float | None = None
    reduction: str | int | None = None
    tolerance: Tolerance | None = None


class CaseSpec(BaseModel):
    model_config = _SPEC
    name: str
    dims: dict[str, int]
    seed: int | None = Field(default=None, ge=0)
    role: Literal["correctness", "performance", "holdout"] | None = None


class CasesFile(BaseModel):
    model_config = _SPEC
    cases: list[CaseSpec] = Field(min_length=1)
    params: dict[str, ParamSpec] = {}
    launch: LaunchSpec
    reference_launch: LaunchSpec | None = None
    initial_launch: LaunchSpec | None = None
    cost: Cost | None = None
    # The units a kernel may compute on (harness/arithmetic.py); task.toml always states it.
    arithmetic: Arithmetic = CUDA_CORES


@dataclass
class TaskPlan:
    """Everything task.toml will say, before the tolerances are proposed."""

    name: str
    description: str
    kernel_name: str
    signature: str
    params: list[Param]
    inputs: dict[str, Generator]
    spec: CasesFile
    cases: list[Case]
    inferred: list[str] = field(default_factory=list)         # what was inferred, for the command to say
    proposed_holdout: Case | None = None
    vendor: Vendor | None = None                                # the [vendor] yardstick of a GEMM-shaped task

    @property
    def outputs(self) -> list[Param]:
        return [p for p in self.params if p.kind == "output"]


def read_cases_file(path: Path) -> CasesFile:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise NewTaskError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise NewTaskError(f"{path}: not valid JSON: {exc}") from None
    try:
        return CasesFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "(file)"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise NewTaskError(f"{path}: {where}: {first['msg']}{more}") from None


def _dims(spec: CasesFile) -> list[str]:
    names: list[str] = []
    for case in spec.cases:
        names += [d for d in case.dims if d not in names]
    return names


def _kind_and_dtype(cparam, where: str) -> tuple[str, str]:
    dtype = dtype_of_ctype(cparam.ctype)
    if dtype is None:
        known = ", ".join(sorted(s for spellings in C_TYPE_SPELLINGS.values() for s in spellings))
        raise NewTaskError(f"{where}: C type {cparam.ctype!r} of {cparam.name} is not one a task takes ({known})")
    if not cparam.pointer:
        return "scalar", dtype
    return ("input" if cparam.const else "output"), dtype


def _param(cparam, given: ParamSpec, dims: list[str], label: str, inferred: list[str]) -> Param:
    where = f"{label}: params.{cparam.name}"
    kind, dtype = _kind_and_dtype(cparam, "--signature")
    if given.dtype is not None and given.dtype != dtype:
        raise NewTaskError(f"{where}.dtype: {given.dtype!r}, but the signature's {cparam.ctype} is {dtype}")
    misplaced = [key for key, ok in (("shape", kind != "scalar"), ("value", kind == "scalar"),
                                     ("distribution", kind == "input"), ("reduction", kind == "output"),
                                     ("tolerance", kind == "output")) if getattr(given, key) is not None and not ok]
    if misplaced:
        raise NewTaskError(f"{where}.{misplaced[0]}: does not apply to {kind} {cparam.name} (from the signature: "
                           "a const pointer is an input, another pointer an output, a value a scalar)")
    if kind == "scalar":
        value = given.value
        if value is None and cparam.name in dims:
            value = cparam.name
            inferred.append(f"scalar {cparam.name} = dimension {cparam.name}")
        if value is None:
            raise NewTaskError(f"{where}.value: scalar {cparam.name} needs a value (a number or an expression of "
                               f"the dimensions {', '.join(dims)})")
        return Param(name=cparam.name, kind=kind, dtype=dtype, value=str(value))
    shape = given.shape
    if shape is None and len(dims) == 1:
        shape = [dims[0]]
        inferred.append(f"{kind} {cparam.name} has shape [{dims[0]}]")
    if shape is None:
        raise NewTaskError(f"{where}.shape: array {cparam.name} needs a shape (a list of expressions of the "
                           f"dimensions {', '.join(dims)})")
    return Param(name=cparam.name, kind=kind, dtype=dtype, shape=tuple(str(s) for s in shape))


def _generator(param: Param, given: ParamSpec, label: str, inferred: list[str]) -> Generator:
    if given.distribution is not None:
        if given.distribution.kind == "npy":
            raise NewTaskError(f"{label}: params.{param.name}.distribution: npy inputs are added by hand "
                               "(docs/task-format.md, `[inputs.NAME]`), not by new-task")
        return given.distribution
    if param.dtype in INTEGER_DTYPES:
        raise NewTaskError(f"{label}: params.{param.name}.distribution: integer input {param.name} needs one, e.g. "
                           '{"kind": "integers", "low": 0, "high": 100}')
    inferred.append(f"input {param.name} uniform in [-1, 1]")
    return DEFAULT_FLOAT_INPUT


def case_bytes(params: list[Param], dims: dict[str, int], label: str, case: str) -> int:
    total = 0
    for p in params:
        if p.kind == "scalar":
            continue
        try:
            extents = [expr.evaluate_int(entry, dims) for entry in p.shape]
        except expr.ExprError as exc:
            raise NewTaskError(f"{label}: params.{p.name}.shape: {exc} (case {case})") from None
        total += math.prod(extents) * DTYPES[p.dtype].itemsize
    return total


def assign_roles(spec: CasesFile, params: list[Param], label: str, inferred: list[str]) -> list[Case]:
    sizes = [case_bytes(params, c.dims, label, c.name) for c in spec.cases]
    largest = max(sizes)
    cases = []
    for index, (given, size) in enumerate(zip(spec.cases, sizes)):
        role = given.role
        if role is None:
            role = "performance" if size * PERFORMANCE_SHARE >= largest else "correctness"
            inferred.append(f"case {given.name} is a {role} case ({size} bytes of arrays)")
        cases.append(Case(name=given.name, role=role, dims=dict(given.dims),
                          seed=given.seed if given.seed is not None else index + 1))
    if not any(c.role == "performance" for c in cases):
        raise NewTaskError(f"{label}: cases: no performance case: give one the role \"performance\" (or leave "
                           "roles out: the largest cases become performance cases)")
    return cases


def propose_holdout(cases: list[Case]) -> Case | None:
    """Twice the largest correctness case's dimensions plus one (odd, unseen), on a new seed."""
    if any(c.role == "holdout" for c in cases):
        return None
    small = [c for c in cases if c.role == "correctness"] or cases
    base = max(small, key=lambda c: math.prod(c.dims.values()))
    dims = {name: 2 * value + 1 for name, value in base.dims.items()}
    label = "x".join(str(v) for v in dims.values())[:50]
    names = {c.name for c in cases}
    name = next(n for n in (f"holdout-{label}", *(f"holdout-{label}-{i}" for i in range(2, 99))) if n not in names)
    return Case(name=name, role="holdout", dims=dims, seed=max(c.seed for c in cases) + 1)


def plan_task(name: str, description: str, signature: str, spec: CasesFile, label: str) -> TaskPlan:
    """The task these inputs describe; `label` names the cases file in errors."""
    try:
        parsed = parse_signature(signature)
    except ValueError as exc:
        raise NewTaskError(f"--signature: {exc}") from None
    unknown = sorted(set(spec.params) - {p.name for p in parsed.params})
    if unknown:
        raise NewTaskError(f"{label}: params.{unknown[0]}: the signature has no parameter {unknown[0]!r} "
                           f"(it has {', '.join(p.name for p in parsed.params) or 'none'})")
    dims, inferred = _dims(spec), []
    params = [_param(c, spec.params.get(c.name, ParamSpec()), dims, label, inferred) for c in parsed.params]
    inputs = {p.name: _generator(p, spec.params.get(p.name, ParamSpec()), label, inferred)
              for p in params if p.kind == "input"}
    cases = assign_roles(spec, params, label, inferred)
    vendor = gemm_vendor(params)
    inferred += [said(vendor)] if vendor is not None else []
    return TaskPlan(name=name, description=description, kernel_name=parsed.name, signature=signature.strip(),
                    params=params, inputs=inputs, spec=spec, cases=cases, inferred=inferred,
                    proposed_holdout=propose_holdout(cases), vendor=vendor)


def spec_of(plan: TaskPlan, param: str) -> ParamSpec:
    return plan.spec.params.get(param, ParamSpec())


def explicit_tolerances(plan: TaskPlan) -> dict[str, Tolerance]:
    return {p.name: spec_of(plan, p.name).tolerance for p in plan.outputs if spec_of(plan, p.name).tolerance}


def reduction_text(plan: TaskPlan, param: str) -> str | None:
    value: Any = spec_of(plan, param).reduction
    return None if value is None else str(value)
