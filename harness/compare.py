"""Output checking: does a candidate kernel's output match the reference?

Runs in the trusted parent process on arrays copied back from the device.
Work is done in fixed-size chunks so 64M-element outputs are compared with
bounded extra memory and cache-friendly passes, never a Python loop per element.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum

import numpy as np
from pydantic import BaseModel, ConfigDict

# Large enough to amortize per-call numpy overhead, small enough that one
# chunk's float64 work arrays (512 KiB each) stay in cache.
CHUNK_ELEMENTS = 1 << 16

# Floor on |expected| for relative error so exact zeros give a large finite
# relative error instead of a division by zero.
REL_ERROR_FLOOR = 1e-30

# Spread below this fraction of the magnitude means the values are one constant
# up to rounding, so a wrong-but-constant kernel could still pass.
NEAR_CONSTANT_REL_SPREAD = 1e-6


class Mismatch(BaseModel):
    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    index: tuple[int, ...]
    expected: float
    got: float


class OutputCheck(BaseModel):
    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    name: str
    passed: bool
    elements: int
    mismatches: int
    max_abs_error: float
    max_rel_error: float
    nonfinite_mismatches: int
    first_mismatches: list[Mismatch]
    warning: str | None = None


class Agreement(str, Enum):
    IDENTICAL = "identical"
    WITHIN_TOLERANCE = "within_tolerance"
    DIFFERS = "differs"


def _check_compatible(expected: np.ndarray, got: np.ndarray) -> None:
    # A shape or dtype mismatch means the harness wired buffers wrongly; it must
    # not be reported as the candidate producing wrong numbers.
    if expected.shape != got.shape:
        raise ValueError(f"shape mismatch: expected {expected.shape}, got {got.shape}")
    if expected.dtype != got.dtype:
        raise ValueError(f"dtype mismatch: expected {expected.dtype}, got {got.dtype}")
    if np.issubdtype(expected.dtype, np.complexfloating):
        raise ValueError(f"complex dtype {expected.dtype} is not supported")


def _check_tolerances(rtol: float, atol: float) -> None:
    for label, value in (("rtol", rtol), ("atol", atol)):
        if not (np.isfinite(value) and value >= 0):
            raise ValueError(f"{label} must be finite and non-negative, got {value!r}")


def _float64_chunks(*arrays: np.ndarray, span: tuple[int, int] | None = None) -> Iterator[tuple[int, list[np.ndarray]]]:
    """Yield (flat offset, float64 chunk of each array) in C order, over `span` (first, end) of the
    flat arrays or all of them.

    The yielded chunks are reused buffers: valid only until the next step.
    """
    flats = [np.ravel(a, order="C") for a in arrays]
    size = flats[0].size if flats else 0
    first, end = span or (0, size)
    buffers = [np.empty(min(end - first, CHUNK_ELEMENTS), dtype=np.float64) for _ in flats]
    for start in range(first, end, CHUNK_ELEMENTS):
        stop = min(start + CHUNK_ELEMENTS, end)
        chunks = [buf[: stop - start] for buf in buffers]
        for chunk, flat in zip(chunks, flats):
            np.copyto(chunk, flat[start:stop], casting="unsafe")
        yield start, chunks


@dataclass
class _Scratch:
    """Preallocated per-chunk work arrays: fresh temporaries of this size
    would be mmap'ed and page-faulted on every chunk, which dominates runtime."""

    abs_err: np.ndarray
    scaled: np.ndarray
    ok: np.ndarray
    flag_a: np.ndarray
    flag_b: np.ndarray

    @classmethod
    def sized(cls, n: int) -> _Scratch:
        floats = (np.empty(n, dtype=np.float64) for _ in range(2))
        flags = (np.empty(n, dtype=bool) for _ in range(3))
        return cls(*floats, *flags)

    def head(self, n: int) -> _Scratch:
        return _Scratch(self.abs_err[:n], self.scaled[:n], self.ok[:n], self.flag_a[:n], self.flag_b[:n])


