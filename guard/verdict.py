"""The guard's verdict on one approval's case: pass, regressed, improved, incorrect or inconclusive.

The measured quantity is the ratio of the approved kernel's latency to its baseline kernel's, timed in
interleaved rounds on the same GPU, so a machine of another speed moves both and leaves the ratio. Each
round gives one log ratio of medians; the change since approval is that ratio over the approval's, with
a signed-rank interval across rounds (guard/intervals.py). The decision is an equivalence test against
the threshold t, in the spirit of nvbench's robust compare and Pinpoint's SAME/DIFFERENT/UNKNOWN:

- regressed: the whole interval is above 1 + t (slower beyond noise, and by more than t);
- improved: the whole interval is below 1 - t;
- pass: the interval's top is at most 1 + t;
- inconclusive: the interval straddles 1 + t. `decide_with_repeats` then adds rounds, up to a bound.

Rounds timed while another process held the GPU, while it throttled, or below the approval's clocks
are set aside (never averaged in), and named as the reason when they leave too little to decide.
Where the environment matches the approval's, the kernel's latency is compared with the accepted one
too: a kernel whose ratio holds while both it and its baseline got slower on an identical machine is
not passed silently (inconclusive, latency_drift). docs/guard.md gives the numbers behind the defaults
(bench/guard.py).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from enum import Enum
from statistics import NormalDist

from pydantic import BaseModel, ConfigDict, Field

from guard.intervals import shift_interval
from harness.nvml import BENIGN, GpuWatch

# 1.5%: half of the 3% slowdown the guard must catch, so that both an unchanged kernel's pass and a 3% slower
# one's regression need the same interval half-width, 1.5%, which the recorded noise reaches within the bound
# for every recorded kernel from 10 us (bench/recorded/cpu-2026-12-06-guard/README.md: 1% leaves more runs
# inconclusive, 2% misses more of the 3% slowdowns).
DEFAULT_THRESHOLD = 0.015


class Verdict(str, Enum):
    PASS = "pass"
    REGRESSED = "regressed"
    IMPROVED = "improved"
    INCORRECT = "incorrect"
    INCONCLUSIVE = "inconclusive"


class Inconclusive(str, Enum):
    """Why a case could not be decided."""

    NOISE = "noise"  # the interval still straddles the threshold
    OTHER_PROCESS = "other_process"  # another process held a context on the GPU
    THROTTLING = "throttling"  # the GPU reported a harmful clock-event reason (thermal, power)
    CLOCKS_BELOW_APPROVAL = "clocks_below_approval"  # the SM clock read under the approval's
    LATENCY_DRIFT = "latency_drift"  # ratio held, but the kernel is slower than accepted on the same environment


class VerdictSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    # 95%, not 99%: a false alarm needs the whole interval above 1 + threshold, so the threshold's margin, not
    # the confidence, keeps false alarms rare; the narrower interval decides in fewer rounds (bench/guard.py).
    confidence: float = Field(0.95, gt=0.0, lt=1.0)
    min_rounds: int = Field(8, ge=1)  # 8 is also the fewest with a 99% signed-rank interval
    step_rounds: int = Field(4, ge=1)  # rounds added per look while inconclusive
    max_rounds: int = Field(48, ge=1)  # the bound on rounds taken, set aside ones included
    clock_floor: float = Field(0.95, gt=0.0, le=1.0)  # a round below this share of the approval's SM clock is set aside
    trouble_share: float = Field(0.25, ge=0.0, le=1.0)  # set-aside share from which they, not noise, are the reason


class TimingRound(BaseModel):
    """One round of interleaved launches of the approved kernel and its baseline, on one case."""

    model_config = ConfigDict(frozen=True)

    candidate_ms: list[float] = Field(min_length=1)
    baseline_ms: list[float] = Field(min_length=1)
    watch: GpuWatch | None = None  # the GPU's readings around the round, where NVML answers
    # the kernels ("baseline", or both where the kernel is the task's own) whose timing was taken as measured
    # though its launches' shape was refused: yardsticks (harness/timing_shape.py shape_waived)
    shape_waived: list[str] = []


class Correctness(BaseModel):
    """The referee's checks of the replayed kernel on this case (recorded and fresh values)."""

    model_config = ConfigDict(frozen=True)

    correct: bool
    reasons: list[str] = []  # ReasonCode values (harness/results.py) when not correct
    detail: str = ""


class CaseInput(BaseModel):
    """What the approval says about one case, before any timing."""

    model_config = ConfigDict(frozen=True)

    approval: str
    case: str
    accepted_ratio: float = Field(gt=0.0)  # the kernel's latency over its baseline's, when approved
    # The accepted ratio's own interval and its confidence, where the approval has one: an approval measured
    # low by chance would otherwise make every later run look slower (bench/guard.py measures how often).
    accepted_low: float | None = Field(None, gt=0.0)
    accepted_high: float | None = Field(None, gt=0.0)
    accepted_confidence: float | None = Field(None, gt=0.0, lt=1.0)
    accepted_latency_ms: float | None = Field(None, gt=0.0)  # given only where the environment matches
    approval_sm_clock_mhz: int | None = None
    threshold: float = Field(DEFAULT_THRESHOLD, gt=0.0, lt=1.0)
    environment_changes: list[str] = []  # what differs from the approval's fingerprint: a change's likely cause


