"""MCP log messages: the progress lines of a call, also sent as `notifications/message` to a client that asked.

Two eras of the protocol ask differently. Up to 2025-11-25 a client sends `logging/setLevel` once, and the server
filters (MCPServer has no handler for it: one is registered here). From 2026-07-28 each request carries its own
level in `_meta`. The SDK marks the whole logging capability deprecated (SEP-2577), but clients
in use today (the TypeScript SDK, the Inspector) still speak the first era.
"""

from __future__ import annotations

import logging
import warnings
import weakref
from typing import Any, get_args

from mcp.server.connection import allowed_log_levels
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp.types import EmptyResult, LoggingLevel, SetLevelRequestParams
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

log = logging.getLogger(__name__)
LOGGER_NAME = "kernel-referee"
_LEVELS: tuple[str, ...] = get_args(LoggingLevel)  # least severe first


class ClientLog:
    """The level each client session set with `logging/setLevel` (none set: nothing is sent on that session).

    Per session: over HTTP several clients share one server, and one's level must not change what another gets.
    Held weakly, so a session that ended takes its level with it."""

    def __init__(self) -> None:
        self._levels: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()

    def level(self, session: Any) -> str | None:
        return self._levels.get(_connection(session))

    def install(self, server: MCPServer) -> None:
        # MCPServer exposes no setLevel hook; the low-level server's add_request_handler is the SDK's stated way
        # to serve it (mcp/server/extension.py, MethodBinding).
        server._lowlevel_server.add_request_handler("logging/setLevel", SetLevelRequestParams, self._set_level)

    async def _set_level(self, ctx: Any, params: SetLevelRequestParams) -> EmptyResult:
        self._levels[_connection(ctx.session)] = params.level
        return EmptyResult()

    def wants(self, ctx: Context, level: str) -> bool:
        if ctx.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS:
            chosen = self.level(ctx.session)
            return chosen is not None and _LEVELS.index(level) >= _LEVELS.index(chosen)
        # 2026-07-28 and later: the request's own level in _meta, read as the SDK reads it
        return level in allowed_log_levels(ctx.protocol_version, ctx.request_context.meta)

    async def send(self, ctx: Context, message: str, level: str = "info") -> None:
        """Best effort, like progress: a client that went away must not fail the call."""
        if not self.wants(ctx, level):
            return
        # The SDK warns (a UserWarning, printed on stderr) at every use of the deprecated capability; it is used
        # here on purpose, for the clients that ask. Set at each use (the same filter is not added twice): a
        # filter set once would not outlast a warnings.catch_warnings block around the server's construction.
        warnings.filterwarnings("ignore", message="The logging capability is deprecated",
                                category=MCPDeprecationWarning, module=__name__)
        try:  # what ctx.log does, called here so that the SDK's deprecation warning names this module
            await ctx.session.send_log_message(level=level, data=message, logger=LOGGER_NAME,
                                               related_request_id=ctx.request_id)
        except Exception:  # noqa: BLE001 - informative only
            log.debug("log message not delivered", exc_info=True)


def _connection(session: Any) -> Any:
    """The client's connection behind a request's session. The SDK makes a ServerSession per request (runner.py
    `_make_context`) over one Connection per client, and exposes that Connection on no public name."""
    return session._connection  # noqa: SLF001
