"""The audit service's JSON API and its gate, in process with the fake executor: every route refuses a token that is
not allowed there (a foreign run's agent, another team's reviewer, no token), Host and Origin are checked, the queue
orders runs over the GPUs, the team limits refuse, and the state on disk is what a restart reads."""

from __future__ import annotations

import time

import anyio
import pytest
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend
from starlette.requests import HTTPConnection
from starlette.testclient import TestClient

from harness.gpu_lease import lease_folder
from service.app import build_app
from service.auth import ADMIN_TOKEN_ENV
from service.registry import Registry
from service.settings import ServiceSettings, TeamLimits
from server.attempt import record_attempt
from tests.fake_executor import FAKE_GPU_UUID, FakeExecutor, fake_gpus
from tests.server_support import kernel
from tests.service_support import ADMIN, MATMUL

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


@pytest.fixture
def two_teams(tmp_path):
    with _client(tmp_path) as client:
        red, blue = _reviewer(client, "red"), _reviewer(client, "blue")
        red_run, blue_run = _run(client, red), _run(client, blue)
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


def test_only_the_admin_issues_tokens_and_agents_create_no_runs(two_teams):
    client, tokens, _, _ = two_teams
    for token in (tokens["red"], tokens["red_agent"]):
        assert client.post("/api/tokens", json={"owner": "red"}, headers=_auth(token)).status_code == 403
    assert client.post("/api/tokens", json={"owner": "red"}).status_code == 401
    asked = {"task_dir": str(MATMUL)}
    assert client.post("/api/runs", json=asked, headers=_auth(tokens["red_agent"])).status_code == 403
    assert client.post("/api/runs", json=asked).status_code == 401
    # a reviewer's run is its own team's, whatever team it names
    made = _run(client, tokens["red"], team="blue")
    assert made["run"]["team"] == "red"


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
        _wait_state(client, first, "running")
        service = client.app.state.service
        deadline = time.monotonic() + 60
        while not (first in service.live and service.live[first].admitted):  # its executor placed, its preparation begun
            assert time.monotonic() < deadline
            time.sleep(0.05)
        run = service.live[first].run
        assert run.preparation.wait(60) and run.preparation.ready
        answer = record_attempt(run, run.candidate(None, kernel("latency_us=50")), "the one attempt", None, None)
        assert answer.attempt == 1 and run.finished
        view = _wait_state(client, second, "running")
        assert view["run"]["gpu_uuid"] == FAKE_GPU_UUID
        assert run.executor.closed.is_set()  # closed before its claim was let go, so before the second ran
        assert not service.live[second].run.executor.closed.is_set()
        assert _wait_state(client, first, "finished")["run"]["finished_at"]


def test_team_limits_refuse_with_their_cause(tmp_path):
    with _client(tmp_path, gpus=1, limits=TeamLimits(max_queued_runs=2, max_attempts_per_day=10)) as client:
        red = _reviewer(client, "red")
        first = _run(client, red, max_attempts=3)["run"]["id"]
        assert _wait_state(client, first, "running")["run"]["state"] == "running"  # it holds the GPU: not waiting
        _run(client, red, max_attempts=3)
        _run(client, red, max_attempts=3)
        too_many = client.post("/api/runs", json={"task_dir": str(MATMUL), "max_attempts": 1}, headers=_auth(red))
        assert too_many.status_code == 429 and "waiting" in too_many.json()["error"]
        blue = _reviewer(client, "blue")
        _run(client, blue, max_attempts=7)
        over = client.post("/api/runs", json={"task_dir": str(MATMUL), "max_attempts": 4}, headers=_auth(blue))
        assert over.status_code == 429 and "24 hours" in over.json()["error"]


def test_tokens_are_stored_hashed_and_the_openapi_names_every_route(two_teams, tmp_path):
    client, tokens, _, _ = two_teams
    stored = (tmp_path / "service" / "tokens.json").read_text()
    assert all(tokens[k] not in stored for k in tokens)
    paths = client.get("/api/openapi.json", headers=_auth(ADMIN)).json()["paths"]
    assert set(paths) == {"/api/runs", "/api/runs/{run_id}", "/api/tokens"}
