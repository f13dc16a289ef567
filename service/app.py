"""The service's one ASGI app: the JSON API (service/openapi.py's routes: service/api.py, service/submit.py), one MCP
endpoint per run (/runs/{id}/mcp, the run's own MCP server: service/live.py) and, added by the pages' module, the web
UI. `build_app` is the factory; the command line (service/cli.py) serves it with uvicorn.

Every request is checked for its Host and Origin first; every route then checks its bearer token's principal
(service/guards.py). A run's MCP endpoint takes only that run's agent token: refused here before the run is
opened, and again by the MCP SDK's bearer check against the token's audience."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from contextlib import asynccontextmanager
from typing import AsyncIterator

import anyio
from mcp.shared.auth import ProtectedResourceMetadata
from starlette.applications import Starlette
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

from harness.placement import GpuInfo
from service import openapi
from service.auth import SCOPE, principal
from service.core import Service
from service.guards import Refused, host_and_origin_refusal, refused_response
from service.live import RunGpuBusy, RunNodeGone
from service.live import MakeExecutor
from service.records import Role
from service.registry import RUN_ID, UnknownRun
from service.settings import ServiceSettings

MCP_PATH = re.compile(r"/runs/(?P<run_id>[^/]+)/mcp/?")
METADATA_PATH = re.compile(r"/\.well-known/oauth-protected-resource/runs/(?P<run_id>[^/]+)/mcp")


def build_app(settings: ServiceSettings, make_executor: MakeExecutor, gpus: list[GpuInfo],
              routes: list[BaseRoute] = (), env: Mapping[str, str] = os.environ,
              slots_now: Callable[[], list[GpuInfo]] | None = None) -> Starlette:
    """The service over `settings.root`: runs' GPU work made by `make_executor` on `gpus` (a cluster's: counted again
    through `slots_now`). `routes`: more routes (the pages), behind the same Host/Origin check; they reach the Service
    at `request.app.state.service`."""
    service = Service(settings, make_executor, gpus, env, slots_now)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        async with anyio.create_task_group() as group:
            service.task_group = group
            group.start_soon(service.schedule_forever)
            try:
                yield
            finally:
                await service.close()
                group.cancel_scope.cancel()

    app = Starlette(routes=[*openapi.ROUTES, *routes], lifespan=lifespan,
                    middleware=[Middleware(ServiceGate, service=service)],
                    exception_handlers={Refused: lambda _request, exc: refused_response(exc)})
    app.state.service = service
    return app


class ServiceGate:
    """Host and Origin for every request; then a run's MCP endpoint (and its RFC 9728 metadata) or the rest."""

    def __init__(self, app: ASGIApp, service: Service):
        self.inner, self.service = app, service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        connection = HTTPConnection(scope)
        refusal = host_and_origin_refusal(connection, self.service)
        path = scope["path"]
        metadata, endpoint = METADATA_PATH.fullmatch(path), MCP_PATH.fullmatch(path)
        try:
            if refusal is not None:
                raise refusal
            if metadata is not None:
                await self._metadata(metadata["run_id"])(scope, receive, send)
            elif endpoint is not None:
                await self._mcp(connection, endpoint["run_id"], scope, receive, send)
            else:
                await self.inner(scope, receive, send)
        except Refused as exc:
            await refused_response(exc)(scope, receive, send)

    def _metadata(self, run_id: str) -> JSONResponse:
        self._known(run_id)
        settings = self.service.settings
        document = ProtectedResourceMetadata(resource=settings.mcp_url(run_id),
                                             authorization_servers=[settings.base_url], scopes_supported=[SCOPE])
        return JSONResponse(document.model_dump(mode="json", exclude_none=True))

    async def _mcp(self, connection: HTTPConnection, run_id: str, scope: Scope, receive: Receive, send: Send) -> None:
        caller = principal(connection, self.service.tokens)
        if caller is None or caller.role is not Role.AGENT or caller.run_id != run_id:
            # As the SDK answers: 401 naming where the resource's metadata is (RFC 9728).
            metadata = f"{self.service.settings.base_url}/.well-known/oauth-protected-resource/runs/{run_id}/mcp"
            response = JSONResponse({"error": "invalid_token", "error_description": "this run's agent token is "
                                     "required"}, status_code=401, headers={"WWW-Authenticate": (
                                         f'Bearer error="invalid_token", resource_metadata="{metadata}"')})
            await response(scope, receive, send)
            return
        self._known(run_id)
        waiting = self.service.registry.get(run_id).waiting
        if waiting is not None and run_id not in self.service.live:  # the scheduler tries it again, not each call
            raise Refused(503, f"the run is not served now: {waiting}")
        try:
            live = await self.service.live_run(run_id)
        except (RunGpuBusy, RunNodeGone) as exc:  # a run on Ray that cannot resume where it began (yet)
            raise Refused(503, f"the run is not served now: {exc}") from None
        await live.app({**scope, "path": "/mcp", "raw_path": b"/mcp"}, receive, send)

    def _known(self, run_id: str) -> None:
        try:
            if not RUN_ID.fullmatch(run_id):
                raise UnknownRun(run_id)
            self.service.registry.get(run_id)
        except UnknownRun:
            raise Refused(404, f"no run {run_id!r}") from None
