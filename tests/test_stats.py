import math

import numpy as np
import pytest

from harness.stats import (
    EXACT_BINOMIAL_MAX_N,
    LatencyStats,
    NOISE_FLOOR,
    Speedup,
    StoppingRule,
    geomean_speedup,
    geometric_mean,
    median_ci,
    median_ci_ranks,
    speedup,
    summarize,
)


def exact_symmetric_coverage(n: int, j: int) -> float:
    """P(X_(j) <= median <= X_(n+1-j)) for a continuous distribution."""
    tail = sum(math.comb(n, i) for i in range(j))
    return (2**n - 2 * tail) / 2**n


def stats_around(median_ms: float, halfwidth_ms: float) -> LatencyStats:
    return LatencyStats(
        n=100, median_ms=median_ms, mean_ms=median_ms, min_ms=median_ms - 2 * halfwidth_ms,
        max_ms=median_ms + 2 * halfwidth_ms, p10_ms=median_ms - halfwidth_ms, p90_ms=median_ms + halfwidth_ms,
        stdev_ms=halfwidth_ms, cv=halfwidth_ms / median_ms, ci_low_ms=median_ms - halfwidth_ms,
        ci_high_ms=median_ms + halfwidth_ms, confidence=0.95,
    )


# --- summarize ---------------------------------------------------------------


def test_constant_samples_have_zero_spread():
    stats = summarize([2.5] * 50)
    assert stats.n == 50
    assert stats.median_ms == stats.mean_ms == stats.min_ms == stats.max_ms == 2.5
    assert stats.p10_ms == stats.p90_ms == 2.5
    assert stats.stdev_ms == 0.0 and stats.cv == 0.0
    assert (stats.ci_low_ms, stats.ci_high_ms) == (2.5, 2.5)


@pytest.mark.parametrize(
    "draw",
    [
        lambda rng: rng.uniform(1.0, 3.0, size=257),
        lambda rng: rng.normal(10.0, 0.5, size=1000),
        lambda rng: rng.lognormal(0.0, 0.3, size=64),
    ],
    ids=["uniform", "normal", "lognormal"],
)
def test_summary_matches_numpy(draw):
    samples = draw(np.random.default_rng(1234))
    stats = summarize(samples.tolist())
    assert stats.n == samples.size
    assert stats.median_ms == pytest.approx(np.median(samples))
    assert stats.mean_ms == pytest.approx(np.mean(samples))
    assert stats.min_ms == samples.min() and stats.max_ms == samples.max()
    assert stats.p10_ms == pytest.approx(np.percentile(samples, 10))
    assert stats.p90_ms == pytest.approx(np.percentile(samples, 90))
    assert stats.stdev_ms == pytest.approx(np.std(samples, ddof=1))
    assert stats.cv == pytest.approx(np.std(samples, ddof=1) / np.mean(samples))
    assert stats.ci_low_ms <= stats.median_ms <= stats.ci_high_ms
    assert stats.confidence == 0.95


def test_summary_does_not_depend_on_sample_order():
    samples = np.random.default_rng(7).exponential(1.0, size=99)
    assert summarize(samples) == summarize(samples[::-1])


def test_single_sample():
    stats = summarize([1.25])
    assert stats.n == 1
    assert stats.stdev_ms == 0.0 and stats.cv == 0.0
    assert (stats.ci_low_ms, stats.ci_high_ms) == (1.25, 1.25)


def test_heavy_outliers_do_not_move_median_or_ci():
    rng = np.random.default_rng(99)
    bulk = rng.normal(1.0, 0.01, size=190)
    samples = np.concatenate([bulk, np.full(10, 1000.0)])
    stats = summarize(samples)
    assert stats.median_ms == pytest.approx(np.median(samples))
    assert 0.98 < stats.median_ms < 1.02
    assert stats.ci_low_ms > 0.98 and stats.ci_high_ms < 1.02
    assert stats.max_ms == 1000.0
    assert stats.mean_ms > 40.0  # the mean is dragged, which is why the median is reported


@pytest.mark.parametrize(
    "bad",
    [[], [1.0, float("nan")], [1.0, -0.5], [1.0, float("inf")], [float("-inf")]],
    ids=["empty", "nan", "negative", "inf", "neg-inf"],
)
def test_summarize_rejects_bad_samples(bad):
    with pytest.raises(ValueError):
        summarize(bad)


@pytest.mark.parametrize("confidence", [0.0, 1.0, -0.1, 1.5])
def test_summarize_rejects_bad_confidence(confidence):
    with pytest.raises(ValueError):
        summarize([1.0, 2.0, 3.0], confidence=confidence)


def test_zero_latency_is_allowed():
    stats = summarize([0.0, 0.0, 0.0])
    assert stats.median_ms == 0.0 and stats.cv == 0.0


def test_latency_stats_is_frozen_and_serializable():
    stats = summarize([1.0, 2.0, 3.0])
    with pytest.raises(Exception):
        stats.n = 4
    assert LatencyStats.model_validate_json(stats.model_dump_json()) == stats


# --- median_ci -----------------------------------------------------------------


