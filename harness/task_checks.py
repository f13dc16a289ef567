"""The checks ``load_task`` runs on a manifest that fits the schema, each failure a :class:`TaskError`
naming its field: :func:`check_task` finds what makes no sense as a whole (a generator for no
parameter, a shape of 0 in some case, a signature at odds with the params). A manifest that does not
fit the schema is reworded by harness/task_schema_errors.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

import ml_dtypes
import numpy as np
from harness import expr
from harness.arithmetic import arithmetic_problem
from harness.csig import C_TYPE_SPELLINGS, C_TYPES, CParam, dtype_of_ctype, is_identifier, parse_signature
from harness.inputs import read_npy
from harness.launch_checks import unknown_per_case
from harness.task_schema_errors import field_path
from harness.task_model import (DTYPES, INTEGER_DTYPES, Case, Generator, LaunchError, LaunchSpec,
                                Param, Task, TaskError, param_shape, scalar_value)
from harness.worker_side.cublas_api import GEMM_TYPES, MAX_GEMM_DIM


# -------------------------------------------------------------------- checks

_GENERATOR_FIELDS = {
    "uniform": ("low", "high"),
    "normal": ("mean", "std"),
    "integers": ("low", "high"),
    "npy": ("file", "sha256"),
}


# Task and case names never reach C code but do end up in file names and reports.
_LABEL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


def check_task(task: Task, file: Path) -> None:
    """Raise a :class:`TaskError` for the first problem in ``task``, read from ``file``."""
    _Checker(task, file).run()


class _Checker:
    """The semantic checks pydantic cannot express; each failure names its TOML field."""

    def __init__(self, task: Task, file: Path):
        self.task = task
        self.file = file

    def fail(self, field: str, message: str) -> NoReturn:
        raise TaskError(self.file, field, message)

    def run(self) -> None:
        self.check_constants()
        self.check_names()
        self.check_params()
        self.check_generators()
        self.check_tolerances()
        self.check_cases()
        self.check_expressions()
        for case in self.task.cases:
            self.check_case_values(case)
        self.check_vendor()
        if (problem := arithmetic_problem(self.task.arithmetic, self.task.cost.compute)) is not None:
            self.fail("arithmetic", problem)
        self.check_npy_contents()
        self.check_signature()
        self.check_files()

    def identifier(self, field: str, text: str) -> None:
        if not is_identifier(text):
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
                self.identifier(field_path(("cases", i, "dims", dim)), dim)

    def check_constants(self) -> None:
        for name in self.task.constants:
            self.identifier(field_path(("constants", name)), name)
            if name in expr.FUNCTIONS:
                self.fail(field_path(("constants", name)), f"{name!r} is a function of expressions; "
                                                           "name the constant otherwise")

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
            read_npy(self.file, f"inputs.{p.name}", self.task.root / gen.file, gen.sha256,
                     DTYPES[p.dtype], shape)
            for case in others:
                other = param_shape(p, case.dims)
                if other != shape:
                    self.fail(f"inputs.{p.name}.file", f"{gen.file} has one shape, but {p.name!r} "
                              f"is {shape} for case {first.name!r} and {other} for case {case.name!r}")

    def task_file(self, field: str, name: str) -> None:
        """A file named by the manifest: relative, inside the task folder, present."""
        root = self.task.root
        if Path(name).is_absolute() or name.startswith(("/", "\\")):
            self.fail(field, f"{name!r} must be a path relative to the task folder")
        path = (root / name).resolve()
        if not path.is_relative_to(root):
            self.fail(field, f"{name!r} escapes the task folder")
        if not path.is_file():
            self.fail(field, f"{name!r} does not exist in {root}")

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
            if (unknown := unknown_per_case(spec, names)) is not None:
                self.fail(f"{field}.per_case.{unknown[0]}", unknown[1])

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
        if self.task.vendor is not None:
            found += [(f"vendor.{key}", getattr(self.task.vendor, key)) for key in ("m", "n", "k")]
        return found

    def check_expressions(self) -> None:
        constants = self.task.constants
        dims = list(dict.fromkeys(d for c in self.task.cases for d in c.dims if d not in constants))
        used: dict[str, str] = {}
        for field, text in self.expressions():
            try:
                names = expr.parse(text).names
            except expr.ExprError as err:
                self.fail(field, str(err))
            for name in sorted(names - set(dims) - set(constants)):
                known = f"dims: {', '.join(dims) or 'none'}"
                self.fail(field, f"unknown name {name!r} in {text!r}: names must be dimensions defined by the "
                                 + (f"cases or constants ({known}; constants: {', '.join(constants)})" if constants
                                    else f"cases ({known})"))
            for name in sorted(names - set(constants)):
                used.setdefault(name, field)
        for i, case in enumerate(self.task.cases):
            for name, where in used.items():
                if name not in case.dims:
                    self.fail(f"cases[{i}].dims", f"case {case.name!r} does not define "
                                                  f"dimension {name!r} (used by {where})")
            for name in case.dims:
                if name not in used and name not in constants:
                    self.fail(field_path(("cases", i, "dims", name)),
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


    def check_vendor(self) -> None:
        """[vendor]: a, b, c name 2-D arrays of a supported dtype whose shapes are (m, k), (k, n), (m, n)."""
        vendor = self.task.vendor
        if vendor is None:
            return
        params = {p.name: p for p in self.task.params}
        for key, kind in (("a", "input"), ("b", "input"), ("c", "output")):
            name = getattr(vendor, key)
            if name not in params:
                self.fail(f"vendor.{key}", f"there is no parameter named {name!r} "
                                           f"(params: {', '.join(params)})")
            if params[name].kind != kind or len(params[name].shape) != 2:
                self.fail(f"vendor.{key}", f"{name!r} must be a 2-D {kind} array for a gemm; it is a "
                                           f"{len(params[name].shape)}-D {params[name].kind}")
        a, b, c = (params[vendor.a], params[vendor.b], params[vendor.c])
        if b.dtype != a.dtype or (a.dtype, c.dtype) not in GEMM_TYPES:
            allowed = ", ".join(f"{ab} x {ab} -> {out}" for ab, out in GEMM_TYPES)
            self.fail("vendor", f"a gemm of {a.dtype} x {b.dtype} -> {c.dtype} is not supported "
                                f"(supported: {allowed})")
        for case in self.task.cases:
            self.check_vendor_case(case, a, b, c)

    def check_vendor_case(self, case: Case, a: Param, b: Param, c: Param) -> None:
        vendor = self.task.vendor
        dims = {}
        for key in ("m", "n", "k"):
            try:
                dims[key] = expr.evaluate_int(getattr(vendor, key), case.dims)
            except expr.ExprError as err:
                self.fail(f"vendor.{key}", f"{err} (case {case.name!r})")
            if not 1 <= dims[key] <= MAX_GEMM_DIM:
                self.fail(f"vendor.{key}", f"is {dims[key]} for case {case.name!r}; must be from 1 to "
                                           f"{MAX_GEMM_DIM}")
        m, n, k = dims["m"], dims["n"], dims["k"]
        for key, param, wanted in (("a", a, (m, k)), ("b", b, (k, n)), ("c", c, (m, n))):
            shape = param_shape(param, case.dims)
            if shape != wanted:
                self.fail(f"vendor.{key}", f"{param.name!r} is {list(shape)} for case {case.name!r}, but a "
                                           f"row-major gemm with m={m}, n={n}, k={k} needs {list(wanted)}")
