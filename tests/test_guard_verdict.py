"""The guard's verdict rule on synthetic rounds: no GPU."""

from __future__ import annotations

import random

import pytest

from guard.intervals import shift_interval, walsh_depth
from guard.verdict import (CaseInput, Correctness, Inconclusive, TimingRound, Verdict, VerdictSettings, decide,
                           decide_with_repeats, exit_status)
from harness.nvml import GpuState, GpuWatch

CORRECT = Correctness(correct=True)


def case(**extra) -> CaseInput:
    return CaseInput(**{"approval": "demo", "case": "bench-1", "accepted_ratio": 0.5, **extra})


def rounds(n: int, slower: float = 1.0, spread: float = 0.004, seed: int = 1, kernel_ms: float = 0.05,
           watch: GpuWatch | None = None) -> list[TimingRound]:
    """Rounds whose kernel runs at `slower` times its accepted ratio (0.5) to a baseline of 0.1 ms."""
    rng = random.Random(seed)

    def launches(ms: float) -> list[float]:
        shift = rng.gauss(1.0, spread)
        return [ms * shift * rng.gauss(1.0, 0.01) for _ in range(30)]

    return [TimingRound(candidate_ms=launches(kernel_ms * slower), baseline_ms=launches(2 * kernel_ms), watch=watch)
            for _ in range(n)]


def watch(**after) -> GpuWatch:
    state = GpuState(sm_clock_mhz=1980, max_sm_clock_mhz=1980)
    return GpuWatch(before=state, after=state.model_copy(update=after),
                    other_processes=after.pop("others", []) if "others" in after else [])


def test_signed_rank_depths_match_the_published_table():
    # Wilcoxon critical values, two-sided 1%: n=8 -> 0, n=16 -> 19, n=20 -> 37 (depth is one more).
    assert walsh_depth(7, 0.99) is None
    assert walsh_depth(8, 0.99)[0] == 1
    assert walsh_depth(16, 0.99)[0] == 20
    assert walsh_depth(20, 0.99)[0] == 38
    depth, coverage = walsh_depth(20, 0.95)
    assert depth == 53 and coverage >= 0.95


def test_shift_interval_brackets_the_centre_and_resists_a_wild_value():
    values = [0.01 * i for i in range(-10, 11)]
    shift = shift_interval(values, 0.95)
    assert shift.low < 0.0 < shift.high and shift.estimate == pytest.approx(0.0)
    # One wild round in 21 gives 21 wild Walsh averages, fewer than the interval's depth (59): it stays put.
    wild = shift_interval(values[:-1] + [100.0], 0.95)
    assert wild.estimate < 0.02 and wild.high < 0.1


def test_unchanged_kernel_passes_with_an_interval_around_one():
    verdict = decide(case(), rounds(8), CORRECT)
    assert verdict.verdict is Verdict.PASS
    assert verdict.change.low < 1.0 < verdict.change.high <= 1.015
    assert verdict.ratio.estimate == pytest.approx(0.5, rel=0.01)
    assert verdict.rounds == verdict.rounds_kept == 8


def test_slower_beyond_the_threshold_is_regressed_and_names_the_change():
    verdict = decide(case(environment_changes=["driver 560.1 -> 570.2"]), rounds(8, slower=1.05), CORRECT)
    assert verdict.verdict is Verdict.REGRESSED
    assert verdict.change.low > 1.015
    assert "+5." in verdict.message and "driver 560.1 -> 570.2" in verdict.message


def test_slower_within_the_threshold_passes():
    assert decide(case(), rounds(12, slower=1.005, spread=0.001), CORRECT).verdict is Verdict.PASS


def test_faster_beyond_the_threshold_is_improved():
    assert decide(case(), rounds(8, slower=0.9), CORRECT).verdict is Verdict.IMPROVED


def test_a_change_at_the_threshold_is_inconclusive_for_noise():
    verdict = decide(case(), rounds(8, slower=1.015, spread=0.01), CORRECT)
    assert verdict.verdict is Verdict.INCONCLUSIVE and verdict.reason is Inconclusive.NOISE
    assert verdict.change.low <= 1.015 < verdict.change.high


def test_too_few_rounds_is_inconclusive_without_an_interval():
    verdict = decide(case(), rounds(7), CORRECT)
    assert verdict.verdict is Verdict.INCONCLUSIVE and verdict.change is None


def test_an_incorrect_kernel_is_incorrect_whatever_its_timing():
    wrong = Correctness(correct=False, reasons=["wrong_output"], detail="case 3: 1 of 1048576 elements")
    verdict = decide(case(), rounds(8, slower=0.5), wrong)
    assert verdict.verdict is Verdict.INCORRECT and verdict.correctness == ["wrong_output"]
    assert "wrong_output" in verdict.message and "1 of 1048576" in verdict.message


