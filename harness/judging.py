"""How the parent judges a kernel's raw outputs: poison still in place, guard bands, mismatches."""

from __future__ import annotations

import numpy as np

from harness import jobs
from harness.compare import raw_words
from harness.results import Reason, ReasonCode
from harness.worker_side import buffers


def still_poisoned(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Elements holding each run's poison pattern: never written by the kernel.

    A correct element equals both patterns only by coincidence in both runs, which real outputs
    do not (the two poisons differ in every byte).
    """
    def holds(array: np.ndarray, byte: int) -> np.ndarray:
        return equals_pattern(array, byte).reshape(array.shape)

    return holds(first, buffers.POISON_BYTES[0]) & holds(second, buffers.POISON_BYTES[1])


def integrity_reasons(integrity: jobs.Integrity, case: str) -> list[Reason]:
    reasons = [Reason(code=ReasonCode.OUT_OF_BOUNDS_WRITE, case=case, detail=v) for v in integrity.guard_violations]
    if integrity.modified_inputs:
        reasons.append(Reason(code=ReasonCode.INPUT_MODIFIED, case=case,
                              detail=f"inputs changed by the kernel: {', '.join(integrity.modified_inputs)}"))
    return reasons


def mismatch_detail(check) -> str:
    first = check.first_mismatches[0] if check.first_mismatches else None
    where = f"; first at {list(first.index)}: expected {first.expected:.6g}, got {first.got:.6g}" if first else ""
    nonfinite = f", {check.nonfinite_mismatches} NaN/Inf where they do not belong" if check.nonfinite_mismatches else ""
    return (f"{check.name}: {check.mismatches} of {check.elements} elements beyond tolerance "
            f"(max abs error {check.max_abs_error:.3g}, max rel error {check.max_rel_error:.3g}{nonfinite}){where}")


def poison_count(expected: dict[str, np.ndarray], layout: jobs.Layout, byte: int) -> int:
    """Elements of a correct output that happen to equal the poison pattern (almost always 0)."""
    return sum(int(np.count_nonzero(equals_pattern(expected[spec.name], byte))) for spec in layout.outputs)


def equals_pattern(array: np.ndarray, byte: int) -> np.ndarray:
    """Flat: whether each element's bytes are all `byte` (compared as unsigned integers of its size)."""
    return raw_words(array) == int.from_bytes(bytes([byte]) * array.dtype.itemsize, "little")

