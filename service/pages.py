"""The web UI: pages rendered on the server (Jinja2, autoescape on, no script), in the report's style.

Every value on a page passes through Jinja's escaping: task names, notes, lint's lines, reviewers' notes and the
replay's output are written by teams and agents. Forms that change anything are POSTs carrying the CSRF token
(service/web_session.py); reading a page never changes a run. The pages answer a refusal as a page, not JSON.
"""

from __future__ import annotations

from functools import wraps
from pathlib import Path

from jinja2 import Environment, FileSystemLoader
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from server.report_html import STYLE
from service.api import view
from service.core import Service
from service.guards import Refused
from service.intake import IntakeRefused, NewTaskFields, Submission
from service.records import Role
from service.submit import MAX_ARCHIVE_BYTES, submit
from service.web_session import (SESSION_COOKIE, SESSION_MAX_AGE_S, check_csrf, csrf_token,
                                 remember_csrf, set_cookie, signed_in, viewer)

TEMPLATES = Path(__file__).parent / "templates"
PAGE_CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; "
            "frame-ancestors 'none'; base-uri 'none'")
_ENV = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, trim_blocks=True, lstrip_blocks=True)
FIELD_NAMES = ("name", "description", "signature", "reference_cu", "initial_cu", "oracle_py", "cases_json")


def render(request: Request, template: str, status: int = 200, **context) -> HTMLResponse:
    service: Service = request.app.state.service
    page = _ENV.get_template(template).render(style=STYLE, csrf=csrf_token(request),
                                              caller=context.pop("caller", signed_in(request, service)), **context)
    response = HTMLResponse(page, status_code=status, headers={
        "Content-Security-Policy": PAGE_CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin",
        "Cache-Control": "no-store"})
    return remember_csrf(response, request)


def page(handler):
    """A page's refusal as a page: 401 sends the browser to sign in, any other status is shown with its reason."""

    @wraps(handler)
    async def answered(request: Request) -> Response:
        try:
            return await handler(request)
        except Refused as refused:
            if refused.status == 401 and request.method == "GET":
                return RedirectResponse("/ui/login", status_code=303)
            return render(request, "base.html", refused.status,
                          refusal={"summary": f"refused ({refused.status})", "causes": [str(refused)]})

    return answered


async def home(_request: Request) -> Response:
    return RedirectResponse("/ui/runs", status_code=303)


@page
async def login_form(request: Request) -> Response:
    return render(request, "login.html")


@page
async def login(request: Request) -> Response:
    form = await check_csrf(request)
    token = str(form.get("token", "")).strip()
    if request.app.state.service.tokens.lookup(token) is None:
        return render(request, "login.html", 401, refusal={"summary": "sign-in refused",
                                                            "causes": ["that token is not one this service issued"]})
    response = RedirectResponse("/ui/runs", status_code=303)
    set_cookie(response, request, SESSION_COOKIE, token, SESSION_MAX_AGE_S)
    return response


@page
async def logout(request: Request) -> Response:
    await check_csrf(request)
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response


@page
async def runs(request: Request) -> Response:
    service: Service = request.app.state.service
    caller = viewer(request, service)
    views = [view(service, r) for r in service.registry.all() if caller.may_read(r.team, r.id)]
    return render(request, "runs.html", runs=views, caller=caller)


@page
async def submit_form(request: Request) -> Response:
    viewer(request, request.app.state.service, Role.ADMIN, Role.REVIEWER)
    return render(request, "submit.html", form={}, default_attempts=request.app.state.service.settings
                  .default_max_attempts)


async def _submission(form) -> Submission:
    upload = form.get("archive")
    archive = None
    if isinstance(upload, UploadFile) and upload.filename:
        archive = await upload.read(MAX_ARCHIVE_BYTES + 1)
        if len(archive) > MAX_ARCHIVE_BYTES:
            raise IntakeRefused("the archive is refused", [f"it is over {MAX_ARCHIVE_BYTES} bytes"])
    typed = {name: str(form.get(name) or "").strip() for name in FIELD_NAMES}
    fields = None
    if archive is None and any(typed.values()):
        try:
            fields = NewTaskFields(**{k: v or None for k, v in typed.items()})
        except ValueError as exc:
            raise IntakeRefused("new-task's fields are incomplete", [str(exc).splitlines()[0]] + [
                line.strip() for line in str(exc).splitlines()[1:] if line and not line.startswith(" ")]) from None
    try:
        attempts = int(str(form.get("max_attempts") or 0))
        return Submission(archive=archive, fields=fields, max_attempts=attempts, note=str(form.get("note") or ""))
    except ValueError:
        raise IntakeRefused("the budget is refused", ["attempts must be a whole number from 1 to 100"]) from None


@page
async def submit_task(request: Request) -> Response:
    service: Service = request.app.state.service
    caller = viewer(request, service, Role.ADMIN, Role.REVIEWER)
    form = await check_csrf(request)
    kept = {name: str(form.get(name) or "") for name in (*FIELD_NAMES, "note", "max_attempts")}
    try:
        made = await submit(service, caller, await _submission(form))
    except IntakeRefused as refused:
        return render(request, "submit.html", refused.status, refusal=refused, form=kept,
                      default_attempts=service.settings.default_max_attempts)
    return render(request, "created.html", 201, run=made.run, connection=made.connection,
                  warnings=made.lint_warnings, caller=caller)


ROUTES = [
    Route("/", home, methods=["GET"]),
    Route("/ui/login", login_form, methods=["GET"]),
    Route("/ui/login", login, methods=["POST"]),
    Route("/ui/logout", logout, methods=["POST"]),
    Route("/ui/runs", runs, methods=["GET"]),
    Route("/ui/submit", submit_form, methods=["GET"]),
    Route("/ui/submit", submit_task, methods=["POST"]),
]
