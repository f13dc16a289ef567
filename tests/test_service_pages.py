"""The web UI in process (the fake executor): sign-in cookie flags, CSRF on every form, escaping of team-written
text, lint's refusal shown with its cause, the agent's token and connection lines shown once, and a run's page
answered 404 to a token that may not see it."""

from __future__ import annotations

import base64
import io
import re
import tarfile
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from service.app import build_app
from service.auth import ADMIN_TOKEN_ENV
from service.settings import ServiceSettings
from service.web import web_routes
from tests.fake_executor import FakeExecutor, fake_gpus
from tests.service_support import ADMIN
from tests.test_service_intake import TRANSPOSE, ZERO_ORACLE, task_archive

BASE = "http://127.0.0.1:8000"
pytestmark = pytest.mark.usefixtures("own_gpu_claims")
HOSTILE = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    settings = ServiceSettings(root=tmp_path_factory.mktemp("svc") / "service", scheduler_period_s=0.05)
    app = build_app(settings, lambda task, timing, gpu: FakeExecutor(task, placed=gpu), fake_gpus(1),
                    routes=web_routes(), env={ADMIN_TOKEN_ENV: ADMIN})
    with TestClient(app, base_url=BASE) as made:
        yield made


def csrf_of(page: str) -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)


def signed_in(client: TestClient, token: str = ADMIN) -> str:
    """Sign in through the form; the CSRF value the next form needs."""
    client.cookies.clear()
    form = client.get("/ui/login")
    answer = client.post("/ui/login", data={"token": token, "csrf_token": csrf_of(form.text)}, follow_redirects=False)
    assert answer.status_code == 303, answer.text
    cookie = answer.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "secure" not in cookie  # plain HTTP here
    return csrf_of(client.get("/ui/submit").text)


def test_pages_need_a_sign_in_and_a_bad_token_is_refused(client):
    client.cookies.clear()
    assert client.get("/ui/runs", follow_redirects=False).headers["location"] == "/ui/login"
    form = client.get("/ui/login")
    assert "kr_csrf" in form.headers["set-cookie"] and "httponly" in form.headers["set-cookie"].lower()
    refused = client.post("/ui/login", data={"token": "not-a-token", "csrf_token": csrf_of(form.text)})
    assert refused.status_code == 401 and "not one this service issued" in refused.text


def test_a_form_without_its_csrf_token_changes_nothing(client):
    signed_in(client)
    answer = client.post("/ui/submit", data={"max_attempts": "3", "note": "x", "csrf_token": "forged"},
                         files={"archive": ("t.tgz", task_archive(TRANSPOSE), "application/gzip")})
    assert answer.status_code == 403 and "CSRF" in answer.text
    assert client.get("/api/runs", headers={"Authorization": f"Bearer {ADMIN}"}).json()["runs"] == []


def test_lints_refusal_is_shown_with_its_cause_and_nothing_is_queued(client):
    csrf = signed_in(client)
    answer = client.post("/ui/submit", data={"max_attempts": "3", "note": HOSTILE, "csrf_token": csrf}, files={
        "archive": ("t.tgz", task_archive(TRANSPOSE, {"oracle.py": ZERO_ORACLE}), "application/gzip")})
    assert answer.status_code == 422
    assert "lint refuses task transpose_f32" in answer.text and "<code>error: " in answer.text
    assert HOSTILE not in answer.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in answer.text  # the note, kept
    assert client.get("/api/runs", headers={"Authorization": f"Bearer {ADMIN}"}).json()["runs"] == []


def test_a_submitted_archive_is_queued_with_its_token_shown_once(client):
    csrf = signed_in(client)
    answer = client.post("/ui/submit", data={"max_attempts": "4", "note": HOSTILE, "csrf_token": csrf}, files={
        "archive": ("t.tgz", task_archive(TRANSPOSE), "application/gzip")})
    assert answer.status_code == 201, answer.text
    token = re.search(r'<pre class="text" id="token">([^<]+)</pre>', answer.text).group(1)
    run_id = re.search(r"/ui/runs/(r[0-9a-f]+)", answer.text).group(1)
    assert (f"claude mcp add --transport http kernel-referee-{run_id} {BASE}/runs/{run_id}/mcp "
            f"--header &#34;Authorization: Bearer {token}&#34;") in answer.text
    assert answer.headers["content-security-policy"].startswith("default-src 'none'")
    page = client.get(f"/ui/runs/{run_id}")
    assert page.status_code == 200 and "transpose_f32" in page.text
    assert token not in page.text and HOSTILE not in page.text  # shown once; the note escaped
    listed = client.get("/ui/runs").text
    assert run_id in listed and HOSTILE not in listed
    # The run's own agent sees its page; it may not review it, nor see another team's run.
    client.cookies.clear()
    assert client.get(f"/ui/runs/{run_id}", headers={"Authorization": f"Bearer {token}"}).status_code == 200


