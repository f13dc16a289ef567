"""Tolerances under which an all-zero or input-copying output is right on most elements.

A stand-in that passes every element is refused by harness/lint_roles.py; one that passes nearly every
element shows a tolerance too wide for the outputs' sizes: a float16 softmax over long rows, whose outputs
are about 1/cols, under an atol of 1e-3, lets an all-zero output through on 99% of its elements, and a kernel
that gets the few large ones right and writes zero elsewhere passes. The share is taken over the elements
the stand-in does not get exactly right (a ReLU's zeros, a copy's unchanged elements are legitimately equal);
over MOSTLY_PASSING of them, on every correctness case, is an error; on some cases, a warning.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.lint_findings import Finding, error, warning
from harness.task_model import Param, Task

MOSTLY_PASSING = 0.5


@dataclass(frozen=True)
class Share:
    """The share of an output's elements a stand-in gets within tolerance, and the atol (rtol kept) under which
    that share would be at most MOSTLY_PASSING."""

    label: str
    share: float
    refusing_atol: float


def _share(label: str, expected: np.ndarray, got: np.ndarray | float, rtol: float, atol: float) -> Share | None:
    got = np.broadcast_to(np.asarray(got, dtype=np.float64), expected.shape)
    judged = np.isfinite(expected) & np.isfinite(got) & (got != expected)
    if not judged.any():
        return None
    excess = np.abs(got[judged] - expected[judged]) - rtol * np.abs(expected[judged])
    share = float(np.count_nonzero(excess <= atol)) / excess.size
    return Share(label, share, float(np.quantile(excess, 1 - MOSTLY_PASSING)))


def shares(task: Task, param: Param, expected: np.ndarray, inputs: dict[str, np.ndarray]) -> list[Share]:
    """The all-zero and input-copy stand-ins of one output of one case, with the share each passes."""
    tol = task.tolerances[param.name]
    candidates = [(f"an all-zero {param.name}", 0.0)]
    candidates += [(f"a copy of input {p.name} as {param.name}", inputs[p.name].astype(np.float64))
                   for p in task.input_params if inputs[p.name].shape == expected.shape]
    found = [_share(label, expected, got, tol.rtol, tol.atol) for label, got in candidates]
    return [s for s in found if s is not None]


def share_findings(task: Task, per_case: dict[str, dict[str, list[Share]]]) -> list[Finding]:
    """`per_case`: case name -> output name -> its shares, on the correctness cases."""
    found = []
    for param in task.output_params:
        tol = task.tolerances[param.name]
        mostly: dict[str, list[tuple[str, Share]]] = {}
        for case, outputs in per_case.items():
            for share in outputs.get(param.name, []):
                if share.share > MOSTLY_PASSING:
                    mostly.setdefault(share.label, []).append((case, share))
        for label, held in mostly.items():
            said = ", ".join(f"{s.share:.1%} on case {case}" for case, s in held)
            atol = min(s.refusing_atol for _, s in held)
            refuse = (f"an atol under {atol:.3g} (the rtol kept) would leave it at most {MOSTLY_PASSING:.0%}"
                      if atol > 0 else f"its rtol alone lets it through: lower the rtol")
            text = (f"stand-in '{label}' is within tolerance.{param.name} (rtol {tol.rtol:g}, atol {tol.atol:g}) "
                    f"on over {MOSTLY_PASSING:.0%} of the elements it does not get exactly right: {said}; {refuse}")
            if len(held) == len(per_case):
                found.append(error("permissive-tolerance", text + ": the tolerance is wide against the outputs' "
                                                                  "sizes"))
            else:
                found.append(warning("permissive-tolerance", text + " (not on every correctness case)"))
    return found
