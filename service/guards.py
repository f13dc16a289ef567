"""The checks every route of the service goes through: Host and Origin (as `serve --http` checks them, against DNS
rebinding: server/transport.py `transport_security`), and the bearer token's principal with what it may see."""

from __future__ import annotations

from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse

from server.transport import transport_security
from service.auth import Principal, principal
from service.core import Service
from service.records import Role, RunRecord
from service.registry import UnknownRun


class Refused(Exception):
    """A request refused: its HTTP status and a message a person can act on."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def refused_response(exc: Refused) -> JSONResponse:
    headers = {"WWW-Authenticate": 'Bearer realm="kernel-referee"'} if exc.status == 401 else None
    return JSONResponse({"error": str(exc)}, status_code=exc.status, headers=headers)


def host_and_origin_refusal(connection: HTTPConnection, service: Service) -> Refused | None:
    """A request whose Host is not this service's (421) or whose Origin is another site's (403)."""
    security = transport_security(service.settings.host, service.settings.port)
    if connection.headers.get("host") not in security.allowed_hosts:
        return Refused(421, "this service is not served under that Host name")
    origin = connection.headers.get("origin")
    if origin is not None and origin not in security.allowed_origins:
        return Refused(403, "requests from another site's pages are refused")
    return None


def who(connection: HTTPConnection, service: Service, *roles: Role) -> Principal:
    """The caller, one of `roles` (any role if none is named); 401 without a valid token, 403 for another role."""
    caller = principal(connection, service.tokens)
    if caller is None:
        raise Refused(401, "a valid bearer token is required (Authorization: Bearer TOKEN)")
    if roles and caller.role not in roles:
        raise Refused(403, f"this needs the {' or '.join(r.value for r in roles)} role")
    return caller


def run_for(connection: HTTPConnection, service: Service, run_id: str) -> tuple[Principal, RunRecord]:
    """The run `run_id` as the caller may see it; a run the caller may not see is answered as one that does not
    exist (404), so a token learns nothing of other runs."""
    caller = who(connection, service)
    try:
        record = service.registry.get(run_id)
    except UnknownRun:
        raise Refused(404, f"no run {run_id!r}") from None
    if not caller.may_read(record.team, record.id):
        raise Refused(404, f"no run {run_id!r}")
    return caller, record
