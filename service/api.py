"""The JSON API: runs created from a task folder on the service's disk, listed, and each one's state with its queue
place and budget; reviewer tokens issued by the admin. Its OpenAPI description is built from the same models."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from harness.task_model import TaskError
from server.run import RunError
from server.record_files import read_summary
from service.core import LimitReached, Service
from service.guards import Refused, run_for, who
from service.records import Role, RunRecord, RunState

MAX_BODY_BYTES = 64 * 1024


class NewRun(BaseModel):
    task_dir: str = Field(description="a task folder on the service's disk (task.toml, reference.cu, ...)")
    max_attempts: int | None = Field(None, ge=1, le=100, description="the budget (default: the service's)")
    note: str = Field("", max_length=2000)
    team: str | None = Field(None, max_length=100, description="admin only: the team the run is for")


class NewToken(BaseModel):
    owner: str = Field(min_length=1, max_length=100, description="the reviewer's team")


class RunView(BaseModel):
    run: RunRecord
    queue_position: int = Field(description="1 = next to get a GPU; 0 = not queued")
    queue_length: int
    expected_wait_s: float
    budget: dict | None = Field(None, description="from the run folder: attempts used and left, once it exists")
    mcp_url: str


class CreatedRun(RunView):
    agent_token: str = Field(description="shown this once; only its hash is kept")


class IssuedToken(BaseModel):
    token: str
    role: Role
    owner: str


def view(service: Service, record: RunRecord) -> RunView:
    place = service.place(record.id)
    run_dir = service.registry.run_dir(record.id)
    live = service.live.get(record.id)
    if live is not None and (live.run.preparation is None or live.run.preparation.ready):
        budget = live.run.budget().model_dump()
    else:
        budget = read_summary(run_dir).budget if run_dir is not None and (run_dir / "summary.json").exists() else None
    return RunView(run=record, queue_position=place.position, queue_length=place.length,
                   expected_wait_s=place.expected_wait_s, budget=budget, mcp_url=service.settings.mcp_url(record.id))


async def _body(request: Request, model: type[BaseModel]) -> BaseModel:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise Refused(413, "the request body is too large")
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        raise Refused(422, exc.errors(include_url=False, include_context=False).__repr__()) from None


async def create_run(request: Request) -> JSONResponse:
    service: Service = request.app.state.service
    caller = who(request, service, Role.ADMIN, Role.REVIEWER)
    asked = await _body(request, NewRun)
    team = asked.team if caller.role is Role.ADMIN and asked.team else caller.owner
    task_dir = Path(asked.task_dir)
    if not task_dir.is_absolute() or not (task_dir / "task.toml").is_file():
        raise Refused(422, "task_dir must be an absolute path to a task folder (with task.toml) on the service's disk")
    try:
        record, token = service.create_run(task_dir, team, asked.max_attempts, asked.note,
                                           limited=caller.role is not Role.ADMIN)
    except LimitReached as exc:
        raise Refused(429, str(exc)) from None
    except (TaskError, RunError, ValueError) as exc:
        raise Refused(422, f"the task cannot be run: {exc}") from None
    created = CreatedRun(**view(service, record).model_dump(), agent_token=token)
    return JSONResponse(created.model_dump(mode="json"), status_code=201)


async def list_runs(request: Request) -> JSONResponse:
    service: Service = request.app.state.service
    caller = who(request, service)
    runs = [view(service, r).model_dump(mode="json") for r in service.registry.all() if caller.may_read(r.team, r.id)]
    return JSONResponse({"runs": runs})


async def get_run(request: Request) -> JSONResponse:
    service: Service = request.app.state.service
    _, record = run_for(request, service, request.path_params["run_id"])
    return JSONResponse(view(service, record).model_dump(mode="json"))


async def issue_token(request: Request) -> JSONResponse:
    service: Service = request.app.state.service
    who(request, service, Role.ADMIN)
    asked = await _body(request, NewToken)
    token = service.tokens.issue(Role.REVIEWER, asked.owner)
    return JSONResponse(IssuedToken(token=token, role=Role.REVIEWER, owner=asked.owner).model_dump(mode="json"),
                        status_code=201)


def openapi(_request: Request) -> JSONResponse:
    return JSONResponse(OPENAPI)


def _op(summary: str, answer: type[BaseModel] | None, body: type[BaseModel] | None = None, status: str = "200",
        run_id: bool = False) -> dict:
    operation: dict = {"summary": summary, "security": [{"bearer": []}], "responses": {
        status: {"description": "ok", **({"content": {"application/json": {"schema": {
            "$ref": f"#/components/schemas/{answer.__name__}"}}}} if answer else {})},
        "401": {"description": "no valid bearer token"}, "404": {"description": "no such run, or not yours"}}}
    if body is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": {
            "$ref": f"#/components/schemas/{body.__name__}"}}}}
    if run_id:
        operation["parameters"] = [{"name": "run_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    return operation


def _schemas(*models: type[BaseModel]) -> dict:
    schemas: dict = {}
    for model in models:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return schemas


OPENAPI = {
    "openapi": "3.1.0",
    "info": {"title": "kernel-referee service", "version": "1"},
    "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
                   "schemas": _schemas(NewRun, NewToken, RunView, CreatedRun, IssuedToken)},
    "paths": {
        "/api/runs": {"get": _op("the runs the caller may see", None),
                      "post": _op("create a run from a task folder on disk, queued", CreatedRun, NewRun, "201")},
        "/api/runs/{run_id}": {"get": _op("a run's state, queue place and budget", RunView, run_id=True)},
        "/api/tokens": {"post": _op("issue a reviewer token (admin)", IssuedToken, NewToken, "201")},
    },
}

ROUTES = [
    Route("/api/openapi.json", openapi, methods=["GET"]),
    Route("/api/runs", list_runs, methods=["GET"]),
    Route("/api/runs", create_run, methods=["POST"]),
    Route("/api/runs/{run_id}", get_run, methods=["GET"]),
    Route("/api/tokens", issue_token, methods=["POST"]),
]
