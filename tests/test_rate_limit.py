"""The compile rate limit's sliding window, on a clock the test moves, and refilled from the log on resume."""

from datetime import datetime, timezone

import anyio
import pytest

from server.lifecycle import resume_run
from server.rate_limit import RateLimited, SlidingWindow, ages_s
from tests.server_support import client, events, executor, kernel, new_run


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


def test_restored_events_fill_the_window_as_if_counted_then():
    clock = Clock()
    window = SlidingWindow(limit=3, window_s=60, clock=clock)
    window.restore([70.0, 50.0, 10.0, -2.0])  # 70 s ago has left; a time ahead of the clock counts as now
    with pytest.raises(RateLimited) as limited:
        window.charge()
    assert limited.value.wait_s == pytest.approx(10)  # the one 50 s ago leaves first
    clock.now += 10.5
    window.charge()


def test_ages_are_seconds_from_the_logs_times():
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    assert ages_s(["2026-01-02T03:03:05.500000+00:00", "2026-01-02T03:04:05+00:00"], now) == [59.5, 0.0]


def test_a_restarted_server_counts_the_last_minutes_compiles_from_the_log(tmp_path):
    async def compile_until_refused(run, sources) -> list[str]:
        async with client(run) as c:
            return [(await c.call_tool("compile_kernel", {"source": s})).content[0].text for s in sources]

    run = new_run(tmp_path, compiles_per_minute=3)
    answers = anyio.run(compile_until_refused, run, [kernel("v1"), kernel("v2")], backend="asyncio")
    assert not any(a.startswith("Error") for a in answers)
    run.close()
    resumed = resume_run(run.dir, executor())  # a new process: a fresh window but for the log
    try:
        third, fourth = anyio.run(compile_until_refused, resumed, [kernel("v3"), kernel("v4")], backend="asyncio")
    finally:
        resumed.close()
    assert not third.startswith("Error"), third
    assert "compile rate limit: 3 compiles per minute; try again in " in fourth, fourth
    assert [e["kind"] for e in events(run.dir)].count("compile_charged") == 3
