"""How the parent judges a kernel's raw outputs (poison still in place, guard bands, mismatches) and its timed
launches (uneven, or not the declared kernel)."""

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


def unwritten_by_reference(name: str, count: int, elements: int, first_at) -> str:
    """Why a reference that leaves output elements unwritten is refused: said as such, not as two runs that
    differ (an unwritten element holds each run's poison, so the runs always differ there)."""
    return (f"it leaves {count} of {elements} elements of {name} unwritten (first at {list(first_at)}; they still "
            "hold the poison after both runs): a reference must write every element of every output")


def reference_unwritten(name: str, first: np.ndarray, second: np.ndarray) -> str | None:
    """unwritten_by_reference's text for one output of the reference's two runs, None where it writes all."""
    unwritten = still_poisoned(first, second)
    count = int(np.count_nonzero(unwritten))
    if not count:
        return None
    first_at = [int(i) for i in np.unravel_index(int(np.argmax(unwritten)), first.shape)]
    return unwritten_by_reference(name, count, int(first.size), first_at)


def integrity_reasons(integrity: jobs.Integrity, case: str) -> list[Reason]:
    reasons = [Reason(code=ReasonCode.OUT_OF_BOUNDS_WRITE, case=case, detail=v) for v in integrity.guard_violations]
    if integrity.modified_inputs:
        reasons.append(Reason(code=ReasonCode.INPUT_MODIFIED, case=case,
                              detail=f"inputs changed by the kernel: {', '.join(integrity.modified_inputs)}"))
    return reasons


def tampered_reasons(answer: dict, case: str) -> list[Reason]:
    """The timed launches whose evidence (counts, audited snapshots) no longer matched its MAC when the worker
    checked it (harness/worker_side/evidence_mac.py): a launch wrote the referee's records of another."""
    tampered = answer.get("tampered") or []
    if not isinstance(tampered, list) or not all(isinstance(t, str) for t in tampered):
        raise jobs.AnswerError("timing answer's tampered launches are not a list of names")
    if not tampered:
        return []
    return [Reason(code=ReasonCode.EVIDENCE_TAMPERED, case=case, detail=(
        f"the evidence of {len(tampered)} timed launches changed after it was sealed (first: {tampered[0]}): "
        "a launch wrote the referee's records of another"))]


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


# An honest kernel's launches take about the same time: on an H200 the mean of a case's samples was within
# 1% of their median (its slowest launch within 13%). A kernel that does several launches' work in a few of
# them and little in the rest keeps the mean (the work is the same) and moves the median, which is the score.
UNEVEN_MEAN_OVER_MEDIAN = 1.5


def uneven_launches(stats, case: str) -> list[Reason]:
    """A job whose mean launch is far above its median one: work shifted between launches, beyond any noise."""
    ratio = stats.mean_ms / stats.median_ms if stats.median_ms > 0 else 1.0
    if ratio <= UNEVEN_MEAN_OVER_MEDIAN:
        return []
    return [Reason(code=ReasonCode.UNEVEN_LAUNCHES, case=case, detail=(
        f"the mean timed launch ({stats.mean_ms * 1e3:.2f} us) is {ratio:.2f} times the median one "
        f"({stats.median_ms * 1e3:.2f} us), beyond the {UNEVEN_MEAN_OVER_MEDIAN:g} allowed: some launches do "
        "the work of others, which the median would not see"))]


def undeclared_launches(records: list | None, header: dict, case: str) -> list[Reason]:
    """Timed launches whose kernel records (the kernel clock's: name, grid, block per kernel) are not the
    one declared kernel with its declared grid and block. None: no records (events alone, a library call)."""
    if records is None or "kernel" not in header:
        return []
    declared = [header["kernel"], list(header["launch"]["grid"]), list(header["launch"]["block"])]
    off = [(i, r) for i, r in enumerate(records) if r != [declared]]
    if not off:
        return []
    i, got = off[0]
    seen = "; ".join(f"{name} grid {tuple(grid)} block {tuple(block)}" for name, grid, block in got) or "no kernel"
    return [Reason(code=ReasonCode.LAUNCH_NOT_AS_DECLARED, case=case, detail=(
        f"{len(off)} timed launches did not run exactly the declared kernel {declared[0]} with grid "
        f"{tuple(declared[1])} and block {tuple(declared[2])} (first: launch {i} ran {seen})"))]


def audit_reasons(case: str, wrong: list[str], audited: int) -> list[Reason]:
    """The reason of a timing whose audited launches gave wrong outputs (`wrong`: "launch I: detail" each)."""
    if not wrong:
        return []
    return [Reason(code=ReasonCode.TIMED_OUTPUT_MISMATCH, case=case, detail=(
        f"{len(wrong)} of {audited} audited timed launches gave wrong outputs for their own fresh "
        f"inputs (first: {wrong[0]}); a result must be computed from the inputs of its launch"))]
