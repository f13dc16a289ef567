"""Compiles per minute: a sliding window over a clock the tests can replace."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable


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
