"""Lint's checks of what a task's outputs are, computed on the CPU with its float64 oracle.

A task is degenerate when a kernel that computes nothing passes it: outputs that are zero (a kernel that
writes nothing into a zeroed buffer passes), one value everywhere, a copy of an input, or the same whatever
the inputs (a kernel that remembers one answer passes). Each is judged as the referee judges a kernel: the
would-be output against the expected one (the oracle's, rounded to the output's dtype as the reference
writes it) under the task's own tolerance, on each correctness case.

A tolerance is too loose when the same computation at lower precision passes it: the float32 inputs rounded
to TF32 or to float16 (10 bits of mantissa, against float32's 23), then the oracle in float64. Rounding the
inputs alone is the least a TF32 or half-precision kernel gets wrong, so a tolerance that lets it through on
every correctness case cannot tell such a kernel from a float32 one.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from harness.compare import compare_output
from harness.lint_findings import Finding, error, warning
from harness.oracle import OracleError, run_oracle
from harness.settings import input_seed
from harness.task import make_inputs
from harness.task_model import DTYPES, INTEGER_DTYPES, Case, Param, Task

Outputs = dict[str, np.ndarray]


def round_to_tf32(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to nearest (ties to even) at TF32's 10 bits of mantissa, kept as float32;
    NaN and infinities unchanged."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    bits = values.view(np.uint32).astype(np.uint64)
    odd = (bits >> 13) & 1
    rounded = ((bits + 0x0FFF + odd) & 0xFFFFE000).astype(np.uint32)
    finite = np.isfinite(values)
    return np.where(finite, rounded.view(np.float32), values)


def round_to_float16(values: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return values.astype(np.float16).astype(np.float32)


LOWER_PRECISIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {"TF32": round_to_tf32, "float16": round_to_float16}


def _as_written(param: Param, values: np.ndarray) -> np.ndarray:
    """The oracle's float64 values as the reference would write them: in the output's dtype, as float64."""
    dtype = DTYPES[param.dtype]
    if param.dtype in INTEGER_DTYPES:
        values = np.rint(values)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(values).astype(dtype).astype(np.float64)


def _passes(task: Task, param: Param, expected: np.ndarray, got: np.ndarray) -> bool:
    tol = task.tolerances[param.name]
    got = np.broadcast_to(np.asarray(got, dtype=np.float64), expected.shape)
    return compare_output(param.name, expected, np.ascontiguousarray(got), tol.rtol, tol.atol, max_report=0).passed


def _oracle(task: Task, case: Case, inputs: dict[str, np.ndarray]) -> Outputs:
    truth = run_oracle(task, case.dims, inputs)
    return {p.name: _as_written(p, truth[p.name]) for p in task.output_params}


def _constant_candidates(expected: np.ndarray) -> list[float]:
    finite = expected[np.isfinite(expected)]
    if finite.size < 2:
        return []
    return [float(np.mean(finite)), float(np.median(finite)), float((finite.min() + finite.max()) / 2)]


def _degenerate(task: Task, param: Param, expected: np.ndarray, inputs: dict[str, np.ndarray],
                other: np.ndarray | None) -> tuple[str, str] | None:
    """(check, what passes) for the first degenerate kind of output that holds, or None."""
    if _passes(task, param, expected, 0.0):
        return "zero-output", f"an all-zero {param.name} passes"
    constant = next((c for c in _constant_candidates(expected) if _passes(task, param, expected, c)), None)
    if constant is not None:
        return "constant-output", f"{param.name} written as {constant:.6g} everywhere passes"
    for source in task.input_params:
        if inputs[source.name].shape == expected.shape and _passes(task, param, expected,
                                                                   inputs[source.name].astype(np.float64)):
            return "equals-input", f"a copy of input {source.name} passes as {param.name}"
    if other is not None and _passes(task, param, expected, other):
        return "seed-insensitive", f"{param.name} for inputs drawn from another seed passes"
    return None


_WHY = {"zero-output": "a kernel that writes nothing passes; choose inputs whose outputs are not (near) zero",
        "constant-output": "the output is (near) constant",
        "equals-input": "the output equals an input",
        "seed-insensitive": "the output does not depend on the inputs' values"}


def degenerate_outputs(task: Task, case: Case, inputs: dict[str, np.ndarray], truth: Outputs,
                       other: Outputs | None) -> dict[str, Finding]:
    """Zero, constant, equal to an input, the same for another seed's inputs: the first that holds for each
    output of one case, by output."""
    found = {}
    for param in task.output_params:
        held = _degenerate(task, param, truth[param.name], inputs, None if other is None else other[param.name])
        if held is not None:
            check, what = held
            tol = task.tolerances[param.name]
            found[param.name] = error(check, f"case {case.name}: {what} (tolerance rtol {tol.rtol:g}, atol "
                                             f"{tol.atol:g}): {_WHY[check]}")
    return found


def _seeded(task: Task) -> bool:
    """Whether the inputs change with the seed (npy inputs are the same file whatever the seed)."""
    return any(task.inputs[p.name].kind != "npy" for p in task.input_params)


def loose_tolerances(task: Task, cases: list[Case], truths: dict[str, Outputs],
                     degenerate: set[str] = frozenset()) -> list[Finding]:
    """Outputs whose tolerance passes the float32 inputs rounded to TF32 or float16, on every case (outputs
    found `degenerate` already pass anything close to their inputs: they are left out)."""
    rounded_inputs = [p.name for p in task.input_params if p.dtype == "float32" and task.inputs[p.name].kind != "npy"]
    outputs = [p for p in task.output_params if p.dtype not in INTEGER_DTYPES and p.name not in degenerate]
    if not rounded_inputs or not outputs or not cases:
        return []
    passing: dict[tuple[str, str], int] = {}
    for case in cases:
        inputs = make_inputs(task, case.dims, case.seed)
        for label, rounding in LOWER_PRECISIONS.items():
            lowered = _oracle(task, case, {k: rounding(v) if k in rounded_inputs else v for k, v in inputs.items()})
            for param in outputs:
                if _passes(task, param, truths[case.name][param.name], lowered[param.name]):
                    passing[(param.name, label)] = passing.get((param.name, label), 0) + 1
    found = []
    for param in outputs:
        labels = [label for label in LOWER_PRECISIONS if passing.get((param.name, label)) == len(cases)]
        if labels:
            tol = task.tolerances[param.name]
            found.append(error("loose-tolerance", f"tolerance.{param.name} (rtol {tol.rtol:g}, atol {tol.atol:g}) "
                               f"passes a {' or '.join(labels)} version: with the float32 inputs "
                               f"({', '.join(rounded_inputs)}) rounded to {labels[0]}, the oracle's {param.name} "
                               "is within it on every correctness case; tighten it"))
    return found


def _one_line(exc: BaseException) -> str:
    said = " ".join(str(exc).split())
    if isinstance(exc, OracleError):  # it names the oracle's file, the error and its line already
        return said[:340]
    return f"{type(exc).__name__}: {said[:300]}" if said else type(exc).__name__


def output_findings(task: Task, cases: list[Case]) -> list[Finding]:
    """Every check above, on `cases` (the correctness cases lint can afford), with the task's oracle."""
    found: list[Finding] = []
    truths: dict[str, Outputs] = {}
    degenerate: set[str] = set()
    seeded = _seeded(task)
    for case in cases:
        inputs = make_inputs(task, case.dims, case.seed)
        try:
            truths[case.name] = _oracle(task, case, inputs)
            other = _oracle(task, case, make_inputs(task, case.dims, input_seed(case, 1))) if seeded else None
        except Exception as exc:  # noqa: BLE001 - the task's own code: whatever it raises is the finding
            found.append(error("oracle", f"case {case.name}: the oracle failed: {_one_line(exc)}"))
            continue
        flagged = degenerate_outputs(task, case, inputs, truths[case.name], other)
        degenerate |= set(flagged)
        found += flagged.values()
    if not seeded and cases:
        found.append(warning("seed-insensitive", "no input is drawn from the seed (none, or only npy files): "
                                                 "whether the outputs depend on the inputs was not checked"))
    checked = [c for c in cases if c.name in truths]
    try:
        found += loose_tolerances(task, checked, truths, degenerate)
    except Exception as exc:  # noqa: BLE001 - as above
        found.append(error("oracle", f"on rounded inputs the oracle failed: {_one_line(exc)}"))
    return found
