"""A submission made into a queued run, shared by the form (service/pages.py) and the API's twin of it,
`POST /api/submissions`: the task prepared and linted off the event loop (service/intake.py), then the run created,
queued and its agent token issued (service/core.py), so a refused task never reaches the queue."""

from __future__ import annotations

import base64
import binascii
import secrets
import shutil

import anyio
from pydantic import BaseModel, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from harness.task_model import TaskError
from server.run import RunError
from service.api import view
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


async def submit(service: Service, caller: Principal, submission: Submission) -> Submitted:
    """Prepare and lint the task, then create the run, queued; IntakeRefused with the causes to show."""
    work = service.settings.root / "intake" / secrets.token_hex(8)
    try:
        prepared = await anyio.to_thread.run_sync(prepare_task, submission, work)
        try:
            record, token = service.create_run(prepared.folder, caller.owner, submission.max_attempts,
                                               submission.note)
        except LimitReached as exc:
            raise IntakeRefused("the team's limit refuses a new run", [str(exc)]) from None
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
        return JSONResponse({"error": refused.summary, "causes": refused.causes}, status_code=422)
    body = made.model_dump(mode="json") | {"view": view(service, made.run).model_dump(mode="json")}
    return JSONResponse(body, status_code=201)


ROUTES = [Route("/api/submissions", api_submit, methods=["POST"])]
