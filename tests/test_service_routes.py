"""Every route the service serves, tried by every kind of caller: no token, the run's own agent, another run's agent,
another team's reviewer, the run's team's reviewer and the admin, each answered as the service's rule says (a run one
may not see is 404, as one that does not exist; a role that may not act is 403; no token 401, or a page's sign-in
redirect). The routes are read from the app itself: a route served without a case here fails
`test_every_route_the_app_serves_has_a_case`. Every form that changes something refuses a stale CSRF token.

The run `own` is team red's, finished (its report, replay and review are served); `foreign` is team blue's. Pages
are asked with the session cookie (as a browser asks), the API and the run's MCP endpoint with the bearer header."""

from __future__ import annotations

import time

import pytest
from starlette.routing import Route
from starlette.testclient import TestClient

from harness.gpu_lease import LEASE_DIR_ENV
from server.attempt import record_attempt
from server.record_files import iter_events
from service.app import build_app
from service.auth import ADMIN_TOKEN_ENV
from service.settings import ServiceSettings
from service.web import web_routes
from service.web_session import CSRF_COOKIE, CSRF_FIELD, SESSION_COOKIE
from tests.fake_executor import FakeExecutor, fake_gpus
from tests.server_support import kernel
from tests.service_support import ADMIN, MATMUL

BASE = "http://127.0.0.1:8000"
CALLERS = ("none", "own_agent", "foreign_agent", "other_reviewer", "own_reviewer", "admin")
CSRF = "c" * 43
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "routes-test", "version": "1"}}}


def _everyone(status: int) -> tuple[int, ...]:
    return (status,) * len(CALLERS)


# (method, path) -> (how it is asked: "page", "api" or "mcp"; what it sends; the status per caller, in CALLERS order)
CASES: dict[tuple[str, str], tuple[str, dict, tuple[int, ...]]] = {
    ("GET", "/"): ("page", {}, _everyone(303)),
    ("GET", "/ui/login"): ("page", {}, _everyone(200)),
    ("POST", "/ui/login"): ("page", {"form": {"token": "{token}"}}, (401, 303, 303, 303, 303, 303)),
    ("POST", "/ui/logout"): ("page", {"form": {}}, _everyone(303)),
    ("GET", "/ui/runs"): ("page", {}, (303, 200, 200, 200, 200, 200)),
    ("GET", "/ui/submit"): ("page", {}, (303, 403, 403, 200, 200, 200)),
    # Allowed, an empty form is refused by the intake (422): past every access check.
    ("POST", "/ui/submit"): ("page", {"form": {}}, (401, 403, 403, 422, 422, 422)),
    ("GET", "/ui/runs/{run_id}"): ("page", {}, (303, 200, 404, 404, 200, 200)),
    ("GET", "/ui/runs/{run_id}/report"): ("page", {}, (303, 200, 404, 404, 200, 200)),
    ("POST", "/ui/runs/{run_id}/replay"): ("page", {"form": {}}, (401, 403, 404, 404, 303, 303)),
    ("POST", "/ui/runs/{run_id}/review"): ("page", {"form": {"action": "reject", "note": "n"}},
                                           (401, 403, 404, 404, 303, 303)),
    ("GET", "/api/openapi.json"): ("api", {}, _everyone(200)),
    ("GET", "/api/runs"): ("api", {}, (401, 200, 200, 200, 200, 200)),
    # Allowed, a folder that is not there is refused as a task (422).
    ("POST", "/api/runs"): ("api", {"json": {"task_dir": "/nonexistent/task"}}, (401, 403, 403, 403, 403, 422)),
    ("GET", "/api/runs/{run_id}"): ("api", {}, (401, 200, 404, 404, 200, 200)),
    ("POST", "/api/tokens"): ("api", {"json": {"owner": "green"}}, (401, 403, 403, 403, 403, 201)),
    ("POST", "/api/submissions"): ("api", {"json": {}}, (401, 403, 403, 422, 422, 422)),
}
# Served by the app's gate (service/app.py ServiceGate), not by a route of its own.
GATE_CASES = {
    ("POST", "/runs/{run_id}/mcp"): ("mcp", {"json": INITIALIZE}, (401, 200, 401, 401, 401, 401)),
    ("GET", "/.well-known/oauth-protected-resource/runs/{run_id}/mcp"): ("api", {}, _everyone(200)),
}
POST_FORMS = sorted(key for key, (kind, _, _) in CASES.items() if kind == "page" and key[0] == "POST")