@dataclass
class _ChunkResult:
    ok: np.ndarray  # element satisfies the rule; a scratch view
    mismatches: int
    nonfinite_mismatches: int
    max_abs: float
    max_rel: float


def _finite_chunk_result(e: np.ndarray, s: _Scratch, peak: float, rtol: float, atol: float) -> _ChunkResult:
    """Rule and error maxima given s.abs_err = |g - e| with every pair finite."""
    np.abs(e, out=s.scaled)
    np.multiply(s.scaled, rtol, out=s.scaled)
    np.add(s.scaled, atol, out=s.scaled)
    np.less_equal(s.abs_err, s.scaled, out=s.ok)
    np.abs(e, out=s.scaled)
    np.maximum(s.scaled, REL_ERROR_FLOOR, out=s.scaled)
    np.divide(s.abs_err, s.scaled, out=s.scaled)
    return _ChunkResult(
        ok=s.ok,
        mismatches=int(s.ok.size - np.count_nonzero(s.ok)),
        nonfinite_mismatches=0,
        max_abs=float(peak),
        max_rel=float(s.scaled.max()),
    )


def _check_chunk(e: np.ndarray, g: np.ndarray, rtol: float, atol: float, s: _Scratch) -> _ChunkResult:
    """Apply the rule to one float64 chunk pair; may overwrite `e` and `g`."""
    with np.errstate(invalid="ignore", over="ignore"):
        np.subtract(g, e, out=s.abs_err)
        np.abs(s.abs_err, out=s.abs_err)
        peak = s.abs_err.max()  # NaN/Inf here means some element is non-finite
        if np.isfinite(peak):
            return _finite_chunk_result(e, s, peak, rtol, atol)
        nonfinite, nonfinite_ok = s.flag_a, s.flag_b
        np.isfinite(e, out=nonfinite)
        np.logical_and(nonfinite, np.isfinite(g, out=s.ok), out=nonfinite)
        np.logical_not(nonfinite, out=nonfinite)
        # inf == inf holds and +inf == -inf does not; NaN needs its own test.
        np.logical_and(np.isnan(e, out=nonfinite_ok), np.isnan(g, out=s.ok), out=nonfinite_ok)
        np.logical_or(nonfinite_ok, np.equal(e, g, out=s.ok), out=nonfinite_ok)
        # Zero the non-finite pairs so the finite rule and error maxima skip them.
        np.copyto(e, 0.0, where=nonfinite)
        np.copyto(g, 0.0, where=nonfinite)
        np.subtract(g, e, out=s.abs_err)
        np.abs(s.abs_err, out=s.abs_err)
        # Still non-finite only if g - e overflowed: reported as an inf error.
        result = _finite_chunk_result(e, s, s.abs_err.max(), rtol, atol)
    np.copyto(result.ok, nonfinite_ok, where=nonfinite)
    result.mismatches = int(result.ok.size - np.count_nonzero(result.ok))
    np.logical_and(nonfinite, np.logical_not(nonfinite_ok, out=nonfinite_ok), out=nonfinite)
    result.nonfinite_mismatches = int(np.count_nonzero(nonfinite))
    return result


def _mismatch_records(
    expected: np.ndarray, got: np.ndarray, flat_indices: list[int]
) -> list[Mismatch]:
    if not flat_indices:
        return []
    if expected.ndim == 0:
        indices = [()]  # np.unravel_index rejects 0-d shapes
    else:
        coords = np.unravel_index(np.asarray(flat_indices, dtype=np.intp), expected.shape)
        indices = [tuple(int(c) for c in point) for point in zip(*coords)]
    return [
        Mismatch(index=index, expected=float(expected[index]), got=float(got[index]))
        for index in indices
    ]


@dataclass
class _Tally:
    mismatches: int = 0
    nonfinite_mismatches: int = 0
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    first_flat: list[int] = field(default_factory=list)


# Arrays of more elements than this are checked in spans on several threads (numpy's loops let go
# of the GIL): a 2048 x 2048 output is compared in a fraction of the time.
PARALLEL_ELEMENTS = 1 << 20
_threads: dict = {"pool": None}
_threads_made = threading.Lock()


