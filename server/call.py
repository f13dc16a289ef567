"""One tool call's time and progress: its deadline, counted from its arrival, and the progress
notifications it sends, as MCP clients want them."""

from __future__ import annotations

from typing import Callable

from harness.call_limits import CALL_DEADLINE_S  # noqa: F401 - every tool call's wall-time bound

Progress = Callable[[float, float, str], None]


class CallProgress:
    """A call's progress notifications: each one further than the last (a step given on another total is
    rescaled to the first one's), the last one at the total (`finish`). Without a client that asked for
    progress, nothing is sent."""

    def __init__(self, report: Progress | None):
        self._report = report
        self.total: float | None = None
        self.done: float | None = None

    def __call__(self, done: float, total: float, message: str) -> None:
        if self._report is None or total <= 0:
            return
        if self.total is None:
            self.total = total
        value = min(max(done / total, 0.0), 1.0) * self.total
        if self.done is not None and value <= self.done:
            return
        self.done = value
        self._report(value, self.total, message)

    def finish(self, message: str) -> None:
        """The last notification, at the total, unless none was sent or the total was reached."""
        if self.total is not None and self.done is not None and self.done < self.total:
            self(self.total, self.total, message)


def part(progress: Progress | None, start: float, end: float, total: float) -> Progress | None:
    """A part of the work whose steps come on their own total, reported between `start` and `end` of `total`."""
    if progress is None:
        return None
    return lambda done, of, message: progress(start + (end - start) * (done / of if of else 1.0), total, message)
