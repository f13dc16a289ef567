"""What a check learns of one output: the candidate's first run against the expected output, the elements
neither run wrote, and whether the two runs agree. Made on the host from arrays (digest_on_host) or from
the totals a GPU worker's judging kernels leave (digest_from_totals); a case's reasons come from a
digest alone (harness/judging.py's check_reasons), so both paths give the same verdict for the same
bytes."""

from __future__ import annotations

import struct
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from harness.compare import Agreement, Mismatch, OutputCheck, agreement, compare_output, spread_warning
from harness.judging import mismatch_detail, still_poisoned
from harness.results import Reason, ReasonCode

FIRST_MISMATCHES = 5  # reported with their indices and values


class OutputDigest(BaseModel):
    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    check: OutputCheck  # the first run against the expected output
    unwritten: int  # elements holding each run's poison: never written
    first_unwritten: tuple[int, ...] | None  # the first of them (row-major), if any
    agreement: Agreement  # of the two runs, over the written elements
    judged_on: Literal["host", "device"]


def digest_on_host(name: str, expected: np.ndarray, first: np.ndarray, second: np.ndarray,
                   rtol: float, atol: float) -> OutputDigest:
    check = compare_output(name, expected, first, rtol, atol, max_report=FIRST_MISMATCHES)
    unwritten = still_poisoned(first, second)
    count = int(np.count_nonzero(unwritten))
    first_at = tuple(int(i) for i in np.unravel_index(np.argmax(unwritten), first.shape)) if count else None
    written = (first[~unwritten], second[~unwritten]) if count else (first, second)
    return OutputDigest(check=check, unwritten=count, first_unwritten=first_at,
                        agreement=agreement(*written, rtol, atol), judged_on="host")


def double_of_bits(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def double_of_order_key(key: int) -> float:
    """The inverse of the kernels' judge_order_key."""
    bits = key & ~(1 << 63) if key >> 63 else ~key & ((1 << 64) - 1)
    return double_of_bits(bits)


def unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


def digest_from_totals(name: str, shape: tuple[int, ...], totals: dict[str, int], spread: dict[str, int],
                       mismatches: list[tuple[int, float, float]], atol: float) -> OutputDigest:
    """A digest from the judging kernels' totals (judge_source.TOTALS_FIELDS), the expected output's spread
    (STATS_FIELDS) and the first mismatches as (flat index, expected, got)."""
    size = int(np.prod(shape, dtype=np.int64)) if shape else 1
    nonfinite = spread["nonfinite"]
    finite = size - nonfinite
    low = double_of_order_key(spread["finite_min_key"]) if finite else np.inf
    high = double_of_order_key(spread["finite_max_key"]) if finite else -np.inf
    check = OutputCheck(
        name=name, passed=totals["mismatches"] == 0, elements=size, mismatches=totals["mismatches"],
        max_abs_error=double_of_bits(totals["max_abs_bits"]), max_rel_error=double_of_bits(totals["max_rel_bits"]),
        nonfinite_mismatches=totals["nonfinite_mismatches"],
        first_mismatches=[Mismatch(index=unravel(i, shape), expected=e, got=g) for i, e, g in mismatches],
        warning=spread_warning(nonfinite, low, high, size, atol))
    if totals["pair_differ_bits"] == 0:
        pair = Agreement.IDENTICAL
    else:
        pair = Agreement.DIFFERS if totals["pair_mismatches"] else Agreement.WITHIN_TOLERANCE
    first_unwritten = unravel(totals["first_unwritten"], shape) if totals["unwritten"] else None
    return OutputDigest(check=check, unwritten=totals["unwritten"], first_unwritten=first_unwritten,
                        agreement=pair, judged_on="device")


def digest_reasons(case: str, digest: OutputDigest) -> tuple[list[Reason], list[str]]:
    """The reasons an output fails (beyond tolerance, unwritten, runs that disagree) and its warnings."""
    check, reasons, warnings = digest.check, [], []
    if check.warning:
        warnings.append(f"{check.name}: {check.warning}")
    if not check.passed:
        reasons.append(Reason(code=ReasonCode.MISMATCH, case=case, detail=mismatch_detail(check)))
    if digest.unwritten:
        reasons.append(Reason(code=ReasonCode.UNWRITTEN_OUTPUT, case=case, detail=(
            f"{check.name}: {digest.unwritten} of {check.elements} elements were never written "
            f"(they still hold the poison; first at {list(digest.first_unwritten)})")))
    if digest.agreement is Agreement.DIFFERS:
        reasons.append(Reason(code=ReasonCode.RACE, case=case, detail=(
            f"{check.name}: two runs on the same inputs disagree beyond tolerance "
            "(a race or a read of uninitialized memory)")))
    elif digest.agreement is Agreement.WITHIN_TOLERANCE:
        warnings.append(f"{check.name}: nondeterministic (runs differ within tolerance)")
    return reasons, warnings


def runs_agreement(digests: list[OutputDigest]) -> Agreement:
    """The case's: the worst of its outputs'."""
    order = [Agreement.IDENTICAL, Agreement.WITHIN_TOLERANCE, Agreement.DIFFERS]
    return max((d.agreement for d in digests), key=order.index, default=Agreement.IDENTICAL)
