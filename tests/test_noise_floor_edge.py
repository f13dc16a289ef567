"""The noise floor at its edge, on both sides (harness/stats.py): an interval just inside 1 +- NOISE_FLOOR is
within noise, one just past it is beyond; a floor dropped to 1.0 on either side fails here."""

from __future__ import annotations

import pytest

from harness.stats import FASTER_BEYOND_NOISE, NOISE_FLOOR, SLOWER_BEYOND_NOISE, WITHIN_NOISE, significance, speedup
from tests.test_stats import stats_around

FASTER_EDGE = 1.0 + NOISE_FLOOR
SLOWER_EDGE = 1.0 / (1.0 + NOISE_FLOOR)


def test_the_floor_is_half_a_percent():
    assert NOISE_FLOOR == 0.005 and SLOWER_EDGE == pytest.approx(0.995025, abs=1e-6)


@pytest.mark.parametrize("low, high, words", [
    (1.001, 1.10, WITHIN_NOISE),                    # above 1, below the floor: not faster
    (FASTER_EDGE - 1e-9, 1.10, WITHIN_NOISE),
    (FASTER_EDGE, 1.10, WITHIN_NOISE),              # on the floor: not past it
    (FASTER_EDGE + 1e-6, 1.10, FASTER_BEYOND_NOISE),
])
def test_the_faster_side_s_floor(low, high, words):
    assert significance(low, high) == words


@pytest.mark.parametrize("low, high, words", [
    (0.90, 0.999, WITHIN_NOISE),                    # below 1, above the floor: not slower
    (0.90, SLOWER_EDGE + 1e-9, WITHIN_NOISE),
    (0.90, SLOWER_EDGE, WITHIN_NOISE),              # on the floor: not past it
    (0.90, SLOWER_EDGE - 1e-6, SLOWER_BEYOND_NOISE),
])
def test_the_slower_side_s_floor(low, high, words):
    assert significance(low, high) == words


def test_a_speedup_whose_conservative_end_is_just_under_the_floor_is_not_beyond_noise():
    # The baseline's interval [1.0062, 1.0068] against the candidate's [0.9995, 1.0005]: disjoint, the ratio
    # 1.0065, the conservative end 1.0062 / 1.0005 = 1.0057, past the floor; a little closer, 1.0045: not.
    past = speedup(stats_around(1.0065, 0.0003), stats_around(1.0, 0.0005))
    assert past.low > FASTER_EDGE and past.beyond_noise is True
    short = speedup(stats_around(1.0053, 0.0003), stats_around(1.0, 0.0005))
    assert 1.0 < short.low < FASTER_EDGE and short.beyond_noise is False
    assert significance(short.low, short.high, short.beyond_noise) == WITHIN_NOISE

