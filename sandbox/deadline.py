"""A moment by which something must be over: one tool call's deadline, which every job it sends
to a worker inherits (what is left of it), so that no sequence of jobs can run past it."""

from __future__ import annotations

import math
import time


class Deadline:
    """`seconds` from now on the monotonic clock; None: never."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.at = None if seconds is None else time.monotonic() + seconds

    @classmethod
    def never(cls) -> "Deadline":
        return cls(None)

    def remaining(self) -> float:
        """Seconds left (0 once it has passed; infinite for never)."""
        if self.at is None:
            return math.inf
        return max(0.0, self.at - time.monotonic())

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0.0

    def cap(self, seconds: float) -> float:
        """`seconds`, or what is left of this deadline where that is less."""
        return min(seconds, self.remaining())

    def __repr__(self) -> str:
        return "Deadline(never)" if self.at is None else f"Deadline({self.seconds:g} s, {self.remaining():.3f} s left)"
