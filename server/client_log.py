"""MCP log messages: the progress lines of a call, also sent as `notifications/message` to a client that asked.

Two eras of the protocol ask differently. Up to 2025-11-25 a client sends `logging/setLevel` once, and the server
filters (MCPServer has no handler for it: one is registered here). From 2026-07-28 each request carries its own
level in `_meta`. The SDK marks the whole logging capability deprecated (SEP-2577), but clients
in use today (the TypeScript SDK, the Inspector) still speak the first era.
"""

from __future__ import annotations

import logging
import warnings
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
    """The level the client set with `logging/setLevel` (None: none set, nothing is sent on such a connection)."""

    def __init__(self) -> None:
        self.level: str | None = None

    def install(self, server: MCPServer) -> None:
        # MCPServer exposes no setLevel hook; the low-level server's add_request_handler is the SDK's stated way
        # to serve it (mcp/server/extension.py, MethodBinding).
        server._lowlevel_server.add_request_handler("logging/setLevel", SetLevelRequestParams, self._set_level)

    async def _set_level(self, _ctx: Any, params: SetLevelRequestParams) -> EmptyResult:
        self.level = params.level
        return EmptyResult()

    def wants(self, ctx: Context, level: str) -> bool:
        if ctx.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS:
            return self.level is not None and _LEVELS.index(level) >= _LEVELS.index(self.level)
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
