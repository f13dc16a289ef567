"""The web UI's session: a token pasted once into the login form, kept in an HttpOnly, SameSite=Strict cookie (Secure
where the page is served over TLS), and a CSRF token every form carries.

The CSRF token is a double submit: a random value in its own cookie and the same value in each form's hidden field,
compared in constant time. SameSite=Strict and the gate's Origin check (service/guards.py) already stop another
site's form; the token is the fence that does not depend on the browser honouring either.
"""

from __future__ import annotations

import hmac
import secrets

from starlette.requests import Request
from starlette.responses import Response

from service.auth import Principal, bearer
from service.core import Service
from service.guards import Refused, who
from service.records import Role

SESSION_COOKIE = "kr_session"
CSRF_COOKIE = "kr_csrf"
CSRF_FIELD = "csrf_token"
SESSION_MAX_AGE_S = 12 * 3600


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


def set_cookie(response: Response, request: Request, name: str, value: str, max_age: int | None = None) -> None:
    response.set_cookie(name, value, max_age=max_age, path="/", httponly=True, samesite="strict",
                        secure=_secure(request))


def csrf_token(request: Request) -> str:
    """The request's CSRF value (its cookie's), or a new one that `remember_csrf` puts in the answer's cookie."""
    current = request.cookies.get(CSRF_COOKIE, "")
    if len(current) < 32:
        current = request.state.new_csrf = getattr(request.state, "new_csrf", None) or secrets.token_urlsafe(32)
    return current


def remember_csrf(response: Response, request: Request) -> Response:
    new = getattr(request.state, "new_csrf", None)
    if new is not None:
        set_cookie(response, request, CSRF_COOKIE, new)
    return response


async def check_csrf(request: Request) -> dict:
    """The form's fields, once its CSRF token matches the cookie's; 403 otherwise."""
    form = await request.form()
    sent, kept = str(form.get(CSRF_FIELD, "")), request.cookies.get(CSRF_COOKIE, "")
    if not kept or not hmac.compare_digest(sent.encode(), kept.encode()):
        raise Refused(403, "the form's CSRF token is missing or stale: reload the page and submit again")
    return form


def viewer(request: Request, service: Service, *roles: Role) -> Principal:
    """The caller from a bearer header where one is sent (as the API takes it), else the session cookie; 401 or 403
    as `who` answers."""
    token = request.cookies.get(SESSION_COOKIE, "")
    if token and not bearer(request):
        caller = service.tokens.lookup(token)
        if caller is not None and (not roles or caller.role in roles):
            return caller
        if caller is not None:
            raise Refused(403, f"this needs the {' or '.join(r.value for r in roles)} role")
    return who(request, service, *roles)


def signed_in(request: Request, service: Service) -> Principal | None:
    try:
        return viewer(request, service)
    except Refused:
        return None