@pytest.mark.parametrize("trouble, reason", [
    ({"others": [4242]}, Inconclusive.OTHER_PROCESS),
    ({"throttle": ["sw_thermal_slowdown"]}, Inconclusive.THROTTLING),
    ({"sm_clock_mhz": 1500}, Inconclusive.CLOCKS_BELOW_APPROVAL),
])
def test_troubled_rounds_are_set_aside_and_named(trouble, reason):
    bad = rounds(8, slower=1.2, watch=watch(**trouble))  # would read as a regression if counted
    verdict = decide(case(approval_sm_clock_mhz=1980), rounds(4) + bad, CORRECT)
    assert verdict.verdict is Verdict.INCONCLUSIVE and verdict.reason is reason
    assert verdict.rounds == 12 and verdict.rounds_kept == 4 and verdict.set_aside == {reason.value: 8}


def test_idle_and_benign_readings_do_not_set_a_round_aside():
    calm = watch(throttle=["gpu_idle"], sm_clock_mhz=345)
    verdict = decide(case(approval_sm_clock_mhz=1980), rounds(8, watch=calm), CORRECT)
    assert verdict.verdict is Verdict.PASS and verdict.set_aside == {}


def test_latency_drift_on_a_matching_environment_is_not_passed():
    # Both kernels 10% slower than accepted: the ratio holds, the latency does not.
    drift = rounds(8, kernel_ms=0.055)
    verdict = decide(case(accepted_latency_ms=0.05), drift, CORRECT)
    assert verdict.verdict is Verdict.INCONCLUSIVE and verdict.reason is Inconclusive.LATENCY_DRIFT
    assert verdict.latency_change.low > 1.05
    assert decide(case(), drift, CORRECT).verdict is Verdict.PASS  # another environment: the ratio decides


def test_repeats_are_added_only_while_inconclusive_up_to_the_bound():
    settings = VerdictSettings(min_rounds=8, step_rounds=4, max_rounds=20)
    calm = iter(rounds(100, seed=2))
    assert decide_with_repeats(case(), CORRECT, lambda: next(calm), settings).rounds == 8
    # A change at the threshold, rounds 3% either side of it by turns: the interval straddles 1.015 for good.
    stuck = iter(TimingRound(candidate_ms=[0.05 * 1.015 * (1.03 if i % 2 else 0.97)], baseline_ms=[0.1])
                 for i in range(100))
    verdict = decide_with_repeats(case(), CORRECT, lambda: next(stuck), settings)
    assert verdict.verdict is Verdict.INCONCLUSIVE and verdict.rounds == 20


def test_repeats_settle_a_noisy_case():
    noisy = iter(rounds(100, slower=1.04, spread=0.03, seed=4))
    settings = VerdictSettings(max_rounds=64)
    verdict = decide_with_repeats(case(), CORRECT, lambda: next(noisy), settings)
    assert verdict.verdict is Verdict.REGRESSED and 8 < verdict.rounds <= 64


def test_an_incorrect_kernel_is_not_timed():
    def never() -> TimingRound:
        raise AssertionError("timed an incorrect kernel")

    verdict = decide_with_repeats(case(), Correctness(correct=False, reasons=["nan_output"]), never)
    assert verdict.verdict is Verdict.INCORRECT and verdict.rounds == 0


def test_exit_status():
    def v(kind: Verdict) -> object:
        return decide(case(), [], Correctness(correct=False)).model_copy(update={"verdict": kind})

    assert exit_status([v(Verdict.PASS), v(Verdict.IMPROVED)]) == 0
    assert exit_status([v(Verdict.PASS), v(Verdict.INCONCLUSIVE)]) == 4
    assert exit_status([v(Verdict.INCONCLUSIVE), v(Verdict.REGRESSED)]) == 1
    assert exit_status([v(Verdict.INCORRECT)]) == 1
    assert exit_status([]) == 0


def test_the_accepted_ratios_own_interval_widens_the_change():
    slower = rounds(8, slower=1.03, spread=0.002)
    sure = decide(case(), slower, CORRECT)
    assert sure.verdict is Verdict.REGRESSED
    # An approval whose own ratio is known to +-2% (at 95%) cannot support a 3% call on 8 rounds.
    loose = case(accepted_low=0.49, accepted_high=0.51, accepted_confidence=0.95)
    widened = decide(loose, slower, CORRECT)
    assert widened.verdict is Verdict.INCONCLUSIVE and widened.reason is Inconclusive.NOISE
    assert widened.change.estimate == pytest.approx(sure.change.estimate)
    assert widened.change.low < 1.015 < sure.change.low and widened.change.high > sure.change.high + 0.01
