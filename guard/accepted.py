"""The accepted ratio an approval holds later guard runs to, per performance case: the kernel's latency over its
baseline's.

Measured as the guard measures a run's (guard/verdict.py): interleaved rounds, each a timing job of the kernel and
one of its baseline; per round the log ratio of their medians; the Hodges-Lehmann estimate over the rounds and
its signed-rank interval. The verdict widens every later run's change by this interval, so it must count the
same noise the guard's rounds count: the shift of a median from one job to the next. The run's own speedup
interval cannot (its two jobs per kernel are merged into one sample set, and the interval is the merged median's),
so an approval taken from it alone is held to an interval narrower than its real error.

`measure` takes the rounds (approve does, on the GPU, through guard/measure.py's GuardStep); `from_rounds` is the
ratio of rounds already taken; `accepted_fields` is what the guard's verdict holds a run to: a case's measured
ratio, else the older reading from the run's medians and speedup interval (an approval made before, or with
`approve --from-run`). bench/guard.py makes its approvals with these, both ways.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence

from guard.approval import AcceptedRatio, CaseLatency
from guard.verdict import CaseInput, Correctness, TimingRound, VerdictSettings, decide, round_trouble

# 32 rounds: the approval's error is added to every later run's (the verdict's half-widths in quadrature), and with
# 8 rounds instead the recorded noise leaves a tenth of unchanged runs undecided (bench/recorded/
# cpu-2026-12-06-guard/README.md).
DEFAULT_ROUNDS = 32
FEWEST_ROUNDS = 8  # the fewest with a signed-rank interval at the guard's confidence and at 99%
_CORRECT = Correctness(correct=True)

Rounds = Callable[[list[str] | None], dict[str, TimingRound]]  # one round of these cases (None: every one)


class RatioUnmeasured(Exception):
    """Too few rounds could be kept (another process, throttling) to measure a case's accepted ratio."""


def from_rounds(case: str, rounds: Sequence[TimingRound],
                settings: VerdictSettings | None = None) -> AcceptedRatio | None:
    """The ratio over the rounds the guard would keep, with its interval at the guard's confidence; None with fewer
    than FEWEST_ROUNDS kept."""
    settings = (settings or VerdictSettings()).model_copy(update={"min_rounds": FEWEST_ROUNDS})
    verdict = decide(CaseInput(approval="accepted", case=case, accepted_ratio=1.0), rounds, _CORRECT, settings)
    ratio = verdict.ratio
    if ratio is None:
        return None
    waived = Counter(label for timed in rounds for label in timed.shape_waived)
    return AcceptedRatio(estimate=ratio.estimate, low=ratio.low, high=ratio.high, confidence=ratio.confidence,
                         rounds=verdict.rounds_kept, set_aside=verdict.set_aside, shape_waived=dict(waived))


def measure(round_: Rounds, cases: list[str], rounds: int = DEFAULT_ROUNDS, settings: VerdictSettings | None = None,
            say: Callable[[str], None] | None = None) -> dict[str, AcceptedRatio]:
    """Take rounds until every case has `rounds` the guard would keep (no other process, no harmful throttle),
    taking at most twice as many; the later rounds time only the cases still short. RatioUnmeasured names the
    cases that stay short and why their rounds were set aside."""
    if rounds < FEWEST_ROUNDS:
        raise ValueError(f"an accepted ratio needs at least {FEWEST_ROUNDS} rounds, not {rounds}")
    settings = settings or VerdictSettings()
    say = say or (lambda message: None)
    taken: dict[str, list[TimingRound]] = {case: [] for case in cases}
    kept = dict.fromkeys(cases, 0)
    while short := [c for c in cases if kept[c] < rounds and len(taken[c]) < 2 * rounds]:
        number = max(len(taken[c]) for c in short) + 1
        if number == 1 or number % 8 == 0:
            say(f"accepted ratio: round {number} of {rounds} beside the baseline")
        for name, timed in round_(None if len(short) == len(cases) else short).items():
            if name in taken:
                taken[name].append(timed)
                kept[name] += round_trouble(timed, None, settings.clock_floor) is None
    missing = [c for c in cases if kept[c] < rounds]
    if missing:
        raise RatioUnmeasured("; ".join(
            f"{c}: {kept[c]} of {len(taken[c])} rounds usable ({_set_aside(taken[c], settings)})" for c in missing))
    ratios = {}
    for case in cases:
        first = _first_kept(taken[case], rounds, settings)
        ratio = from_rounds(case, first, settings)
        if ratio is None:  # unreachable with FEWEST_ROUNDS kept
            raise RatioUnmeasured(f"{case}: no interval from {rounds} rounds")
        ratios[case] = ratio
    return ratios


def accepted_fields(accepted: CaseLatency) -> dict[str, float]:
    """The accepted ratio and its interval as CaseInput's fields: the case's measured `ratio` where the approval has
    one, else the run's (its medians' ratio, its speedup interval turned around); {} where none is usable."""
    if accepted.ratio is not None:
        r = accepted.ratio
        return {"accepted_ratio": r.estimate, "accepted_low": r.low, "accepted_high": r.high,
                "accepted_confidence": r.confidence}
    if accepted.baseline is not None:
        ratio = accepted.kernel.median_ms / accepted.baseline.median_ms
    elif accepted.speedup is not None:
        ratio = 1.0 / accepted.speedup.ratio
    else:
        return {}
    return {"accepted_ratio": ratio, **run_interval(accepted)}


def run_interval(accepted: CaseLatency) -> dict[str, float]:
    """The run's interval on the ratio (the kernel's latency over its baseline's) and its confidence: from the
    recorded speedup's (baseline over kernel, so turned around), else from the two medians' intervals paired at
    opposite ends, as the speedup's are; none where an end is not a positive finite number."""
    kernel, baseline = accepted.kernel, accepted.baseline
    if accepted.speedup is not None:
        if not accepted.speedup.low > 0.0:
            return {}
        low, high = 1.0 / accepted.speedup.high, 1.0 / accepted.speedup.low
    elif baseline is not None and baseline.ci_low_ms > 0.0:
        low, high = kernel.ci_low_ms / baseline.ci_high_ms, kernel.ci_high_ms / baseline.ci_low_ms
    else:
        return {}
    if not (0.0 < low <= high and math.isfinite(high)):
        return {}
    return {"accepted_low": low, "accepted_high": high, "accepted_confidence": kernel.confidence}


def _first_kept(rounds: list[TimingRound], count: int, settings: VerdictSettings) -> list[TimingRound]:
    """The rounds up to and including the `count`-th the guard keeps (set-aside ones among them stay named)."""
    kept = 0
    for index, timed in enumerate(rounds):
        kept += round_trouble(timed, None, settings.clock_floor) is None
        if kept == count:
            return rounds[:index + 1]
    return rounds


def _set_aside(rounds: list[TimingRound], settings: VerdictSettings) -> str:
    reasons: dict[str, int] = {}
    for timed in rounds:
        trouble = round_trouble(timed, None, settings.clock_floor)
        if trouble is not None:
            reasons[trouble.value] = reasons.get(trouble.value, 0) + 1
    return ", ".join(f"{n} set aside for {reason}" for reason, n in sorted(reasons.items())) or "none set aside"
