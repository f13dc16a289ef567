"""The service in a real browser: the distribution's Chromium, driven by Playwright through `executable_path`
(nothing is downloaded), against the service in a subprocess with the fake executor. A person signs in, submits a
task archive, sees it queued behind another run, opens its report once its agent finished, replays it and approves
it. Screenshots of each step are kept under the test's tmp dir (`screenshots/`).

Skipped, with the reason, where Chromium or Playwright is not installed (`apt-get install chromium`; .ci/run tries).
"""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import pytest

from server.verify import verify_run
from tests.server_support import free_port, kernel
from tests.service_support import ADMIN, MATMUL, ServiceProcess, agent
from tests.test_service_intake import task_archive

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")
pytestmark = [pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed "
                                 "(apt-get install -y chromium)"),
              pytest.mark.usefixtures("own_gpu_claims")]
NOTE = "please look at <the> tail & cases"


async def _prepared(client, timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        answer = await client.call_tool("describe_task", {})
        preparation = json.loads(answer.content[0].text).get("preparation")
        if preparation is None or preparation["state"] == "ready":
            return
        assert preparation["state"] != "failed" and time.monotonic() < deadline, preparation
        await anyio.sleep(0.5)


def play(mcp_url: str, token: str, *sources: str) -> None:
    """An agent on its run: wait for its preparation, record `sources`, finish."""

    async def run() -> None:
        async with agent(mcp_url, token) as client:
            await _prepared(client)
            for source in sources:
                answer = await client.call_tool("record_attempt", {"source": source, "rationale": "faster tiles"})
                assert not answer.is_error, answer.content[0].text
            answer = await client.call_tool("finish", {"reason": "no better idea"})
            assert not answer.is_error, answer.content[0].text

    with ThreadPoolExecutor(1) as thread:  # Playwright's sync API keeps its own event loop in this thread
        thread.submit(anyio.run, run).result()


@pytest.fixture
def service(tmp_path):
    started = ServiceProcess(tmp_path / "service", free_port(), gpus=1).start()
    yield started
    started.stop()


@pytest.fixture
def browser():
    with playwright_api.sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.mark.timeout(600)
def test_submit_see_queued_open_the_report_replay_and_approve(service, browser, tmp_path):
    shots = tmp_path / "screenshots"
    shots.mkdir()
    archive = tmp_path / "matmul_f32.tgz"
    archive.write_bytes(task_archive(MATMUL))
    first = service.create_run(max_attempts=2)          # holds the one GPU: the submitted run waits behind it
    service.wait_state(first["run"]["id"], ("running",))
    page = browser.new_page(base_url=service.url)

    page.goto("/ui/login")
    page.fill("#token", ADMIN)
    page.click("#sign-in")
    page.goto("/ui/submit")
    page.set_input_files("#archive", str(archive))
    page.fill("#max_attempts", "3")
    page.fill("#note", NOTE)
    page.click("#submit")
    page.wait_for_selector("#agent-token", timeout=120_000)
    page.screenshot(path=shots / "1-created.png", full_page=True)
    token = page.inner_text("#token").strip()
    command = page.inner_text("#claude-command")
    run_id = command.split()[5].removeprefix("kernel-referee-")
    mcp_url = f"{service.url}/runs/{run_id}/mcp"
    assert command == f'claude mcp add --transport http kernel-referee-{run_id} {mcp_url} ' \
                      f'--header "Authorization: Bearer {token}"'
    assert json.loads(page.inner_text("#mcp-json"))["mcpServers"][f"kernel-referee-{run_id}"]["url"] == mcp_url

    page.goto(f"/ui/runs/{run_id}")
    assert page.inner_text("#state") == "queued"
    assert page.inner_text("#queue").startswith("position 1 of 1")
    assert NOTE in page.inner_text("#facts")                 # shown as text, not markup
    page.screenshot(path=shots / "2-queued.png", full_page=True)

    play(first["mcp_url"], first["agent_token"])
    play(mcp_url, token, kernel("latency_us=40"))
    service.wait_state(run_id, ("finished",))

    page.goto(f"/ui/runs/{run_id}")
    assert page.inner_text("#state") == "finished"
    page.click("#report-link")
    assert page.inner_text("h1").startswith("kernel-referee report: matmul_f32")
    page.screenshot(path=shots / "3-report.png", full_page=True)

    page.goto(f"/ui/runs/{run_id}")
    page.click("#replay")
    page.wait_for_selector("#replay-decision", timeout=300_000)
    assert page.inner_text("#replay-decision") == "GO"
    page.fill("#review-note", "holds on every case")
    page.click("#approve")
    page.wait_for_selector("#decision")
    assert "approved" in page.inner_text("#decision") and "holds on every case" in page.inner_text("#decision")
    page.screenshot(path=shots / "4-approved.png", full_page=True)

    approvals = service.root / "guard-store" / "approvals"
    assert [p.name for p in approvals.iterdir()] == [f"matmul_f32-{run_id}"]
    run_dir = next((service.root / "runs" / run_id / "results").glob("run-*"))
    assert verify_run(run_dir).ok
    assert all(Path(shots / name).stat().st_size > 10_000 for name in
               ("1-created.png", "2-queued.png", "3-report.png", "4-approved.png"))
