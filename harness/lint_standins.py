"""The stand-in kernels lint runs on the CPU against the oracle: what a kernel that computes nothing, or
something far cheaper than the task, would write.

A stand-in writes zeros (a kernel that writes nothing into a zeroed buffer), one value everywhere, a copy
of an input, a one-hot of an input's largest or smallest element along an axis (what a softmax of inputs
so spread that every row is one-hot reduces to), the sign or a step of an input (a saturated activation),
or the outputs of another seed's inputs (a kernel that remembers one answer for the case's dimensions).
Each is judged as the referee judges a kernel: against the oracle's output rounded to the output's dtype,
under the task's tolerance. harness/lint_outputs.py turns what passes into findings about the task as a
whole: a stand-in is a way to pass only if it passes every case of a role.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from harness.compare import compare_output
from harness.task_model import Param, Task

# Performance and holdout outputs can be large: the stand-ins are compared on evenly spaced elements.
SAMPLED_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class StandIn:
    """One would-be output: the finding it gives (`check`) and what it writes, said in the finding."""

    check: str
    label: str
    values: np.ndarray | float


@dataclass(frozen=True)
class Passed:
    """A stand-in that passes one output of one case; `refusing_atol`: the largest atol (the rtol kept) under
    which it would fail there, None where no atol would."""

    stand_in: StandIn
    refusing_atol: float | None


def constant_candidates(expected: np.ndarray) -> list[float]:
    finite = expected[np.isfinite(expected)]
    if finite.size < 2:
        return []
    return [float(np.mean(finite)), float(np.median(finite)), float((finite.min() + finite.max()) / 2)]


def _one_hot(values: np.ndarray, axis: int, pick) -> np.ndarray:
    return (values == pick(values, axis=axis, keepdims=True)).astype(np.float64)


def stand_ins(task: Task, param: Param, expected: np.ndarray, inputs: dict[str, np.ndarray],
              other: np.ndarray | None) -> Iterator[StandIn]:
    """Every stand-in for output `param`, in the order their findings are preferred."""
    name = param.name
    yield StandIn("zero-output", f"an all-zero {name}", 0.0)
    for value in constant_candidates(expected):
        yield StandIn("constant-output", f"{name} written as one value everywhere", value)
    for source in task.input_params:
        values = inputs[source.name]
        if values.shape != expected.shape:
            continue
        values = values.astype(np.float64)
        yield StandIn("equals-input", f"a copy of input {source.name} as {name}", values)
        for axis in (a for a in range(values.ndim) if values.shape[a] > 1):
            for word, pick in (("largest", np.max), ("smallest", np.min)):
                yield StandIn("one-hot-output", f"a one-hot {name} at the {word} {source.name} along axis {axis}",
                              _one_hot(values, axis, pick))
        yield StandIn("saturated-output", f"the sign of {source.name} as {name}", np.sign(values))
        yield StandIn("saturated-output", f"a step of {source.name} (1 where it is > 0, else 0) as {name}",
                      (values > 0).astype(np.float64))
    if other is not None:
        yield StandIn("seed-insensitive", f"{name} for inputs drawn from another seed", other)


def _sample(array: np.ndarray | float, step: int) -> np.ndarray | float:
    return array if step == 1 or np.ndim(array) == 0 else np.ravel(array)[::step]


def refusing_atol(expected: np.ndarray, got: np.ndarray | float, rtol: float) -> float | None:
    """The atol under which `got` fails on at least one element with `rtol` kept: the largest
    |got - expected| - rtol |expected| over finite elements; None where it is not positive."""
    got = np.broadcast_to(np.asarray(got, dtype=np.float64), expected.shape)
    finite = np.isfinite(expected) & np.isfinite(got)
    if not finite.any():
        return None
    worst = float(np.max(np.abs(got[finite] - expected[finite]) - rtol * np.abs(expected[finite])))
    return worst if worst > 0 else None


def passes(task: Task, param: Param, expected: np.ndarray, got: np.ndarray | float) -> bool:
    tol = task.tolerances[param.name]
    got = np.broadcast_to(np.asarray(got, dtype=np.float64), expected.shape)
    return compare_output(param.name, expected, np.ascontiguousarray(got), tol.rtol, tol.atol, max_report=0).passed


def passing_stand_ins(task: Task, param: Param, expected: np.ndarray, inputs: dict[str, np.ndarray],
                      other: np.ndarray | None, sampled: bool = False) -> list[Passed]:
    """The stand-ins that pass output `param` of one case (one per label: the first constant that does);
    `sampled`: on at most SAMPLED_ELEMENTS evenly spaced elements."""
    step = max(1, expected.size // SAMPLED_ELEMENTS) if sampled else 1
    judged = _sample(expected, step)
    rtol = task.tolerances[param.name].rtol
    found: dict[str, Passed] = {}
    for stand_in in stand_ins(task, param, expected, inputs, other):
        if stand_in.label in found:
            continue
        values = _sample(stand_in.values, step)
        if passes(task, param, judged, values):
            found[stand_in.label] = Passed(stand_in, refusing_atol(judged, values, rtol))
    return list(found.values())
