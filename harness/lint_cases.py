"""Lint's checks of a task's cases and inputs: a holdout that repeats a visible case, an input drawn as one
value, and outputs the oracle leaves NaN (what it shows of a reference that leaves elements unwritten).

A holdout with a visible case's dimensions and seed has that case's inputs: the agent has seen them, so the
final check tells nothing new. An input whose drawn values are all one value (integers in [7, 8), or a
float range narrower than the dtype's spacing) is a constant the kernel can use without reading the input.
"""

from __future__ import annotations

import numpy as np

from harness.lint_findings import Finding, error, warning
from harness.task import make_inputs
from harness.task_model import Case, Generator, Task


def repeated_holdouts(task: Task) -> list[Finding]:
    found = []
    for holdout in task.holdout_cases:
        for seen in task.visible_cases:
            if holdout.dims == seen.dims and holdout.seed == seen.seed:
                found.append(error("holdout-repeats-visible",
                                   f"holdout case {holdout.name} has the dims and seed of {seen.role} case "
                                   f"{seen.name}: its inputs are ones the agent sees, so it tells nothing new; give "
                                   "it another seed or other dims"))
    return found


def _drawn_as(generator: Generator, dtype: str) -> str:
    if generator.kind == "integers":
        return f"integers in [{generator.low}, {generator.high})"
    if generator.kind == "uniform":
        return f"uniform in [{generator.low}, {generator.high}) as {dtype}"
    return f"normal, mean {generator.mean}, std {generator.std}, as {dtype}"


def one_valued_inputs(task: Task, cases: list[Case]) -> list[Finding]:
    """Inputs drawn as a single value on every one of `cases` where they have more than one element."""
    drawn = [p for p in task.input_params if task.inputs[p.name].kind != "npy"]
    single: dict[str, list[float]] = {p.name: [] for p in drawn}
    sized: dict[str, int] = {p.name: 0 for p in drawn}
    for case in cases:
        inputs = make_inputs(task, case.dims, case.seed)
        for param in drawn:
            values = inputs[param.name]
            if values.size < 2:
                continue
            sized[param.name] += 1
            first = values.reshape(-1)[0]
            if np.all(values == first):
                single[param.name].append(float(first))
    found = []
    for param in drawn:
        if sized[param.name] and len(single[param.name]) == sized[param.name]:
            value = single[param.name][0]
            found.append(error("one-valued-input", f"input {param.name} holds one value ({value:g}) on every "
                               f"correctness case (inputs.{param.name}: "
                               f"{_drawn_as(task.inputs[param.name], param.dtype)}): a kernel can use that "
                               f"constant without reading {param.name}; widen its range"))
    return found


def unwritten_outputs(task: Task, case: Case, truth: dict[str, np.ndarray]) -> list[Finding]:
    """Outputs the oracle returns NaN in: where the reference leaves those elements unwritten, `check` refuses
    it on the GPU (they still hold the poison); a reference writes every element, NaN where NaN is meant."""
    found = []
    for param in task.output_params:
        nan = np.isnan(truth[param.name])
        if nan.any():
            first = [int(i) for i in np.unravel_index(int(np.argmax(nan)), nan.shape)]
            found.append(warning("unwritten-output",
                                 f"case {case.name}: the oracle's {param.name} is NaN on {int(nan.sum())} of "
                                 f"{nan.size} elements (first at {first}): a reference that leaves them unwritten "
                                 "is refused on the GPU; it must write every element (NaN where NaN is meant)"))
    return found