@pytest.mark.parametrize("n, ranks", [(6, (1, 6)), (10, (2, 9)), (20, (6, 15)), (100, (40, 61))])
def test_median_ci_ranks_match_textbook_table(n, ranks):
    assert median_ci_ranks(n, 0.95) == ranks


@pytest.mark.parametrize("n", [6, 7, 11, 30, 101, 250, 999, EXACT_BINOMIAL_MAX_N])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_exact_ranks_are_the_narrowest_symmetric_interval_reaching_confidence(n, confidence):
    ranks = median_ci_ranks(n, confidence)
    if ranks is None:
        assert exact_symmetric_coverage(n, 1) < confidence
        return
    j, k = ranks
    assert j + k == n + 1
    assert exact_symmetric_coverage(n, j) >= confidence
    if j + 1 < k - 1:
        assert exact_symmetric_coverage(n, j + 1) < confidence


@pytest.mark.parametrize("n", [EXACT_BINOMIAL_MAX_N + 1, 1500, 4000])
def test_normal_approximation_still_reaches_confidence(n):
    j, k = median_ci_ranks(n, 0.95)
    assert j + k == n + 1
    coverage = exact_symmetric_coverage(n, j)
    assert 0.95 <= coverage < 0.96


def test_exact_and_approximate_ranks_agree_at_the_switch():
    j_exact, _ = median_ci_ranks(EXACT_BINOMIAL_MAX_N, 0.95)
    j_approx, _ = median_ci_ranks(EXACT_BINOMIAL_MAX_N + 1, 0.95)
    assert abs(j_exact - j_approx) <= 1


def test_median_ci_returns_order_statistics():
    sorted_samples = np.arange(1.0, 101.0)  # value == rank
    assert median_ci(sorted_samples) == (40.0, 61.0)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_tiny_samples_fall_back_to_full_range(n):
    sorted_samples = [float(v) for v in range(10, 10 + n)]
    assert median_ci(sorted_samples, 0.95) == (sorted_samples[0], sorted_samples[-1])


def test_median_ci_rejects_empty():
    with pytest.raises(ValueError):
        median_ci([])


def test_median_ci_covers_true_median_about_95_percent():
    rng = np.random.default_rng(2024)
    scale = 3.0
    true_median = scale * math.log(2.0)  # median of an exponential distribution
    draws = np.sort(rng.exponential(scale, size=(2000, 101)), axis=1)
    covered = 0
    for sorted_draw in draws:
        low, high = median_ci(sorted_draw, 0.95)
        covered += low <= true_median <= high
    assert 0.93 <= covered / len(draws) <= 0.985


def test_median_ci_narrows_as_samples_grow():
    stream = np.random.default_rng(5).lognormal(0.0, 0.25, size=3200)
    widths = []
    for n in (25, 50, 100, 200, 400, 800, 1600, 3200):
        low, high = median_ci(np.sort(stream[:n]))
        widths.append(high - low)
    assert all(later < earlier for earlier, later in zip(widths, widths[1:]))


def test_higher_confidence_gives_wider_interval():
    sorted_samples = np.sort(np.random.default_rng(3).normal(5.0, 1.0, size=300))
    low_90, high_90 = median_ci(sorted_samples, 0.90)
    low_99, high_99 = median_ci(sorted_samples, 0.99)
    assert low_99 <= low_90 and high_99 >= high_90
    assert (high_99 - low_99) > (high_90 - low_90)


# --- geometric mean and speedups ---------------------------------------------------


def test_geometric_mean_values():
    assert geometric_mean([1.0, 4.0]) == pytest.approx(2.0)
    assert geometric_mean([3.0]) == pytest.approx(3.0)
    assert geometric_mean([2.0, 8.0, 4.0]) == pytest.approx(4.0)


def test_geometric_mean_does_not_overflow():
    assert geometric_mean([1e300] * 10) == pytest.approx(1e300)
    assert geometric_mean([1e-300] * 10) == pytest.approx(1e-300)


@pytest.mark.parametrize("bad", [[], [1.0, 0.0], [2.0, -1.0]])
def test_geometric_mean_rejects_empty_and_non_positive(bad):
    with pytest.raises(ValueError):
        geometric_mean(bad)


def test_overlapping_intervals_are_not_beyond_noise():
    result = speedup(stats_around(1.00, 0.05), stats_around(0.98, 0.05))
    assert result.ratio == pytest.approx(1.00 / 0.98)
    assert result.ratio > 1.0
    assert result.beyond_noise is False
    assert result.low < 1.0 < result.high


def test_clearly_faster_candidate_is_beyond_noise():
    result = speedup(stats_around(2.0, 0.02), stats_around(1.0, 0.01))
    assert result.ratio == pytest.approx(2.0)
    assert result.low == pytest.approx(1.98 / 1.01)
    assert result.high == pytest.approx(2.02 / 0.99)
    assert result.low <= result.ratio <= result.high
    assert result.beyond_noise is True


def test_slower_candidate_is_never_beyond_noise():
    result = speedup(stats_around(1.0, 0.01), stats_around(2.0, 0.01))
    assert result.ratio == pytest.approx(0.5)
    assert result.high < 1.0
    assert result.beyond_noise is False


