"""The audit service's JSON API and its gate, in process with the fake executor: every route refuses a token that is
not allowed there (a foreign run's agent, another team's reviewer, no token), a task folder is the admin's to name
and is linted, Host and Origin are checked, the queue orders runs over the GPUs, the team limits refuse, the OpenAPI
description names every API route, and the state on disk is what a restart reads."""

from __future__ import annotations

import base64
import shutil
import time

import anyio
import pytest
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend
from starlette.requests import HTTPConnection
from starlette.routing import Route
from starlette.testclient import TestClient

from harness.gpu_lease import lease_folder
from service.app import build_app
from service.auth import ADMIN_TOKEN_ENV
from service.openapi import ROUTES, describe, route_operations
from service.registry import Registry
from service.settings import ServiceSettings, TeamLimits
from server.attempt import record_attempt
from tests.fake_executor import FAKE_GPU_UUID, FakeExecutor, fake_gpus
from tests.server_support import kernel
from tests.service_support import ADMIN, MATMUL
from tests.test_service_intake import TRANSPOSE, ZERO_ORACLE, task_archive

BASE = "http://127.0.0.1:8000"

pytestmark = pytest.mark.usefixtures("own_gpu_claims")


def _client(tmp_path, gpus: int = 1, limits: TeamLimits = TeamLimits()) -> TestClient:
    settings = ServiceSettings(root=tmp_path / "service", limits=limits, scheduler_period_s=0.05)
    app = build_app(settings, lambda task, timing, gpu: FakeExecutor(task, placed=gpu), fake_gpus(gpus),
                    env={ADMIN_TOKEN_ENV: ADMIN})
    return TestClient(app, base_url=BASE)