def _served(app) -> set[tuple[str, str]]:
    return {(method, route.path) for route in app.routes if isinstance(route, Route)
            for method in route.methods if method != "HEAD"}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """The app with the pages, two teams' runs (red's finished), and every caller's token. Two GPUs: blue's run
    serves on one, and red's replay takes the other (on one GPU it would be refused as busy)."""
    root = tmp_path_factory.mktemp("routes")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(LEASE_DIR_ENV, str(root / "gpu-leases"))
        settings = ServiceSettings(root=root / "service", scheduler_period_s=0.05)
        app = build_app(settings, lambda task, timing, gpu: FakeExecutor(task, placed=gpu), fake_gpus(2),
                        routes=web_routes(), env={ADMIN_TOKEN_ENV: ADMIN})
        with TestClient(app, base_url=BASE) as client:
            admin = {"Authorization": f"Bearer {ADMIN}"}
            tokens = {"admin": ADMIN, "none": ""}
            for team, caller in (("red", "own_reviewer"), ("blue", "other_reviewer")):
                tokens[caller] = client.post("/api/tokens", json={"owner": team}, headers=admin).json()["token"]
            runs = {}
            for team, caller in (("red", "own_agent"), ("blue", "foreign_agent")):
                made = client.post("/api/runs", json={"task_dir": str(MATMUL), "max_attempts": 1, "team": team},
                                   headers=admin)
                assert made.status_code == 201, made.text
                tokens[caller], runs[team] = made.json()["agent_token"], made.json()["run"]["id"]
            _finish(client, runs["red"])
            yield client, tokens, runs["red"], runs["blue"]


def _finish(client: TestClient, run_id: str) -> None:
    """The run's one attempt recorded, so it finishes (its report, replay and review are then served)."""
    service = client.app.state.service
    deadline = time.monotonic() + 120
    while not (run_id in service.live and service.live[run_id].admitted):
        assert time.monotonic() < deadline, service.registry.get(run_id)
        time.sleep(0.05)
    run = service.live[run_id].run
    assert run.preparation.wait(120) and run.preparation.ready
    record_attempt(run, run.candidate(None, kernel("latency_us=50")), "the one attempt", None, None)
    while service.registry.get(run_id).state.value != "finished":
        assert time.monotonic() < deadline, service.registry.get(run_id)
        time.sleep(0.05)


def _ask(client: TestClient, method: str, path: str, kind: str, sends: dict, token: str, csrf: str = CSRF):
    """One request as a caller with `token` ("" for none) asks it: a page with its session cookie and the CSRF
    pair, the API and the MCP endpoint with the bearer header."""
    client.cookies.clear()
    headers = {**(MCP_HEADERS if kind == "mcp" else {})}
    if kind == "page":
        client.cookies.set(CSRF_COOKIE, CSRF)
        if token:
            client.cookies.set(SESSION_COOKIE, token)
    elif token:
        headers["Authorization"] = f"Bearer {token}"
    data = None
    if "form" in sends:
        data = {CSRF_FIELD: csrf, **{k: v.replace("{token}", token) for k, v in sends["form"].items()}}
    try:
        return client.request(method, path, headers=headers, data=data, json=sends.get("json"),
                              follow_redirects=False)
    finally:
        client.cookies.clear()


def test_every_route_the_app_serves_has_a_case(service):
    client, _, _, _ = service
    assert _served(client.app) == set(CASES), "a route the app serves needs its access case here"


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("method, path", sorted(CASES) + sorted(GATE_CASES))
def test_each_caller_is_answered_on_each_route_as_the_rule_says(service, method, path, caller):
    client, tokens, own, _ = service
    kind, sends, statuses = (CASES | GATE_CASES)[method, path]
    answer = _ask(client, method, path.replace("{run_id}", own), kind, sends, tokens[caller])
    expected = statuses[CALLERS.index(caller)]
    assert answer.status_code == expected, (caller, answer.text[:500])
    if expected == 303 and kind == "page" and method == "GET" and caller == "none" and path != "/":
        assert answer.headers["location"] == "/ui/login"
    if expected == 404:
        assert own not in client.get("/api/runs", headers={"Authorization": f"Bearer {tokens[caller]}"}).text


def test_the_api_takes_no_session_cookie(service):
    """The pages' cookie is no key to the API (its forms carry a CSRF token; the API has none to check)."""
    client, tokens, own, _ = service
    for (method, path), (kind, sends, statuses) in CASES.items():
        if kind != "api" or statuses[0] != 401:
            continue
        client.cookies.set(SESSION_COOKIE, tokens["admin"])
        answer = client.request(method, path.replace("{run_id}", own), json=sends.get("json"))
        client.cookies.clear()
        assert answer.status_code == 401, (method, path)


@pytest.mark.parametrize("csrf", ["forged", ""])
@pytest.mark.parametrize("method, path", POST_FORMS)
def test_every_form_refuses_a_stale_csrf_token_and_changes_nothing(service, method, path, csrf):
    client, tokens, own, _ = service
    run_dir = client.app.state.service.registry.run_dir(own)
    logged = len(list(iter_events(run_dir)))
    runs = len(client.app.state.service.registry.all())
    kind, sends, _ = CASES[method, path]
    answer = _ask(client, method, path.replace("{run_id}", own), kind, sends, tokens["admin"], csrf=csrf)
    assert answer.status_code == 403 and "CSRF" in answer.text
    assert "set-cookie" not in answer.headers or SESSION_COOKIE not in answer.headers["set-cookie"]
    assert len(list(iter_events(run_dir))) == logged and len(client.app.state.service.registry.all()) == runs
