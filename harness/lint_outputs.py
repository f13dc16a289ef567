"""Lint's checks of what a task's outputs are, computed on the CPU with its float64 oracle.

A task is degenerate when a kernel that computes nothing passes it: the stand-ins of harness/lint_standins.py
(zeros, one value, a copy of an input, a one-hot or a saturated activation of an input, another seed's
outputs), each judged as the referee judges a kernel on every case lint can afford, then on the task as a
whole by harness/lint_roles.py. harness/lint_shares.py finds tolerances under which an all-zero or copying
output is right on most elements.

A tolerance is too loose when the same computation at lower precision passes it: the float32 inputs rounded
to TF32 or to float16 (10 bits of mantissa, against float32's 23), then the oracle in float64. Rounding the
inputs alone is the least a TF32 or half-precision kernel gets wrong, so a tolerance that lets it through on
every correctness case cannot tell such a kernel from a float32 one.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from harness.lint_cases import unwritten_outputs
from harness.lint_findings import Finding, error, warning
from harness.lint_roles import CaseOutcome, refusal, role_findings
from harness.lint_shares import share_findings, shares
from harness.lint_standins import passes, passing_stand_ins, refusing_atol
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


def _oracle(task: Task, case: Case, inputs: dict[str, np.ndarray]) -> Outputs:
    truth = run_oracle(task, case.dims, inputs)
    return {p.name: _as_written(p, truth[p.name]) for p in task.output_params}


def _seeded(task: Task) -> bool:
    """Whether the inputs change with the seed (npy inputs are the same file whatever the seed)."""
    return any(task.inputs[p.name].kind != "npy" for p in task.input_params)


def loose_tolerances(task: Task, cases: list[Case], truths: dict[str, Outputs],
                     degenerate: set[str] = frozenset()) -> list[Finding]:
    """Outputs whose tolerance passes the float32 inputs rounded to TF32 or float16, on every case (outputs
    found `degenerate` already pass anything close to their inputs: they are left out)."""
    rounded_inputs = [p.name for p in task.input_params if p.dtype == "float32" and task.inputs[p.name].kind != "npy"]
    # A float16 or bfloat16 output keeps no more mantissa bits than TF32: its own rounding hides a TF32 version.
    outputs = [p for p in task.output_params if p.dtype in ("float32", "float64") and p.name not in degenerate]
    if not rounded_inputs or not outputs or not cases:
        return []
    passing: dict[tuple[str, str], int] = {}
    refusing: dict[tuple[str, str], list[float | None]] = {}
    for case in cases:
        inputs = make_inputs(task, case.dims, case.seed)
        for label, rounding in LOWER_PRECISIONS.items():
            lowered = _oracle(task, case, {k: rounding(v) if k in rounded_inputs else v for k, v in inputs.items()})
            for param in outputs:
                expected, got = truths[case.name][param.name], lowered[param.name]
                if passes(task, param, expected, got):
                    passing[(param.name, label)] = passing.get((param.name, label), 0) + 1
                    refusing.setdefault((param.name, label), []).append(
                        refusing_atol(expected, got, task.tolerances[param.name].rtol))
    found = []
    for param in outputs:
        labels = [label for label in LOWER_PRECISIONS if passing.get((param.name, label)) == len(cases)]
        if labels:
            tol = task.tolerances[param.name]
            found.append(error("loose-tolerance", f"tolerance.{param.name} (rtol {tol.rtol:g}, atol {tol.atol:g}) "
                               f"passes a {' or '.join(labels)} version: with the float32 inputs "
                               f"({', '.join(rounded_inputs)}) rounded to {labels[0]}, the oracle's {param.name} "
                               "is within it on every correctness case; tighten it: "
                               f"{refusal(refusing[(param.name, labels[0])])}"))
    return found


def _one_line(exc: BaseException) -> str:
    said = " ".join(str(exc).split())
    if isinstance(exc, OracleError):  # it names the oracle's file, the error and its line already
        return said[:340]
    return f"{type(exc).__name__}: {said[:300]}" if said else type(exc).__name__


def _case_outcome(task: Task, case: Case, inputs: dict[str, np.ndarray], truth: Outputs,
                  other: Outputs | None) -> CaseOutcome:
    sampled = case.role != "correctness"
    return CaseOutcome(case, {p.name: passing_stand_ins(task, p, truth[p.name], inputs,
                                                        None if other is None else other[p.name], sampled)
                              for p in task.output_params})


def output_findings(task: Task, cases: list[Case]) -> list[Finding]:
    """Every check above, on `cases` (those of every role lint can afford), with the task's oracle: the
    stand-ins on each, judged by role (harness/lint_roles.py); the shares, NaN outputs, another seed's
    outputs and the lower precisions on the correctness cases."""
    found: list[Finding] = []
    truths: dict[str, Outputs] = {}
    outcomes: list[CaseOutcome] = []
    per_case_shares: dict[str, dict] = {}
    seeded = _seeded(task)
    for case in cases:
        inputs = make_inputs(task, case.dims, case.seed)
        correctness = case.role == "correctness"
        try:
            truth = _oracle(task, case, inputs)
            other = (_oracle(task, case, make_inputs(task, case.dims, input_seed(case, 1)))
                     if seeded and correctness else None)
        except Exception as exc:  # noqa: BLE001 - the task's own code: whatever it raises is the finding
            found.append(error("oracle", f"case {case.name}: the oracle failed: {_one_line(exc)}"))
            continue
        outcomes.append(_case_outcome(task, case, inputs, truth, other))
        if correctness:
            truths[case.name] = truth
            found += unwritten_outputs(task, case, truth)
            per_case_shares[case.name] = {p.name: shares(task, p, truth[p.name], inputs) for p in task.output_params}
    by_role, degenerate = role_findings(task, outcomes)
    found += by_role + share_findings(task, per_case_shares)
    if not seeded and truths:
        found.append(warning("seed-insensitive", "no input is drawn from the seed (none, or only npy files): "
                                                 "whether the outputs depend on the inputs was not checked"))
    checked = [c for c in cases if c.name in truths]
    try:
        found += loose_tolerances(task, checked, truths, degenerate)
    except Exception as exc:  # noqa: BLE001 - as above
        found.append(error("oracle", f"on rounded inputs the oracle failed: {_one_line(exc)}"))
    return found