def test_a_reviewer_of_another_team_sees_no_run_and_cannot_review(client):
    reviewer = client.post("/api/tokens", json={"owner": "other-team"},
                           headers={"Authorization": f"Bearer {ADMIN}"}).json()["token"]
    runs = client.get("/api/runs", headers={"Authorization": f"Bearer {ADMIN}"}).json()["runs"]
    assert runs, "the previous test's run"
    run_id = runs[0]["run"]["id"]
    csrf = signed_in(client, reviewer)
    assert client.get(f"/ui/runs/{run_id}").status_code == 404
    assert client.get(f"/ui/runs/{run_id}/report").status_code == 404
    for action in ("replay", "review"):
        answer = client.post(f"/ui/runs/{run_id}/{action}", data={"csrf_token": csrf, "action": "approve"})
        assert answer.status_code == 404, action
    assert run_id not in client.get("/ui/runs").text


def test_the_cost_sheet_takes_the_teams_inputs_and_the_runs_hours(client):
    run_id = client.get("/api/runs", headers={"Authorization": f"Bearer {ADMIN}"}).json()["runs"][0]["run"]["id"]
    signed_in(client)
    deadline = time.monotonic() + 120
    while not (client.app.state.service.registry.run_dir(run_id) or Path("/nonexistent")).is_dir():
        assert time.monotonic() < deadline, "the run folder is made once the run has its GPU"
        time.sleep(0.2)
    inputs = {"engineer_hours": "10", "hourly_rate": "100", "model_cost": "50", "gpu_hour_cost": "4",
              "invocations_per_month": "1e9", "ms_saved_end_to_end": "0.36"}
    page = client.get(f"/ui/runs/{run_id}", params=inputs).text
    found = re.search(r"<pre id=\"cost-result\">([^<]+)</pre>", page)
    assert found, re.findall(r"<p class=\"refusal\">[^<]*", page)
    sheet = found.group(1)
    assert "saved GPU hours/month     100.0000" in sheet and "monthly saving              400.00" in sheet
    bad = client.get(f"/ui/runs/{run_id}", params=inputs | {"hourly_rate": "-1"}).text
    assert "every input of the cost sheet is a number, zero or more" in bad and "cost-result" not in bad


def test_the_apis_submission_refuses_with_the_causes_and_queues_a_good_task(client):
    auth = {"Authorization": f"Bearer {ADMIN}"}
    attack = io.BytesIO()
    with tarfile.open(fileobj=attack, mode="w:gz") as archive:
        link = tarfile.TarInfo("task/task.toml")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        archive.addfile(link)
    answer = client.post("/api/submissions", headers=auth, json={
        "archive_base64": base64.b64encode(attack.getvalue()).decode(), "max_attempts": 2})
    assert answer.status_code == 422 and "'task/task.toml'" in answer.json()["causes"][0]
    good = base64.b64encode(task_archive(TRANSPOSE)).decode()
    answer = client.post("/api/submissions", headers=auth, json={"archive_base64": good, "max_attempts": 2})
    assert answer.status_code == 201, answer.text
    made = answer.json()
    assert made["run"]["state"] == "queued" and made["connection"]["token"].startswith("krt_")
    agent = {"Authorization": f"Bearer {made['connection']['token']}"}
    assert client.post("/api/submissions", headers=agent, json={"archive_base64": good}).status_code == 403
    signed_in(client)  # the pages' cookie is no key to the API (its forms carry the CSRF token; the API has none)
    assert client.post("/api/submissions", json={"archive_base64": good}).status_code == 401
