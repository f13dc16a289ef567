"""A submission made into a queued run, shared by the form (service/pages.py), the API's twin of it,
`POST /api/submissions`, and the admin's `POST /api/runs {task_dir}`: the task prepared and linted off the event loop
(service/intake.py), then the run created, queued and its agent token issued (service/core.py), so a refused task
never reaches the queue.

`POST /api/runs` names a folder on the service's disk, so it is the admin's alone (a reviewer naming a path could read
any folder the service can, another team's `ROOT/runs/ID/task` among them), and a folder under ROOT is refused even
to the admin: what is there is the service's own (runs, intake), not a task to submit. The folder is copied as an
archive is unpacked (no links, no special files, the same limits) and linted as a submission is."""

from __future__ import annotations

import base64
import binascii
import secrets
import shutil
from pathlib import Path

import anyio
from pydantic import BaseModel, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from harness.task_model import TaskError
from server.run import RunError
from service.api import CreatedRun, NewRun, read_body, view
from service.auth import Principal
from service.core import LimitReached, Service
from service.guards import Refused, who
from service.intake import Connection, IntakeRefused, NewTaskFields, Submission, connection, prepare_task
from service.records import Role, RunRecord

MAX_ARCHIVE_BYTES = 16 << 20   # what an upload may weigh; unpacked, service/archive.py's limits hold
MAX_API_BODY_BYTES = MAX_ARCHIVE_BYTES * 4 // 3 + (1 << 20)   # base64 of the archive, or the fields


class Submitted(BaseModel):
    run: RunRecord
    connection: Connection
    lint_warnings: list[str]


async def submit(service: Service, caller: Principal, submission: Submission, team: str | None = None,
                 limited: bool = True) -> Submitted:
    """Prepare and lint the task, then create the run for `team` (the caller's by default), queued; IntakeRefused
    with the causes to show. `limited`: the team's limits apply."""
    work = service.settings.intake_dir / secrets.token_hex(8)
    try:
        if limited:  # before lint's compiles; checked again as the run is made
            service.check_limits(team or caller.owner, submission.max_attempts)
        prepared = await anyio.to_thread.run_sync(prepare_task, submission, work)
        record, token = service.create_run(prepared.folder, team or caller.owner, submission.max_attempts,
                                           submission.note, limited=limited)
    except LimitReached as exc:
        raise IntakeRefused("the team's limit refuses a new run", [str(exc)], status=429) from None
    except (TaskError, RunError) as exc:
        raise IntakeRefused("the task cannot be run", [str(exc)]) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Submitted(run=record, connection=connection(record.id, service.settings.mcp_url(record.id), token),
                     lint_warnings=prepared.warnings)


class ApiSubmission(BaseModel):
    archive_base64: str | None = Field(None, description="the task folder as a .tar.gz or .zip, base64")
    fields: NewTaskFields | None = Field(None, description="or new-task's inputs, as text")
    max_attempts: int = Field(7, ge=1, le=100)
    note: str = Field("", max_length=2000)


def _decoded(asked: ApiSubmission) -> Submission:
    try:
        archive = base64.b64decode(asked.archive_base64, validate=True) if asked.archive_base64 else None
    except (binascii.Error, ValueError):
        raise Refused(422, "archive_base64 is not base64") from None
    return Submission(archive=archive, fields=asked.fields, max_attempts=asked.max_attempts, note=asked.note)


async def api_submit(request: Request) -> JSONResponse:
    service: Service = request.app.state.service
    caller = who(request, service, Role.ADMIN, Role.REVIEWER)  # the bearer only: no cookie, so no CSRF to fear
    raw = await request.body()
    if len(raw) > MAX_API_BODY_BYTES:
        raise Refused(413, f"the submission is over {MAX_API_BODY_BYTES} bytes")
    try:
        asked = ApiSubmission.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        raise Refused(422, str(exc.errors(include_url=False, include_context=False))) from None
    try:
        made = await submit(service, caller, _decoded(asked))
    except IntakeRefused as refused:
        return JSONResponse({"error": refused.summary, "causes": refused.causes}, status_code=refused.status)
    body = made.model_dump(mode="json") | {"view": view(service, made.run).model_dump(mode="json")}
    return JSONResponse(body, status_code=201)


async def api_create_run(request: Request) -> JSONResponse:
    """The admin's run of a task folder on the service's disk (none under ROOT), linted as a submission is."""
    service: Service = request.app.state.service
    caller = who(request, service, Role.ADMIN)
    asked = await read_body(request, NewRun)
    task_dir = Path(asked.task_dir)
    if "\0" in asked.task_dir or not task_dir.is_absolute():
        raise Refused(422, "task_dir must be an absolute path to a task folder (with task.toml) on the service's disk")
    root = service.settings.root.resolve()
    if task_dir.resolve().is_relative_to(root):
        raise Refused(422, f"task_dir is under the service's own folder {root}: its runs and intake are not tasks "
                      "to submit")
    submission = Submission(task_dir=task_dir, max_attempts=asked.max_attempts or service.settings.default_max_attempts,
                            note=asked.note)
    try:
        made = await submit(service, caller, submission, team=asked.team, limited=False)
    except IntakeRefused as refused:
        return JSONResponse({"error": refused.summary, "causes": refused.causes}, status_code=refused.status)
    created = CreatedRun(**view(service, made.run).model_dump(), agent_token=made.connection.token,
                         lint_warnings=made.lint_warnings)
    return JSONResponse(created.model_dump(mode="json"), status_code=201)


ROUTES = [
    Route("/api/runs", api_create_run, methods=["POST"]),
    Route("/api/submissions", api_submit, methods=["POST"]),
]