def test_speedup_from_summaries_of_real_streams():
    rng = np.random.default_rng(11)
    baseline = summarize(rng.normal(3.0, 0.03, size=200))
    candidate = summarize(rng.normal(2.0, 0.02, size=200))
    result = speedup(baseline, candidate)
    assert result.ratio == pytest.approx(1.5, rel=0.02)
    assert result.beyond_noise


def test_disjoint_intervals_closer_than_the_noise_floor_are_not_beyond_noise():
    # 0.2% apart with intervals of +-0.01%: disjoint, but within what one job differs from the next
    close = speedup(stats_around(1.002, 0.0001), stats_around(1.0, 0.0001))
    assert close.low > 1.0 and close.beyond_noise is False
    # the conservative end must clear the floor, not just the ratio
    edge = speedup(stats_around(1.0 + NOISE_FLOOR + 0.002, 0.001), stats_around(1.0, 0.001))
    assert edge.ratio > 1.0 + NOISE_FLOOR and edge.low < 1.0 + NOISE_FLOOR and edge.beyond_noise is False
    two_percent = speedup(stats_around(1.02, 0.001), stats_around(1.0, 0.001))
    assert two_percent.beyond_noise is True
    assert geomean_speedup([(stats_around(1.02, 0.001), stats_around(1.0, 0.001)),
                            (stats_around(1.002, 0.0001), stats_around(1.0, 0.0001))]).beyond_noise is False


def test_speedup_rejects_zero_candidate_median():
    with pytest.raises(ValueError):
        speedup(stats_around(1.0, 0.1), summarize([0.0, 0.0, 0.0]))


def test_geomean_speedup_aggregates_cases():
    pairs = [
        (stats_around(2.0, 0.01), stats_around(1.0, 0.01)),
        (stats_around(8.0, 0.01), stats_around(1.0, 0.01)),
    ]
    result = geomean_speedup(pairs)
    singles = [speedup(b, c) for b, c in pairs]
    assert isinstance(result, Speedup)
    assert result.ratio == pytest.approx(4.0)
    assert result.low == pytest.approx(math.sqrt(singles[0].low * singles[1].low))
    assert result.high == pytest.approx(math.sqrt(singles[0].high * singles[1].high))
    assert result.beyond_noise is True


def test_geomean_speedup_needs_every_case_beyond_noise():
    pairs = [
        (stats_around(10.0, 0.01), stats_around(1.0, 0.01)),  # huge win
        (stats_around(1.0, 0.05), stats_around(1.0, 0.05)),  # within noise
    ]
    result = geomean_speedup(pairs)
    assert result.ratio > 3.0
    assert result.beyond_noise is False


def test_geomean_speedup_rejects_empty():
    with pytest.raises(ValueError):
        geomean_speedup([])


# --- stopping rule -----------------------------------------------------------------


def feed_until_finished(rule: StoppingRule, stream: np.ndarray) -> int:
    for sample in stream:
        if rule.is_finished():
            break
        rule.add(float(sample))
    return len(rule.samples)


def test_tight_stream_stops_at_min_samples():
    rule = StoppingRule(min_samples=100, max_samples=1000, target_rel_halfwidth=0.005)
    stream = np.random.default_rng(0).normal(1.0, 0.001, size=5000)
    assert feed_until_finished(rule, stream) == 100
    assert rule.is_finished()


def test_noisy_stream_runs_to_max_samples():
    rule = StoppingRule(min_samples=100, max_samples=1000, target_rel_halfwidth=0.005)
    stream = np.random.default_rng(0).lognormal(0.0, 0.5, size=5000)
    assert feed_until_finished(rule, stream) == 1000
    assert rule.is_finished()


def test_moderate_stream_stops_between_min_and_max():
    rule = StoppingRule(min_samples=100, max_samples=5000, target_rel_halfwidth=0.005)
    stream = np.random.default_rng(1).normal(1.0, 0.05, size=10000)
    used = feed_until_finished(rule, stream)
    assert 100 < used < 5000
    low, high = median_ci(sorted(rule.samples))
    assert (high - low) / 2 / np.median(rule.samples) <= 0.005


def test_never_finished_before_min_samples():
    rule = StoppingRule(min_samples=10, max_samples=20)
    for _ in range(9):
        rule.add(1.0)
        assert not rule.is_finished()
    rule.add(1.0)
    assert rule.is_finished()


def test_samples_keep_arrival_order_and_are_a_copy():
    rule = StoppingRule(min_samples=1, max_samples=10)
    for value in (3.0, 1.0, 2.0):
        rule.add(value)
    samples = rule.samples
    samples.append(99.0)
    assert rule.samples == [3.0, 1.0, 2.0]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_stopping_rule_rejects_bad_samples(bad):
    with pytest.raises(ValueError):
        StoppingRule().add(bad)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_samples": 0},
        {"min_samples": 10, "max_samples": 5},
        {"target_rel_halfwidth": 0.0},
        {"confidence": 1.0},
    ],
)
def test_stopping_rule_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        StoppingRule(**kwargs)
