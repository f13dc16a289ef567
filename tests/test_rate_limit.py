"""The compile rate limit's sliding window, on a clock the test moves."""

import pytest

from server.rate_limit import RateLimited, SlidingWindow


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_window_refuses_the_event_over_the_limit_and_says_how_long_to_wait():
    clock = Clock()
    window = SlidingWindow(limit=2, window_s=60, clock=clock)
    window.charge()
    clock.now += 10
    window.charge()
    clock.now += 5
    with pytest.raises(RateLimited) as limited:
        window.charge()
    assert limited.value.wait_s == pytest.approx(45)  # the first event leaves the window at 1060


def test_a_refused_event_is_not_counted_and_the_oldest_leaves_after_the_window():
    clock = Clock()
    window = SlidingWindow(limit=1, window_s=60, clock=clock)
    window.charge()
    for _ in range(3):
        clock.now += 20
        with pytest.raises(RateLimited):
            window.charge()
    clock.now += 0.5  # 60.5 s after the only counted event
    window.charge()
    with pytest.raises(RateLimited):
        window.charge()


@pytest.mark.parametrize("waited_s, says", [(59.7, "try again in 1 s"), (59.99, "try again in 1 s"),
                                            (15.0, "try again in 45 s"), (15.5, "try again in 45 s")])
def test_the_wait_is_told_in_whole_seconds_rounded_up_never_zero(waited_s, says):
    clock = Clock()
    window = SlidingWindow(limit=1, window_s=60, clock=clock)
    window.charge()
    clock.now += waited_s
    with pytest.raises(RateLimited) as limited:
        window.charge()
    assert str(limited.value) == says
