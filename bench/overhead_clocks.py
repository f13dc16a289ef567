"""Where the time of a benchmark's calls goes: the GPU busy time the workers report, and the wall time of
an executor's methods (bench/timing.py's overhead measurement)."""

from __future__ import annotations

import contextlib
import time

from sandbox.pool import Worker


@contextlib.contextmanager
def gpu_busy_counted():
    """Adds up the GPU busy time every worker answer reports while the block runs."""
    measured = {"jobs": 0, "unclocked": 0, "ms": 0.0, "each": []}
    call = Worker.call

    def counted(self, header, blobs, *args, **kwargs):
        started = time.perf_counter()
        answer, back = call(self, header, blobs, *args, **kwargs)
        if header.get("op") not in ("run", "time", "vendor_time", "draw_run"):
            return answer, back  # a compile worker's job: no GPU there
        measured["jobs"] += 1
        measured["each"].append({"op": header.get("op"), "wall_s": round(time.perf_counter() - started, 4),
                                 "gpu_busy_ms": answer.get("gpu_busy_ms"), "phases_s": answer.get("phases_s"),
                                 "sent_bytes": sum(len(b) for b in blobs), "back_bytes": sum(len(b) for b in back)})
        if answer.get("gpu_busy_ms") is None:
            measured["unclocked"] += 1
        else:
            measured["ms"] += answer["gpu_busy_ms"]
        return answer, back

    Worker.call = counted
    try:
        yield measured
    finally:
        Worker.call = call


class WallClock:
    def __init__(self):
        self.calls, self.seconds = 0, 0.0

    def summary(self) -> dict:
        return {"calls": self.calls, "wall_s": round(self.seconds, 3)}


def wall_clocked(executor, name: str) -> WallClock:
    """Replace executor.<name> by a wrapper that adds up its calls' wall time: where record_attempt's time goes."""
    clock, inner = WallClock(), getattr(executor, name)

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            clock.calls += 1
            clock.seconds += time.perf_counter() - started

    setattr(executor, name, timed)
    return clock
