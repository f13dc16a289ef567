"""The tolerance `kernel-referee new-task` proposes for each output, with its reasoning for task.toml.

A float output computed by a kernel differs from the reference's by the order of its sums (each element
a reduction of K terms, summed in another order: about sqrt(K) unit roundoffs of the arithmetic, float32
unless the output is float64) and by the rounding of the output itself. rtol is MARGIN times the first
plus OUTPUT_ROUNDINGS roundings of the output, rounded up to one digit. atol is rtol times the outputs'
typical size (the oracle's root mean square on a small case, grown by sqrt(K / K there) for the longer
sums of larger cases), so elements that cancel to near zero pass too. The reduction length K comes from
the cases file (`reduction`), else from cost.flops (2 flops per term and output element), else 1. An
integer output is exact.

The proposal must pass lint (harness/lint.py), which refuses a tolerance a TF32 or float16 version of the
computation passes (for float32 and float64 outputs) and one an all-zero output mostly passes. So rtol is held
under the move of such a version (2^-11 of the size) for long sums, where sqrt(K) roundoffs would reach it, and
atol, one value for every case, under a share of the smallest correctness case's outputs, which the longer sums
of other cases would otherwise grow it past.
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
# Outputs lint checks against a TF32 or float16 version (harness/lint_outputs.py): rtol stays this far under
# the move such a version makes, and atol this share of the outputs' typical size, so that it fails.
LOWER_PRECISION_MARGIN = 8
RTOL_CAP = {dtype: 2.0**-11 / LOWER_PRECISION_MARGIN for dtype in ("float32", "float64")}
ATOL_CAP_OF_SIZE = {dtype: 2.0**-11 / 4 for dtype in RTOL_CAP}
# Other outputs: an all-zero output within atol on at most about a tenth of the elements of any case.
ATOL_CAP_OF_SIZE_DEFAULT = 1 / 8
MEASURED_ELEMENTS = 1 << 26   # array elements of a case whose outputs are measured (lint's own limit for the oracle)
COMMENT_WIDTH = 100


@dataclass(frozen=True)
class ToleranceProposal:
    rtol: float
    atol: float
    comment: list[str]          # lines of task.toml, each starting with "#"
    proposed: ToleranceProposal | None = None   # for a tolerance the cases file gives: what new-task proposes

    def said(self) -> str:
        """One line for the command: the tolerance, and where it comes from."""
        tolerance = f"rtol {self.rtol:g}, atol {self.atol:g}"
        if self.proposed is None:
            return f"{tolerance} (its reasoning is in task.toml)"
        return (f"{tolerance} (the cases file's; new-task would propose rtol {self.proposed.rtol:g}, atol "
                f"{self.proposed.atol:g}, its reasoning in task.toml)")


def nice_up(value: float) -> float:
    """`value` rounded up to one significant digit (2.2e-05 -> 3e-05)."""
    if value <= 0:
        return 0.0
    exponent = math.floor(math.log10(value))
    digit = math.ceil(value / 10.0**exponent - 1e-9)
    if digit >= 10:
        digit, exponent = 1, exponent + 1
    return float(f"{digit}e{exponent}")


def nice_down(value: float) -> float:
    """`value` rounded down to one significant digit (6.1e-05 -> 6e-05)."""
    if value <= 0:
        return 0.0
    exponent = math.floor(math.log10(value))
    digit = max(1, math.floor(value / 10.0**exponent + 1e-9))
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


def smallest_sizes(task: Task) -> dict[str, tuple[float, str]]:
    """Each output's smallest typical size, and the case that has it: the median magnitude of its nonzero finite
    elements, over every case of up to MEASURED_ELEMENTS array elements (the oracle is not given larger ones).
    A normalization's outputs shrink as its rows grow (a softmax's are about 1 / cols): an atol sized on the
    small cases alone would let an all-zero output through on the large ones."""
    if task.oracle_file is None:
        return {}
    found: dict[str, tuple[float, str]] = {}
    for case in task.cases:
        if _elements(task, case, list(task.array_params)) > MEASURED_ELEMENTS:
            continue
        try:
            truth = run_oracle(task, case.dims, make_inputs(task, case.dims, case.seed))
        except Exception:  # noqa: BLE001 - the user's oracle: lint reports it; the proposal goes on without it
            continue
        for name, values in truth.items():
            magnitudes = np.abs(values[np.isfinite(values) & (values != 0)])
            if magnitudes.size and (median := float(np.median(magnitudes))) < found.get(name, (math.inf, ""))[0]:
                found[name] = (median, case.name)
    return found


def _comment(text: str) -> list[str]:
    return textwrap.wrap(text, COMMENT_WIDTH, initial_indent="# ", subsequent_indent="# ")


def _rtol(param: Param, arithmetic: str, k_max: int, k_case: str, source: str) -> tuple[float, str]:
    """rtol, and the comment's sentences on it."""
    order = math.sqrt(k_max) * UNIT_ROUNDOFF[arithmetic]
    rtol = nice_up(MARGIN * order + OUTPUT_ROUNDINGS * UNIT_ROUNDOFF[param.dtype])
    text = (f"{param.name} is {param.dtype} computed in {arithmetic} (unit roundoff 2^{_EXPONENT[arithmetic]}), each "
            f"element a reduction of up to {k_max} terms ({source}; case {k_case}). Summing them in another order "
            f"moves it by about sqrt({k_max}) x 2^{_EXPONENT[arithmetic]} = {order:.2g} of its size; {MARGIN}x that "
            f"plus {OUTPUT_ROUNDINGS} roundings of a {param.dtype} output (2^{_EXPONENT[param.dtype]} each), rounded "
            f"up, is {rtol:g}.")
    cap = nice_down(RTOL_CAP[param.dtype]) if param.dtype in RTOL_CAP else None
    if cap is not None and rtol > cap:
        text += (f" That would let a TF32 version through (its inputs' rounding moves a sum by about 2^-11 of its "
                 f"size), so rtol is held at 2^-11 / {LOWER_PRECISION_MARGIN}, {cap:g}: a kernel that sums in a tree "
                 "or in blocks, as a parallel reduction does, stays well within it; one thread summing all "
                 f"{k_max} terms in a row may not.")
        rtol = cap
    return rtol, text


