"""A run's page (its live state, report, replay, review, cost sheet and the go/no-go rule) and the review's forms.

Who sees a run is the API's rule (service/guards.py `run_for`: an agent its own run, a reviewer its team's, the
admin all; a run one may not see is answered 404). Replaying, approving and rejecting need the reviewer or admin
role; each is logged in the run's audit log by service/review.py. A replay and an approval measure on a GPU of
their own, taken as a queued run takes one (a free GPU's serving claim, held while they run): where every GPU is
busy they are answered 503 with the reason at once, neither queued nor timed beside a run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from server.cost import CostError, CostInputs, cost_sheet, render as render_cost, run_hours
from server.decision import REQUIRED_CHECKS
from server.folder_lock import FolderHeld
from server.replay import MakeExecutor
from server.report_files import REPORT_NAME, write_report_held
from server.report_html import CSP as REPORT_CSP
from service.api import view
from service.core import GpusBusy, Service, _close_run as close_run
from service.guards import Refused
from service.pages import page, render
from service.records import Role, RunRecord, RunState
from service.review import (ReviewRefused, approval_name, approve_run, decision_of, reject_run, replay_for_review,
                            reviews, service_approver)
from service.web_session import check_csrf, viewer

COST_FIELDS = (("engineer_hours", "engineer hours"), ("hourly_rate", "engineer's hourly rate"),
               ("model_cost", "model charges"), ("gpu_hour_cost", "GPU hourly cost"),
               ("invocations_per_month", "kernel invocations per month"),
               ("ms_saved_end_to_end", "ms saved end to end per invocation (measured after integration)"))
REVIEWERS = (Role.ADMIN, Role.REVIEWER)


def _visible(request: Request, service: Service) -> tuple[object, RunRecord]:
    caller = viewer(request, service)
    run_id = request.path_params["run_id"]
    try:
        record = service.registry.get(run_id)
    except KeyError:
        raise Refused(404, f"no run {run_id!r}") from None
    if not caller.may_read(record.team, record.id):
        raise Refused(404, f"no run {run_id!r}")
    return caller, record


def _finished(service: Service, record: RunRecord) -> Path:
    """The finished run's folder; 409 for a run not finished."""
    run_dir = service.registry.run_dir(record.id)
    if run_dir is None or record.state is not RunState.FINISHED:
        raise Refused(409, f"run {record.id} is {record.state.value}: only a finished run is replayed or reviewed")
    return run_dir


async def _finished_dir(service: Service, record: RunRecord) -> Path:
    """The finished run's folder, let go by its live side: a replay and a review hold the folder while they write
    (server/folder_lock.py), and the run's own MCP server holds it while open."""
    run_dir = _finished(service, record)
    live = service.live.pop(record.id, None)
    if live is not None:
        await anyio.to_thread.run_sync(close_run, live)
    return run_dir


def _cost(request: Request, run_dir: Path | None) -> tuple[dict, str | None, str | None]:
    """(the form's values, the sheet, a refusal): the team's inputs from the query, the run's hours from its folder."""
    given = {name: request.query_params[name] for name, _ in COST_FIELDS if request.query_params.get(name)}
    if not given:
        return given, None, None
    try:
        inputs = CostInputs(**{name: float(value) for name, value in given.items()})
    except (ValidationError, ValueError):
        return given, None, "every input of the cost sheet is a number, zero or more"
    if run_dir is None:
        return given, None, "the run has no folder yet: its hours are not known"
    try:
        wall, busy, saved = run_hours(run_dir)
    except CostError as exc:
        return given, None, str(exc)
    return given, render_cost(cost_sheet(inputs, wall, busy, saved)), None


def _replay_decision(run_dir: Path | None) -> str | None:
    document = run_dir / "replay.json" if run_dir is not None else None
    if document is None or not document.is_file():
        return None
    try:
        return str(json.loads(document.read_text()).get("decision"))
    except (OSError, ValueError):
        return "unreadable"