class Interval(BaseModel):
    """A ratio with its interval (1.03 is 3% slower)."""

    model_config = ConfigDict(frozen=True)

    estimate: float
    low: float
    high: float
    confidence: float


class CaseVerdict(BaseModel):
    model_config = ConfigDict(frozen=True)

    approval: str
    case: str
    verdict: Verdict
    reason: Inconclusive | None = None
    threshold: float
    change: Interval | None = None  # this run's ratio over the approval's
    ratio: Interval | None = None  # this run's kernel/baseline latency ratio
    latency_ms: float | None = None  # the kernel's median over the rounds kept
    latency_change: Interval | None = None  # against the accepted latency, where the environment matches
    rounds: int = 0  # rounds taken
    rounds_kept: int = 0
    set_aside: dict[str, int] = {}  # Inconclusive reason -> rounds set aside for it
    correctness: list[str] = []
    environment_changes: list[str] = []
    message: str = ""


def _clock_readings(watch: GpuWatch) -> list[int]:
    # A reading taken while the GPU idled shows idle clocks, not the clock the round ran at.
    return [s.sm_clock_mhz for s in (watch.before, watch.after) if s.sm_clock_mhz and "gpu_idle" not in s.throttle]


def round_trouble(timing: TimingRound, approval_sm_clock_mhz: int | None, clock_floor: float) -> Inconclusive | None:
    """Why this round cannot count, or None."""
    watch = timing.watch
    if watch is None:
        return None
    if watch.other_processes:
        return Inconclusive.OTHER_PROCESS
    if any(r not in BENIGN for s in (watch.before, watch.after) for r in s.throttle):
        return Inconclusive.THROTTLING
    clocks = _clock_readings(watch)
    if approval_sm_clock_mhz and clocks and min(clocks) < clock_floor * approval_sm_clock_mhz:
        return Inconclusive.CLOCKS_BELOW_APPROVAL
    return None


def _log_median(samples: Sequence[float]) -> float:
    value = statistics.median(samples)
    if not value > 0.0 or not math.isfinite(value):
        raise ValueError(f"a round's median latency must be positive and finite, got {value!r}")
    return math.log(value)


def _interval(log_values: Sequence[float], offset: float, confidence: float) -> Interval | None:
    shift = shift_interval([v - offset for v in log_values], confidence)
    if shift is None:
        return None
    return Interval(estimate=math.exp(shift.estimate), low=math.exp(shift.low), high=math.exp(shift.high),
                    confidence=shift.confidence)


def _with_accepted_error(change: Interval, case: CaseInput, confidence: float) -> Interval:
    """Widen the change's interval by the accepted ratio's, half-widths added in quadrature in log space (two
    independent estimates), the accepted one rescaled to this confidence."""
    if case.accepted_low is None or case.accepted_high is None:
        return change
    scale = 1.0
    if case.accepted_confidence is not None:
        scale = NormalDist().inv_cdf(0.5 + confidence / 2) / NormalDist().inv_cdf(0.5 + case.accepted_confidence / 2)
    centre = math.log(change.estimate)
    # The change falls when the accepted ratio rises: its low side takes the accepted high side's error.
    accepted_above = scale * max(0.0, math.log(case.accepted_high / case.accepted_ratio))
    accepted_below = scale * max(0.0, math.log(case.accepted_ratio / case.accepted_low))
    below = math.hypot(centre - math.log(change.low), accepted_above)
    above = math.hypot(math.log(change.high) - centre, accepted_below)
    return change.model_copy(update={"low": math.exp(centre - below), "high": math.exp(centre + above)})


def _percent(ratio: float) -> str:
    return f"{(ratio - 1.0) * 100.0:+.1f}%"


def describe(change: Interval | None, threshold: float) -> str:
    """The compact diff's words: '+3.1% [+2.4%, +3.8%] vs accepted (threshold 1.5%)'."""
    if change is None:
        return f"no interval yet (threshold {threshold * 100:.1f}%)"
    return (f"{_percent(change.estimate)} [{_percent(change.low)}, {_percent(change.high)}] vs accepted "
            f"(threshold {threshold * 100:.1f}%)")


def _ratio_verdict(change: Interval, threshold: float) -> Verdict:
    if change.low > 1.0 + threshold:
        return Verdict.REGRESSED
    if change.high < 1.0 - threshold:
        return Verdict.IMPROVED
    if change.high <= 1.0 + threshold:
        return Verdict.PASS
    return Verdict.INCONCLUSIVE


