"""`notifications/resources/updated` for the run's files: the server advertises resource subscriptions (the
2026-07-28 `subscriptions/listen`), so a subscribed client hears when history, summary, best, the audit log or
the report changes.

The files are watched, not the calls that write them: the report is written after the call that finished the
run has answered (server/call_gate.py), and every write of the run goes through the folder, so a look at the
folder's files twice a second sees every change, whoever made it.
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator, Callable

import anyio
from mcp.server.subscriptions import ResourceUpdated, SubscriptionBus

POLL_S = 0.5
# Each resource URI and the file it is read from.
WATCHED = {
    "referee://history.json": "history.json",
    "referee://history-compact.json": "history.json",
    "referee://summary.json": "summary.json",
    "referee://best.cu": "best.cu",
    "referee://events.jsonl": "events.jsonl",
    "referee://report.html": "report.html",
}


class ResourceUpdates:
    """Publishes a ResourceUpdated on `bus` for each watched resource whose file changed since the last look."""

    def __init__(self, run_dir: Callable[[], Path], bus: SubscriptionBus, poll_s: float = POLL_S):
        """`run_dir`: the run's folder at each look (a new run's moves into place once prepared)."""
        self.run_dir, self.bus, self.poll_s = run_dir, bus, poll_s
        self._seen = self._look()

    def _look(self) -> dict[str, tuple[int, int, int] | None]:
        state = {}
        folder = self.run_dir()
        for name in set(WATCHED.values()):
            try:
                st = os.stat(folder / name)
                state[name] = (st.st_mtime_ns, st.st_size, st.st_ino)  # an atomic replace changes the inode
            except FileNotFoundError:
                state[name] = None
        return state

    async def publish_changes(self) -> list[str]:
        """The URIs published now: those whose file changed since the last look."""
        now = self._look()
        changed = [uri for uri, name in WATCHED.items() if now[name] != self._seen[name]]
        self._seen = now
        for uri in changed:
            await self.bus.publish(ResourceUpdated(uri=uri))
        return changed

    @asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        """Look every `poll_s` seconds while the server runs."""
        async def loop() -> None:
            while True:
                await anyio.sleep(self.poll_s)
                await self.publish_changes()

        async with anyio.create_task_group() as group:
            group.start_soon(loop)
            try:
                yield
            finally:
                group.cancel_scope.cancel()