def _auth(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def _reviewer(client: TestClient, team: str) -> str:
    answer = client.post("/api/tokens", json={"owner": team}, headers=_auth(ADMIN))
    assert answer.status_code == 201, answer.text
    return answer.json()["token"]


def _run(client: TestClient, token: str, **fields) -> dict:
    answer = client.post("/api/runs", json={"task_dir": str(MATMUL), **fields}, headers=_auth(token))
    assert answer.status_code == 201, answer.text
    return answer.json()


def _wait_state(client: TestClient, run_id: str, state: str) -> dict:
    deadline = time.monotonic() + 60
    while True:
        view = client.get(f"/api/runs/{run_id}", headers=_auth(ADMIN)).json()
        if view["run"]["state"] == state:
            return view
        claims = {p.name: p.read_text() for p in lease_folder().glob("*.serving.lock")}
        assert time.monotonic() < deadline, f"run {run_id} still {view['run']['state']}; GPU claims: {claims}"
        time.sleep(0.05)


def _admitted(client: TestClient, run_id: str):
    """The run's live side once its executor is placed and its preparation ready (server/run.py `Run`)."""
    _wait_state(client, run_id, "running")
    service = client.app.state.service
    deadline = time.monotonic() + 60
    while not (run_id in service.live and service.live[run_id].admitted):  # its executor placed, preparation begun
        assert time.monotonic() < deadline
        time.sleep(0.05)
    run = service.live[run_id].run
    assert run.preparation.wait(60) and run.preparation.ready
    return run


def _submitted(client: TestClient, token: str, **fields) -> dict:
    """A run submitted as a team submits one (POST /api/submissions: the task's archive)."""
    archive = base64.b64encode(task_archive(MATMUL)).decode()
    return client.post("/api/submissions", json={"archive_base64": archive, **fields}, headers=_auth(token))


@pytest.fixture
def two_teams(tmp_path):
    with _client(tmp_path) as client:
        red, blue = _reviewer(client, "red"), _reviewer(client, "blue")
        red_run, blue_run = _run(client, ADMIN, team="red"), _run(client, ADMIN, team="blue")
        yield client, {"red": red, "blue": blue, "red_agent": red_run["agent_token"],
                       "blue_agent": blue_run["agent_token"]}, red_run["run"]["id"], blue_run["run"]["id"]


def test_a_run_is_seen_by_the_admin_its_team_and_its_agent_only(two_teams):
    client, tokens, red_id, blue_id = two_teams
    for token in (ADMIN, tokens["red"], tokens["red_agent"]):
        assert client.get(f"/api/runs/{red_id}", headers=_auth(token)).status_code == 200
    for token in (tokens["blue"], tokens["blue_agent"]):  # another team's reviewer, another run's agent
        refused = client.get(f"/api/runs/{red_id}", headers=_auth(token))
        assert refused.status_code == 404 and red_id in refused.json()["error"]
    assert client.get(f"/api/runs/{red_id}").status_code == 401
    assert client.get(f"/api/runs/{red_id}", headers=_auth("krt_not-a-token")).status_code == 401
    listed = client.get("/api/runs", headers=_auth(tokens["blue_agent"])).json()["runs"]
    assert [v["run"]["id"] for v in listed] == [blue_id]
    listed = client.get("/api/runs", headers=_auth(tokens["red"])).json()["runs"]
    assert [v["run"]["id"] for v in listed] == [red_id]
    assert client.get("/api/runs").status_code == 401


def test_only_the_admin_issues_tokens_and_names_a_task_folder(two_teams):
    client, tokens, red_id, blue_id = two_teams
    for token in (tokens["red"], tokens["red_agent"]):
        assert client.post("/api/tokens", json={"owner": "red"}, headers=_auth(token)).status_code == 403
    assert client.post("/api/tokens", json={"owner": "red"}).status_code == 401
    root = client.app.state.service.settings.root
    for task_dir in (str(MATMUL), str(root / "runs" / blue_id / "task")):  # a folder anywhere; another team's task
        asked = {"task_dir": task_dir, "team": "red"}
        for token in (tokens["red"], tokens["red_agent"], tokens["blue_agent"]):
            refused = client.post("/api/runs", json=asked, headers=_auth(token))
            assert refused.status_code == 403 and "admin" in refused.json()["error"]
        assert client.post("/api/runs", json=asked).status_code == 401
    assert [r.id for r in client.app.state.service.registry.all()] == [red_id, blue_id]  # nothing made


def test_the_admins_task_folder_is_refused_under_root_copied_without_links_and_linted(two_teams, tmp_path):
    client, _, red_id, blue_id = two_teams
    root = client.app.state.service.settings.root

    def asked(task_dir) -> dict:
        answer = client.post("/api/runs", json={"task_dir": str(task_dir), "team": "red"}, headers=_auth(ADMIN))
        return answer.status_code, answer.json()

    status, refused = asked(root / "runs" / blue_id / "task")  # another team's run's task, read through the service
    assert status == 422 and "under the service's own folder" in refused["error"]
    (tmp_path / "alias").symlink_to(root / "runs" / blue_id / "task")
    status, refused = asked(tmp_path / "alias")  # a link outside that resolves there
    assert status == 422 and "under the service's own folder" in refused["error"]
    assert asked("relative/task")[0] == 422
    linked = tmp_path / "linked"
    shutil.copytree(MATMUL, linked, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (linked / "notes.txt").symlink_to("/etc/passwd")
    status, refused = asked(linked)
    assert status == 422 and refused["causes"] == [f"{linked / 'notes.txt'} refused (link): a symbolic link"]
    unlinted = tmp_path / "unlinted"
    shutil.copytree(TRANSPOSE, unlinted, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (unlinted / "oracle.py").write_text(ZERO_ORACLE)
    status, refused = asked(unlinted)
    assert status == 422 and refused["error"] == "lint refuses task transpose_f32"
    assert refused["causes"] and all(c.startswith("error: ") for c in refused["causes"])
    assert [r.id for r in client.app.state.service.registry.all()] == [red_id, blue_id]  # nothing made
    assert not list(root.glob("intake/*"))  # nor left behind
    status, made = asked(TRANSPOSE)
    assert status == 201 and made["run"]["state"] == "queued" and made["run"]["team"] == "red"
    assert any(line.startswith("warning: too-small:") for line in made["lint_warnings"])


def test_a_runs_mcp_endpoint_takes_its_own_agent_token_only(two_teams):
    client, tokens, red_id, blue_id = two_teams
    hello = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    for token in (tokens["blue_agent"], tokens["red"], ADMIN, "krt_forged"):
        refused = client.post(f"/runs/{red_id}/mcp", json=hello, headers={**headers, **_auth(token)})
        assert refused.status_code == 401
        assert f"/.well-known/oauth-protected-resource/runs/{red_id}/mcp" in refused.headers["www-authenticate"]
    assert client.post(f"/runs/{red_id}/mcp", json=hello, headers=headers).status_code == 401
    metadata = client.get(f"/.well-known/oauth-protected-resource/runs/{red_id}/mcp").json()
    assert metadata["resource"] == f"{BASE}/runs/{red_id}/mcp"
    assert client.get("/.well-known/oauth-protected-resource/runs/rffffffffffff/mcp").status_code == 404


def test_the_sdks_bearer_check_refuses_a_token_bound_to_another_runs_endpoint(two_teams):
    """Behind the gate, each run's MCP app checks the token's audience too (RFC 8707), with the service's verifier:
    the SDK's own backend, as service/live.py `mcp_app` configures it."""
    client, tokens, red_id, _ = two_teams
    service = client.app.state.service
    backend = BearerAuthBackend(service.verifier, resource_server_url=service.settings.mcp_url(red_id))

    def authenticate(token: str):
        scope = {"type": "http", "headers": [(b"authorization", f"Bearer {token}".encode())]}
        return anyio.run(backend.authenticate, HTTPConnection(scope))

    assert authenticate(tokens["blue_agent"]) is None
    assert authenticate(tokens["red"]) is None
    credentials, user = authenticate(tokens["red_agent"])
    assert user.access_token.resource == f"{BASE}/runs/{red_id}/mcp"


def test_host_and_origin_are_checked_on_every_route(two_teams):
    client, tokens, red_id, _ = two_teams
    for path in ("/api/runs", f"/api/runs/{red_id}", "/api/openapi.json", f"/runs/{red_id}/mcp"):
        assert client.get(path, headers={**_auth(ADMIN), "Host": "evil.example:8000"}).status_code == 421
        assert client.get(path, headers={**_auth(ADMIN), "Origin": "http://evil.example"}).status_code == 403
    assert client.get("/api/runs", headers={**_auth(ADMIN), "Origin": BASE}).status_code == 200


def test_the_queue_serves_as_many_runs_as_gpus_in_order(tmp_path):
    with _client(tmp_path, gpus=2) as client:
        runs = [_run(client, ADMIN)["run"]["id"] for _ in range(4)]
        assert _wait_state(client, runs[1], "running")["run"]["state"] == "running"
        assert _wait_state(client, runs[0], "running")["run"]["state"] == "running"
        views = [client.get(f"/api/runs/{r}", headers=_auth(ADMIN)).json() for r in runs]
        assert [v["run"]["state"] for v in views] == ["running", "running", "queued", "queued"]
        assert [v["queue_position"] for v in views] == [0, 0, 1, 2]
        assert views[2]["expected_wait_s"] == views[3]["expected_wait_s"] > 0  # two GPUs: both next in one turn
        assert len({v["run"]["gpu_uuid"] for v in views[:2]}) == 2
    again = Registry(tmp_path / "service")  # what a restart reads
    assert [r.queued_seq for r in again.queued()] == [3, 4]


def test_a_finished_run_closes_its_executor_before_the_next_run_gets_its_gpu(tmp_path):
    with _client(tmp_path, gpus=1) as client:
        first, second = (_run(client, ADMIN, max_attempts=1)["run"]["id"] for _ in range(2))
        service = client.app.state.service
        run = _admitted(client, first)
        deadline = time.monotonic() + 60
        answer = record_attempt(run, run.candidate(None, kernel("latency_us=50")), "the one attempt", None, None)
        assert answer.attempt == 1 and run.finished
        view = _wait_state(client, second, "running")
        assert view["run"]["gpu_uuid"] == FAKE_GPU_UUID
        assert run.executor.closed.is_set()  # closed before its claim was let go, so before the second ran
        while second not in service.live:  # marked running first, then its live side opened
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert not service.live[second].run.executor.closed.is_set()
        assert _wait_state(client, first, "finished")["run"]["finished_at"]


def test_team_limits_refuse_with_their_cause(tmp_path):
    with _client(tmp_path, gpus=1, limits=TeamLimits(max_queued_runs=2, max_attempts_per_day=10)) as client:
        red = _reviewer(client, "red")
        first = _submitted(client, red, max_attempts=3).json()["run"]["id"]
        assert _wait_state(client, first, "running")["run"]["state"] == "running"  # it holds the GPU: not waiting
        for _ in range(2):
            assert _submitted(client, red, max_attempts=3).status_code == 201
        too_many = _submitted(client, red, max_attempts=1)
        assert too_many.status_code == 429 and "waiting" in too_many.json()["causes"][0]
        blue = _reviewer(client, "blue")
        assert _submitted(client, blue, max_attempts=7).status_code == 201
        over = _submitted(client, blue, max_attempts=4)
        assert over.status_code == 429 and "24 hours" in over.json()["causes"][0]


def test_tokens_are_stored_hashed_and_the_openapi_names_every_route(two_teams, tmp_path):
    client, tokens, _, _ = two_teams
    stored = (tmp_path / "service" / "tokens.json").read_text()
    assert all(tokens[k] not in stored for k in tokens)
    paths = client.get("/api/openapi.json", headers=_auth(ADMIN)).json()["paths"]
    described = sorted((method.upper(), path) for path, methods in paths.items() for method in methods)
    assert described == route_operations(client.app.routes)  # the served app's own routes, whichever they are
    assert ("POST", "/api/submissions") in described and ("POST", "/api/runs") in described


def test_an_api_route_without_an_operation_fails_the_description():
    unknown = Route("/api/unknown", lambda _request: None, methods=["GET"])
    with pytest.raises(KeyError, match="GET /api/unknown has no OpenAPI operation"):
        describe([*ROUTES, unknown])


def test_a_runs_budget_has_one_shape_served_or_read_from_its_folder(tmp_path):
    with _client(tmp_path, gpus=1) as client:
        run_id = _run(client, ADMIN, max_attempts=2)["run"]["id"]
        _wait_state(client, run_id, "running")
        service = client.app.state.service
        deadline = time.monotonic() + 60
        while not (run_id in service.live and service.live[run_id].admitted):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        run = service.live[run_id].run
        assert run.preparation.wait(60) and run.preparation.ready
        record_attempt(run, run.candidate(None, kernel("latency_us=50")), "one attempt", None, None)
        served = client.get(f"/api/runs/{run_id}", headers=_auth(ADMIN)).json()["budget"]
        live = service.live.pop(run_id)  # as after a restart, before anything opens the run again: from its folder
        folder = client.get(f"/api/runs/{run_id}", headers=_auth(ADMIN)).json()["budget"]
        service.live[run_id] = live  # closed with the service
    assert set(folder) == set(served), (folder, served)
    same = ("max_attempts", "attempts_used", "attempts_left", "finished")
    assert {k: folder[k] for k in same} == {k: served[k] for k in same} == {
        "max_attempts": 2, "attempts_used": 1, "attempts_left": 1, "finished": False}
    assert folder["probes_left_in_window"] is None and served["probes_left_in_window"] is not None