@page
async def run_page(request: Request) -> Response:
    service: Service = request.app.state.service
    caller, record = _visible(request, service)
    run_dir = service.registry.run_dir(record.id)
    given, sheet, cost_error = _cost(request, run_dir)
    logged = reviews(run_dir) if run_dir is not None else []
    return render(request, "run.html", caller=caller, view=view(service, record),
                  has_report=run_dir is not None and record.state is RunState.FINISHED,
                  has_run_dir=run_dir is not None, may_review=caller.role in REVIEWERS,
                  replay=_replay_decision(run_dir), reviews=logged, decision=decision_of(logged),
                  required_checks=REQUIRED_CHECKS, cost_fields=COST_FIELDS, cost_form=given, cost_sheet=sheet,
                  cost_error=cost_error)


@page
async def report(request: Request) -> Response:
    """The referee's own report.html, as written in the run folder, under its own CSP (no script, nothing external)."""
    service: Service = request.app.state.service
    _, record = _visible(request, service)
    if record.state is not RunState.FINISHED:
        raise Refused(404, f"run {record.id} has no report yet ({record.state.value})")
    run_dir = await _finished_dir(service, record)
    path = run_dir / REPORT_NAME
    if not path.is_file():
        try:
            await anyio.to_thread.run_sync(write_report_held, run_dir)
        except FolderHeld as held:
            raise Refused(409, str(held)) from None
    return Response(path.read_bytes(), media_type="text/html; charset=utf-8", headers={
        "Content-Security-Policy": REPORT_CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"})


def _back(record: RunRecord) -> RedirectResponse:
    return RedirectResponse(f"/ui/runs/{record.id}#review", status_code=303)


@contextmanager
def _review_gpu(service: Service, record: RunRecord, what: str) -> Iterator[MakeExecutor]:
    """A GPU for a review action, taken as a run takes one (service/core.py `review_gpu`): the action's executors
    placed on it, its claim let go when the action ends or fails. 503 with the reason where every GPU is busy:
    the action is neither queued nor measured beside a run's timing, and nothing of it is logged."""
    try:
        with service.review_gpu(record.id, what) as gpu:
            yield lambda task, timing: service.make_executor(task, timing, gpu)
    except GpusBusy as busy:
        raise Refused(503, str(busy)) from None


@page
async def replay(request: Request) -> Response:
    service: Service = request.app.state.service
    caller, record = _visible(request, service)
    viewer(request, service, *REVIEWERS)
    await check_csrf(request)
    _finished(service, record)
    with _review_gpu(service, record, "the replay") as make_executor:  # on a GPU no run serves on, or 503
        run_dir = await _finished_dir(service, record)
        try:
            await anyio.to_thread.run_sync(lambda: replay_for_review(run_dir, caller.owner, make_executor))
        except (ReviewRefused, FolderHeld) as exc:
            raise Refused(409, f"the replay was not made: {exc}") from None
    return _back(record)


@page
async def review(request: Request) -> Response:
    service: Service = request.app.state.service
    caller, record = _visible(request, service)
    viewer(request, service, *REVIEWERS)
    form = await check_csrf(request)
    _finished(service, record)
    note, action = str(form.get("note") or "")[:2000], str(form.get("action") or "")
    try:
        if action == "approve":
            # Its replay (where none is recorded) and its accepted ratio's rounds on a GPU no run serves on, or 503.
            with _review_gpu(service, record, "the approval") as make_executor:
                run_dir = await _finished_dir(service, record)
                approver = service_approver(service.settings.root)
                name = approval_name(record.task_name, record.id)
                await anyio.to_thread.run_sync(lambda: approve_run(run_dir, approver, name, caller.owner, note,
                                                                   make_executor))
        elif action == "reject":
            run_dir = await _finished_dir(service, record)
            await anyio.to_thread.run_sync(lambda: reject_run(run_dir, caller.owner, note))
        else:
            raise Refused(422, "the review's action is approve or reject")
    except FolderHeld as held:
        raise Refused(409, str(held)) from None
    return _back(record)


ROUTES = [
    Route("/ui/runs/{run_id}", run_page, methods=["GET"]),
    Route("/ui/runs/{run_id}/report", report, methods=["GET"]),
    Route("/ui/runs/{run_id}/replay", replay, methods=["POST"]),
    Route("/ui/runs/{run_id}/review", review, methods=["POST"]),
]
