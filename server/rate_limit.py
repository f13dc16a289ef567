"""Compiles per minute: a sliding window over a clock the tests can replace, refilled from the audit log when a
run resumes (a restart must not hand out a fresh minute's worth)."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from datetime import datetime, timezone


class RateLimited(Exception):
    """Over the limit; `wait_s` until the oldest counted event leaves the window."""

    def __init__(self, wait_s: float):
        # Whole seconds, rounded up: a wait under a second reads "1 s", never "0 s".
        super().__init__(f"try again in {max(1, math.ceil(wait_s))} s")
        self.wait_s = wait_s


class SlidingWindow:
    """At most `limit` events in any `window_s` seconds of `clock`."""

    def __init__(self, limit: int, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.limit, self.window_s, self.clock = limit, window_s, clock
        self._times: deque[float] = deque()

    def charge(self) -> None:
        """Count one event now, or raise RateLimited without counting it."""
        now = self.clock()
        while self._times and now - self._times[0] > self.window_s:
            self._times.popleft()
        if len(self._times) >= self.limit:
            raise RateLimited(self.window_s - (now - self._times[0]))
        self._times.append(now)

    def restore(self, ages_s: Iterable[float]) -> None:
        """Count events that happened `age_s` seconds ago, before this window existed (a resumed run's, from its
        log); those older than the window are gone already. An age below zero (the log's clock ahead of this
        one) counts as now: the limit errs toward refusing."""
        now = self.clock()
        kept = sorted(max(0.0, age) for age in ages_s if age <= self.window_s)
        self._times.extend(now - age for age in reversed(kept))


def ages_s(times: Iterable[str], now: datetime | None = None) -> list[float]:
    """Seconds from each ISO 8601 time (the audit log's `time`; None is passed over) to `now` (default: the wall
    clock)."""
    now = now or datetime.now(timezone.utc)
    return [(now - datetime.fromisoformat(moment)).total_seconds() for moment in times if moment]