def _reason(set_aside: Counter, taken: int, share: float) -> Inconclusive:
    if set_aside and sum(set_aside.values()) >= share * taken:
        return set_aside.most_common(1)[0][0]
    return Inconclusive.NOISE


def _message(verdict: Verdict, reason: Inconclusive | None, change: Interval | None, case: CaseInput) -> str:
    words = {Verdict.PASS: "pass", Verdict.REGRESSED: "regressed", Verdict.IMPROVED: "improved",
             Verdict.INCONCLUSIVE: f"inconclusive ({reason.value if reason else 'noise'})"}[verdict]
    text = f"{words}: {describe(change, case.threshold)}"
    if case.environment_changes and verdict is not Verdict.PASS:
        text += "; environment changed: " + ", ".join(case.environment_changes)
    return text


def decide(case: CaseInput, rounds: Sequence[TimingRound], correctness: Correctness,
           settings: VerdictSettings | None = None) -> CaseVerdict:
    """The verdict from the rounds taken so far."""
    settings = settings or VerdictSettings()
    common = dict(approval=case.approval, case=case.case, threshold=case.threshold, rounds=len(rounds),
                  environment_changes=case.environment_changes)
    if not correctness.correct:
        detail = ", ".join(correctness.reasons) or "outputs differ from the reference"
        return CaseVerdict(verdict=Verdict.INCORRECT, correctness=correctness.reasons,
                           message=f"incorrect: {detail}" + (f" ({correctness.detail})" if correctness.detail else ""),
                           **common)
    troubles = [round_trouble(r, case.approval_sm_clock_mhz, settings.clock_floor) for r in rounds]
    set_aside = Counter(t for t in troubles if t is not None)
    kept = [r for r, t in zip(rounds, troubles) if t is None]
    common.update(rounds_kept=len(kept), set_aside={k.value: n for k, n in set_aside.items()})
    kernel = [_log_median(r.candidate_ms) for r in kept]
    ratios = [k - _log_median(r.baseline_ms) for k, r in zip(kernel, kept)]
    change = None
    if len(kept) >= settings.min_rounds:
        change = _interval(ratios, math.log(case.accepted_ratio), settings.confidence)
    change = change and _with_accepted_error(change, case, settings.confidence)
    if change is None:
        reason = set_aside.most_common(1)[0][0] if set_aside else Inconclusive.NOISE
        return CaseVerdict(verdict=Verdict.INCONCLUSIVE, reason=reason, **common,
                           message=f"inconclusive ({reason.value}): {len(kept)} usable rounds of {len(rounds)}")
    verdict = _ratio_verdict(change, case.threshold)
    latency_change = None
    if case.accepted_latency_ms is not None:
        latency_change = _interval(kernel, math.log(case.accepted_latency_ms), settings.confidence)
    reason = None
    if verdict is Verdict.INCONCLUSIVE:
        reason = _reason(set_aside, len(rounds), settings.trouble_share)
    elif verdict is Verdict.PASS and latency_change is not None and latency_change.low > 1.0 + case.threshold:
        verdict, reason = Verdict.INCONCLUSIVE, Inconclusive.LATENCY_DRIFT
    return CaseVerdict(verdict=verdict, reason=reason, change=change,
                       ratio=_interval(ratios, 0.0, settings.confidence),
                       latency_ms=math.exp(statistics.median(kernel)), latency_change=latency_change,
                       message=_message(verdict, reason, change, case), **common)


def decide_with_repeats(case: CaseInput, correctness: Correctness, next_round: Callable[[], TimingRound],
                        settings: VerdictSettings | None = None) -> CaseVerdict:
    """Take `min_rounds` rounds, then `step_rounds` more at a time while the verdict is inconclusive,
    never more than `max_rounds` in all. An incorrect kernel is not timed."""
    settings = settings or VerdictSettings()
    rounds: list[TimingRound] = []
    if not correctness.correct:
        return decide(case, rounds, correctness, settings)
    target = min(settings.min_rounds, settings.max_rounds)
    while True:
        while len(rounds) < target:
            rounds.append(next_round())
        verdict = decide(case, rounds, correctness, settings)
        if verdict.verdict is not Verdict.INCONCLUSIVE or len(rounds) >= settings.max_rounds:
            return verdict
        target = min(len(rounds) + settings.step_rounds, settings.max_rounds)


def exit_status(verdicts: Sequence[CaseVerdict]) -> int:
    """0 all pass (or improved), 1 any regressed or incorrect, 4 any left inconclusive after the bound.
    (2, a store that does not verify, and 3, no GPU, are decided before any verdict.)"""
    kinds = {v.verdict for v in verdicts}
    if kinds & {Verdict.REGRESSED, Verdict.INCORRECT}:
        return 1
    if Verdict.INCONCLUSIVE in kinds:
        return 4
    return 0