def _atol(param: Param, rtol: float, reductions: dict[str, int], size: float | None, scale_case: Case | None,
          no_size: str | None, smallest: tuple[float, str] | None) -> tuple[float, str]:
    """atol, and the comment's sentence on it."""
    k_max = max(reductions.values())
    if not size or scale_case is None:
        grown = math.sqrt(k_max)
        atol = nice_up(rtol * grown)
        return atol, (f"atol = rtol x {grown:.3g} ({no_size or 'the oracle gives all zeros'}: taken as sqrt({k_max}), "
                      "a sum of terms of order 1 with random signs; set atol to rtol times the outputs' typical size), "
                      f"so elements that cancel to near zero pass too: {atol:g}.")
    k_scale = reductions[scale_case.name]
    grown = size * math.sqrt(k_max / k_scale)
    atol = nice_up(rtol * grown)
    text = (f"atol = rtol x {grown:.2g} (the oracle's root mean square {param.name} on case {scale_case.name}, "
            f"{size:.3g}, times sqrt({k_max} / {k_scale}) for the longer sums), so elements that cancel to near zero "
            f"pass too: {atol:g}.")
    share = ATOL_CAP_OF_SIZE.get(param.dtype, ATOL_CAP_OF_SIZE_DEFAULT)
    typical, case = smallest or (size, scale_case.name)
    if atol > share * typical:
        atol = nice_down(share * typical)
        why = ("would let a TF32 version through" if param.dtype in RTOL_CAP
               else "would let an all-zero output through on many elements")
        text += (f" One atol serves every case, and on case {case}, where the median nonzero |{param.name}| is "
                 f"smallest ({typical:.3g}), that {why}: atol is held at {share:.2g} of that median, {atol:g}.")
    return atol, text


def propose_one(param: Param, reductions: dict[str, int], source: str, size: float | None, scale_case: Case | None,
                no_size: str | None, smallest: tuple[float, str] | None = None) -> ToleranceProposal:
    if param.dtype in INTEGER_DTYPES:
        return ToleranceProposal(0.0, 0.0, _comment(f"Tolerance of {param.name}: an integer output is exact."))
    arithmetic = "float64" if param.dtype == "float64" else "float32"
    k_max = max(reductions.values())
    k_case = next(c for c, k in reductions.items() if k == k_max)
    rtol, on_rtol = _rtol(param, arithmetic, k_max, k_case, source)
    atol, on_atol = _atol(param, rtol, reductions, size, scale_case, no_size, smallest)
    if param.dtype in RTOL_CAP:
        lower = (f"Inputs rounded to TF32 or float16 (2^-11) move outputs by about 2^-11 of their size, "
                 f"{LOWER_PRECISION_ROUNDOFF / rtol:.3g}x rtol: kernel-referee lint checks that such a version fails.")
    else:
        lower = (f"A {param.dtype} output is rounded as coarsely as TF32 or float16 inputs would move it: lint does "
                 "not look for a lower-precision version of it.")
    text = (f"Tolerance of {param.name}, proposed by kernel-referee new-task (check it): {on_rtol} {on_atol} {lower}")
    return ToleranceProposal(rtol, atol, _comment(text))


def propose_tolerances(task: Task, plan: TaskPlan) -> dict[str, ToleranceProposal]:
    """A tolerance and its reasoning for every output: the cases file's own where it gives one."""
    given = explicit_tolerances(plan)
    sizes, scale_case, no_size = output_sizes(task)
    smallest = smallest_sizes(task)
    proposals = {}
    for param in task.output_params:
        reductions, source = reduction_length(task, plan, param)
        proposal = propose_one(param, reductions, source, sizes.get(param.name), scale_case, no_size,
                               smallest.get(param.name))
        if param.name in given:  # the person's choice is kept; lint names a stand-in it lets through, if any
            tol = given[param.name]
            proposal = ToleranceProposal(tol.rtol, tol.atol, _comment(
                f"Tolerance of {param.name}: as the cases file gives it. new-task would propose rtol "
                f"{proposal.rtol:g}, atol {proposal.atol:g}:") + proposal.comment, proposed=proposal)
        proposals[param.name] = proposal
    return proposals
