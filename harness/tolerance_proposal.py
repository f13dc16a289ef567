"""The tolerance `kernel-referee new-task` proposes for each output, with its reasoning for task.toml.

A float output computed by a kernel differs from the reference's by the order of its sums (each element
a reduction of K terms, summed in another order: about sqrt(K) unit roundoffs of the arithmetic, float32
unless the output is float64) and by the rounding of the output itself. rtol is MARGIN times the first
plus OUTPUT_ROUNDINGS roundings of the output, rounded up to one digit. atol is rtol times the outputs'
typical size (the oracle's root mean square on a small case, grown by sqrt(K / K there) for the longer
sums of larger cases), so elements that cancel to near zero pass too. The reduction length K comes from
the cases file (`reduction`), else from cost.flops (2 flops per term and output element), else 1. An
integer output is exact. Lint then checks that a TF32 or float16 version of the computation fails it.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass

import numpy as np

from harness import expr
from harness.new_task_spec import TaskPlan, explicit_tolerances, reduction_text
from harness.oracle import run_oracle
from harness.task import make_inputs
from harness.task_model import INTEGER_DTYPES, Case, Param, Task

MARGIN = 8
OUTPUT_ROUNDINGS = 4
_EXPONENT = {"float64": -53, "float32": -24, "float16": -11, "bfloat16": -8}   # unit roundoff 2^e
UNIT_ROUNDOFF = {dtype: 2.0**exponent for dtype, exponent in _EXPONENT.items()}
LOWER_PRECISION_ROUNDOFF = 2.0**-11   # TF32 and float16 keep 10 bits of mantissa
COMMENT_WIDTH = 100


@dataclass(frozen=True)
class ToleranceProposal:
    rtol: float
    atol: float
    comment: list[str]          # lines of task.toml, each starting with "#"


def nice_up(value: float) -> float:
    """`value` rounded up to one significant digit (2.2e-05 -> 3e-05)."""
    if value <= 0:
        return 0.0
    exponent = math.floor(math.log10(value))
    digit = math.ceil(value / 10.0**exponent - 1e-9)
    if digit >= 10:
        digit, exponent = 1, exponent + 1
    return float(f"{digit}e{exponent}")


def _elements(task: Task, case: Case, params: list[Param]) -> int:
    shapes = task.shapes(case.dims)
    return sum(math.prod(shapes[p.name]) for p in params)


def reduction_length(task: Task, plan: TaskPlan, param: Param) -> tuple[dict[str, int], str]:
    """K for each case, and where it comes from (said in the comment)."""
    text = reduction_text(plan, param.name)
    if text is not None:
        return ({c.name: max(1, expr.evaluate_int(text, c.dims)) for c in task.cases},
                f"reduction {text} in the cases file")
    if task.cost.flops is not None:
        outputs = list(task.output_params)
        return ({c.name: max(1, round(task.flops(c.dims) / (2 * _elements(task, c, outputs)))) for c in task.cases},
                "cost.flops / (2 x output elements)")
    return {c.name: 1 for c in task.cases}, "no reduction given, so element-wise"


def _scale_case(task: Task) -> Case:
    """The smallest correctness case (else the smallest case): where the oracle measures the outputs' size."""
    pool = list(task.correctness_cases) or list(task.cases)
    return min(pool, key=lambda c: _elements(task, c, list(task.array_params)))


def output_sizes(task: Task) -> tuple[dict[str, float], Case | None, str | None]:
    """The oracle's root mean square of each output on the scale case; a reason when there is none."""
    if task.oracle_file is None:
        return {}, None, "no oracle to measure it with"
    case = _scale_case(task)
    try:
        truth = run_oracle(task, case.dims, make_inputs(task, case.dims, case.seed))
    except Exception as exc:  # noqa: BLE001 - the user's oracle: lint reports it; the proposal goes on without it
        return {}, None, f"the oracle failed on case {case.name} ({type(exc).__name__})"
    sizes = {}
    for name, values in truth.items():
        finite = values[np.isfinite(values)]
        sizes[name] = float(np.sqrt(np.mean(finite**2))) if finite.size else 0.0
    return sizes, case, None


def _comment(text: str) -> list[str]:
    return textwrap.wrap(text, COMMENT_WIDTH, initial_indent="# ", subsequent_indent="# ")


def propose_one(param: Param, reductions: dict[str, int], source: str, size: float | None, scale_case: Case | None,
                no_size: str | None) -> ToleranceProposal:
    if param.dtype in INTEGER_DTYPES:
        return ToleranceProposal(0.0, 0.0, _comment(f"Tolerance of {param.name}: an integer output is exact."))
    arithmetic = "float64" if param.dtype == "float64" else "float32"
    k_max = max(reductions.values())
    k_case = next(c for c, k in reductions.items() if k == k_max)
    order = math.sqrt(k_max) * UNIT_ROUNDOFF[arithmetic]
    rtol = nice_up(MARGIN * order + OUTPUT_ROUNDINGS * UNIT_ROUNDOFF[param.dtype])
    if size and scale_case is not None:
        grown = size * math.sqrt(k_max / reductions[scale_case.name])
        typical = (f"{grown:.2g} (the oracle's root mean square {param.name} on case {scale_case.name}, {size:.3g}, "
                   f"times sqrt({k_max} / {reductions[scale_case.name]}) for the longer sums)")
    else:
        grown = math.sqrt(k_max)
        typical = (f"{grown:.3g} ({no_size or 'the oracle gives all zeros'}: taken as sqrt({k_max}), a sum of terms of "
                   "order 1 with random signs; set atol to rtol times the outputs' typical size)")
    atol = nice_up(rtol * grown)
    lower = LOWER_PRECISION_ROUNDOFF / rtol
    text = (f"Tolerance of {param.name}, proposed by kernel-referee new-task (check it): {param.name} is "
            f"{param.dtype} computed in {arithmetic} (unit roundoff 2^{_EXPONENT[arithmetic]}), each element a "
            f"reduction of up to {k_max} terms ({source}; case {k_case}). Summing them in another order moves it by "
            f"about sqrt({k_max}) x 2^{_EXPONENT[arithmetic]} = {order:.2g} of its size; rtol is {MARGIN}x that plus "
            f"{OUTPUT_ROUNDINGS} roundings of a {param.dtype} output (2^{_EXPONENT[param.dtype]} each), rounded up: "
            f"{rtol:g}. atol = rtol x {typical}, so elements that cancel to near zero pass too: {atol:g}. Inputs "
            f"rounded to TF32 or float16 (2^-11) move outputs by about 2^-11 of their size, {lower:.3g}x rtol: "
            "kernel-referee lint checks that such a version fails.")
    return ToleranceProposal(rtol, atol, _comment(text))


def propose_tolerances(task: Task, plan: TaskPlan) -> dict[str, ToleranceProposal]:
    """A tolerance and its reasoning for every output: the cases file's own where it gives one."""
    given = explicit_tolerances(plan)
    sizes, scale_case, no_size = output_sizes(task)
    proposals = {}
    for param in task.output_params:
        if param.name in given:
            tol = given[param.name]
            proposals[param.name] = ToleranceProposal(tol.rtol, tol.atol, _comment(
                f"Tolerance of {param.name}: as the cases file gives it."))
            continue
        reductions, source = reduction_length(task, plan, param)
        proposals[param.name] = propose_one(param, reductions, source, sizes.get(param.name), scale_case, no_size)
    return proposals