def _spans(size: int) -> list[tuple[int, int]]:
    """(first, end) of contiguous spans covering `size` elements, one per thread, whole chunks each."""
    count = min(8, os.cpu_count() or 1, -(-size // CHUNK_ELEMENTS)) if size >= PARALLEL_ELEMENTS else 1
    if count <= 1:
        return [(0, size)]
    per = -(-size // count // CHUNK_ELEMENTS) * CHUNK_ELEMENTS
    return [(first, min(first + per, size)) for first in range(0, size, per)]


def _in_spans(work, size: int) -> list:
    """work(span) over every span of `size` elements: side by side where there are several, in order."""
    spans = _spans(size)
    if len(spans) == 1:
        return [work(spans[0])]
    with _threads_made:
        if _threads["pool"] is None:
            _threads["pool"] = ThreadPoolExecutor(max_workers=8, thread_name_prefix="compare")
    return list(_threads["pool"].map(work, spans))


def _tally(expected: np.ndarray, got: np.ndarray, rtol: float, atol: float, max_report: int) -> _Tally:
    expected, got = np.ravel(expected, order="C"), np.ravel(got, order="C")
    parts = _in_spans(lambda span: _tally_span(expected, got, rtol, atol, max_report, span), expected.size)
    tally = _Tally()
    for part in parts:
        tally.mismatches += part.mismatches
        tally.nonfinite_mismatches += part.nonfinite_mismatches
        tally.max_abs_error = max(tally.max_abs_error, part.max_abs_error)
        tally.max_rel_error = max(tally.max_rel_error, part.max_rel_error)
        tally.first_flat += part.first_flat[:max_report - len(tally.first_flat)]
    return tally


def _tally_span(expected: np.ndarray, got: np.ndarray, rtol: float, atol: float, max_report: int,
                span: tuple[int, int]) -> _Tally:
    tally = _Tally()
    scratch = _Scratch.sized(min(span[1] - span[0], CHUNK_ELEMENTS))
    for offset, (e, g) in _float64_chunks(expected, got, span=span):
        chunk = _check_chunk(e, g, rtol, atol, scratch.head(e.size))
        tally.mismatches += chunk.mismatches
        tally.nonfinite_mismatches += chunk.nonfinite_mismatches
        tally.max_abs_error = max(tally.max_abs_error, chunk.max_abs)
        tally.max_rel_error = max(tally.max_rel_error, chunk.max_rel)
        wanted = max_report - len(tally.first_flat)
        if chunk.mismatches and wanted > 0:
            tally.first_flat.extend(int(i) + offset for i in np.flatnonzero(~chunk.ok)[:wanted])
    return tally


def compare_output(
    name: str,
    expected: np.ndarray,
    got: np.ndarray,
    rtol: float,
    atol: float,
    max_report: int = 5,
) -> OutputCheck:
    """Check |got - expected| <= atol + rtol * |expected| per element, in float64.

    NaN and +/-Inf must appear in exactly the same positions in both arrays.
    """
    expected, got = np.asarray(expected), np.asarray(got)
    _check_compatible(expected, got)
    _check_tolerances(rtol, atol)
    if max_report < 0:
        raise ValueError(f"max_report must be non-negative, got {max_report}")
    tally = _tally(expected, got, rtol, atol, max_report)
    return OutputCheck(
        name=name,
        passed=tally.mismatches == 0,
        elements=int(expected.size),
        mismatches=tally.mismatches,
        max_abs_error=tally.max_abs_error,
        max_rel_error=tally.max_rel_error,
        nonfinite_mismatches=tally.nonfinite_mismatches,
        first_mismatches=_mismatch_records(expected, got, tally.first_flat),
        warning=degenerate_warning(expected, atol),
    )


@dataclass
class _Spread:
    nonfinite: int = 0
    finite_min: float = np.inf
    finite_max: float = -np.inf
    max_magnitude: float = 0.0


def _finite_spread(values: np.ndarray) -> _Spread:
    values = np.ravel(values, order="C")
    spread = _Spread()
    for part in _in_spans(lambda span: _finite_spread_span(values, span), values.size):
        spread.nonfinite += part.nonfinite
        spread.finite_min = min(spread.finite_min, part.finite_min)
        spread.finite_max = max(spread.finite_max, part.finite_max)
    spread.max_magnitude = max(abs(spread.finite_min), abs(spread.finite_max), 0.0)
    return spread


def _finite_spread_span(values: np.ndarray, span: tuple[int, int]) -> _Spread:
    spread = _Spread()
    for _, (chunk,) in _float64_chunks(values, span=span):
        finite = np.isfinite(chunk)
        spread.nonfinite += int(chunk.size - np.count_nonzero(finite))
        if not finite.all():
            chunk = chunk[finite]
        if chunk.size:
            spread.finite_min = min(spread.finite_min, float(chunk.min()))
            spread.finite_max = max(spread.finite_max, float(chunk.max()))
    spread.max_magnitude = max(abs(spread.finite_min), abs(spread.finite_max), 0.0)
    return spread


def degenerate_warning(expected: np.ndarray, atol: float) -> str | None:
    """Explain why `expected` cannot tell a right kernel from a wrong one, if so.

    An all-zero or constant reference is passed by a kernel that writes nothing
    (zeroed buffer) or writes one value everywhere, so a pass means little.
    """
    expected = np.asarray(expected)
    if expected.size == 0:
        return "expected output is empty"
    spread = _finite_spread(expected)
    return spread_warning(spread.nonfinite, spread.finite_min, spread.finite_max, expected.size, atol)


def spread_warning(nonfinite: int, finite_min: float, finite_max: float, size: int, atol: float) -> str | None:
    """degenerate_warning() from the expected output's spread: its NaN/Inf count and finite extremes
    (as a GPU worker measures them where the output lies)."""
    if size == 0:
        return "expected output is empty"
    warnings = []
    if nonfinite * 2 > size:
        warnings.append(f"more than half of expected values are NaN/Inf ({nonfinite} of {size})")
    finite_count = size - nonfinite
    if finite_count:
        max_magnitude = max(abs(finite_min), abs(finite_max), 0.0)
        value_range = finite_max - finite_min
        if max_magnitude <= atol:
            warnings.append(f"near-zero: all finite expected values are within atol={atol:g} of zero")
        elif finite_count > 1 and (
            value_range <= atol or value_range <= NEAR_CONSTANT_REL_SPREAD * max_magnitude
        ):
            warnings.append(
                f"near-constant: finite expected values span only {value_range:g} "
                f"(from {finite_min:g} to {finite_max:g})"
            )
    return "; ".join(warnings) if warnings else None


def raw_words(values: np.ndarray) -> np.ndarray:
    """The array's bytes viewed as unsigned ints of the element's width, so
    -0.0 vs 0.0 and differing NaN payloads count as different."""
    flat = np.ascontiguousarray(values).reshape(-1)
    width = flat.dtype.itemsize
    word = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(width, np.uint8)
    return flat.view(word)


def _bitwise_identical(first: np.ndarray, second: np.ndarray) -> bool:
    a, b = raw_words(first), raw_words(second)
    # Chunked with early exit: most differing runs differ near the start.
    step = CHUNK_ELEMENTS * 4
    return all(np.array_equal(a[i : i + step], b[i : i + step]) for i in range(0, a.size, step))


def agreement(first: np.ndarray, second: np.ndarray, rtol: float, atol: float) -> Agreement:
    """Classify two runs of one kernel on the same inputs (different poison).

    Bitwise-identical runs are deterministic; runs that merely agree within
    tolerance are likely reduction-order nondeterminism; anything else points
    at a race or a read of uninitialized (poisoned) memory.
    """
    first, second = np.asarray(first), np.asarray(second)
    _check_compatible(first, second)
    _check_tolerances(rtol, atol)
    if _bitwise_identical(first, second):
        return Agreement.IDENTICAL
    tally = _tally(first, second, rtol, atol, max_report=0)
    return Agreement.WITHIN_TOLERANCE if tally.mismatches == 0 else Agreement.DIFFERS
