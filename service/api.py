"""The JSON API: runs listed, each one's state with its queue place and budget; reviewer tokens issued by the admin.
Runs are made by service/submit.py (a submission, or the admin's task folder); the OpenAPI description of every
API route is service/openapi.py's."""

from __future__ import annotations

from pydantic import BaseModel, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from server.record_files import read_summary
from service.core import Service
from service.guards import Refused, run_for, who
from service.records import Role, RunRecord

MAX_BODY_BYTES = 64 * 1024


class NewRun(BaseModel):
    task_dir: str = Field(description="a task folder on the service's disk (task.toml, reference.cu, ...), not under "
                          "the service's own folder; copied without links and linted")
    max_attempts: int | None = Field(None, ge=1, le=100, description="the budget (default: the service's)")
    note: str = Field("", max_length=2000)
    team: str | None = Field(None, max_length=100, description="the team the run is for (default: the admin's)")


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
    lint_warnings: list[str] = Field(default_factory=list, description="lint's warnings on the task, in its words")


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
        budget = _summary_budget(run_dir) if run_dir is not None and (run_dir / "summary.json").exists() else None
    return RunView(run=record, queue_position=place.position, queue_length=place.length,
                   expected_wait_s=place.expected_wait_s, budget=budget, mcp_url=service.settings.mcp_url(record.id))


def _summary_budget(run_dir) -> dict | None:
    """The budget of a run not served now, from its summary.json, in the shape a served run's has (server/models.py
    `Budget`): its probe window is not kept there, so those two are null."""
    summary = read_summary(run_dir)
    held = summary.budget
    if not held:
        return None
    return {"max_attempts": held["max_attempts"], "attempts_used": held["used"], "attempts_left": held["left"],
            "probes_left_in_window": None, "probe_gpu_seconds_left_in_window": None,
            "finished": summary.status == "finished", "stop_reason": summary.stop_reason}


async def read_body(request: Request, model: type[BaseModel]) -> BaseModel:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise Refused(413, "the request body is too large")
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        raise Refused(422, exc.errors(include_url=False, include_context=False).__repr__()) from None


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
    asked = await read_body(request, NewToken)
    token = service.tokens.issue(Role.REVIEWER, asked.owner)
    return JSONResponse(IssuedToken(token=token, role=Role.REVIEWER, owner=asked.owner).model_dump(mode="json"),
                        status_code=201)


ROUTES = [
    Route("/api/runs", list_runs, methods=["GET"]),
    Route("/api/runs/{run_id}", get_run, methods=["GET"]),
    Route("/api/tokens", issue_token, methods=["POST"]),
]
