"""The JSON API's routes, and their OpenAPI 3.1 description built from them: each route's operation is looked up by
its method and path, so a route added without one fails when the description is built (at import), and the
description names nothing that is not served. The pages (service/web.py) are not part of the API."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from service import api, submit


@dataclass(frozen=True)
class Operation:
    summary: str
    answer: type[BaseModel] | None = None
    body: type[BaseModel] | None = None
    status: str = "200"
    refused_with_causes: bool = False   # 422 {error, causes}: intake's refusal (service/intake.py)
    public: bool = False                # answered without a token


OPERATIONS: dict[tuple[str, str], Operation] = {
    ("GET", "/api/openapi.json"): Operation("this description", public=True),
    ("GET", "/api/runs"): Operation("the runs the caller may see"),
    ("POST", "/api/runs"): Operation(
        "admin: a run of a task folder on the service's disk (not under its own folder), copied without links, "
        "linted, queued", api.CreatedRun, api.NewRun, "201", refused_with_causes=True),
    ("GET", "/api/runs/{run_id}"): Operation("a run's state, queue place and budget", api.RunView),
    ("POST", "/api/tokens"): Operation("admin: issue a reviewer token", api.IssuedToken, api.NewToken, "201"),
    ("POST", "/api/submissions"): Operation(
        "admin, reviewer: a task archive or new-task's fields, linted, then a queued run", submit.Submitted,
        submit.ApiSubmission, "201", refused_with_causes=True),
}


def _operation(path: str, op: Operation) -> dict:
    ok: dict = {"description": "ok"}
    if op.answer is not None:
        ok["content"] = {"application/json": {"schema": {"$ref": f"#/components/schemas/{op.answer.__name__}"}}}
    described: dict = {"summary": op.summary, "responses": {op.status: ok}}
    if not op.public:
        described["security"] = [{"bearer": []}]
        described["responses"] |= {"401": {"description": "no valid bearer token"},
                                   "403": {"description": "the caller's role may not do this"},
                                   "404": {"description": "no such run, or not yours"}}
    if op.refused_with_causes:
        described["responses"]["422"] = {"description": "refused: `error` and `causes` (lint's lines)"}
    if op.body is not None:
        described["requestBody"] = {"required": True, "content": {"application/json": {"schema": {
            "$ref": f"#/components/schemas/{op.body.__name__}"}}}}
    if "{run_id}" in path:
        described["parameters"] = [{"name": "run_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    return described


def route_operations(routes: list[BaseRoute]) -> list[tuple[str, str]]:
    """(method, path) of every API route among `routes` (HEAD, which Starlette adds to a GET, left out)."""
    return sorted((method, route.path) for route in routes if isinstance(route, Route)
                  and route.path.startswith("/api/") for method in (route.methods or ()) if method != "HEAD")


def describe(routes: list[BaseRoute]) -> dict:
    """The OpenAPI document of `routes`; KeyError naming a route that has no operation in OPERATIONS."""
    paths: dict[str, dict] = {}
    models: list[type[BaseModel]] = []
    for method, path in route_operations(routes):
        if (method, path) not in OPERATIONS:
            raise KeyError(f"the API route {method} {path} has no OpenAPI operation (service/openapi.py)")
        op = OPERATIONS[method, path]
        paths.setdefault(path, {})[method.lower()] = _operation(path, op)
        models += [m for m in (op.answer, op.body) if m is not None and m not in models]
    return {"openapi": "3.1.0", "info": {"title": "kernel-referee service", "version": "1"},
            "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
                           "schemas": _schemas(models)},
            "paths": paths}


def _schemas(models: list[type[BaseModel]]) -> dict:
    schemas: dict = {}
    for model in models:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return schemas


def _openapi(_request: Request) -> JSONResponse:
    return JSONResponse(DOCUMENT)


ROUTES: list[BaseRoute] = [Route("/api/openapi.json", _openapi, methods=["GET"]), *api.ROUTES, *submit.ROUTES]
DOCUMENT = describe(ROUTES)
