"""A new run is prepared behind a server that answers at once: `initialize` comes back within 2 s however long
the reference outputs and the baseline take, describe_task says how the preparation goes, a tool that needs the
run is refused with nothing spent until it is ready, and a start killed during the preparation leaves no run
folder behind (the next start sweeps what it left and makes the run)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from harness.gpu_lease import LEASE_DIR_ENV
from server.lifecycle import PREPARING
from tests.server_support import REPO, events, kernel, ok, read_json, refused

FAKE_SERVER = str(REPO / "tests" / "fake_server.py")
# The server's own time before it answers `initialize`, beyond starting Python and importing the referee (which
# bench/startup.py measures with the rest on a GPU host: under 2 s in all).
INITIALIZE_BOUND_S = 1.5
INITIALIZE = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}
# A call's wait for the preparation, and a preparation longer than two of them: both calls made at once are refused.
WAIT_S = 2.0
SLOW_PREPARATION_S = 3 * WAIT_S + 2


def _environment(prepare_s: float) -> dict:
    return {LEASE_DIR_ENV: os.environ[LEASE_DIR_ENV], "FAKE_SERVER_PREPARE_S": str(prepare_s),
            "FAKE_SERVER_PREPARE_WAIT_S": str(WAIT_S)}


def _server(results: Path, errlog, prepare_s: float) -> Client:
    params = StdioServerParameters(command=sys.executable, args=[FAKE_SERVER, str(results)], cwd=str(results.parent),
                                   env=_environment(prepare_s))
    return Client(stdio_client(params, errlog=errlog), cache=None, read_timeout_seconds=60)


def _imports_s() -> float:
    """What starting Python and importing the fake server takes here, answering nothing."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import tests.fake_server"], cwd=REPO, check=True, timeout=60)
    return time.monotonic() - started


def _runs(results: Path) -> list[str]:
    return sorted(p.name for p in results.iterdir()) if results.exists() else []


async def _until_ready(c: Client, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        described = await ok(c, "describe_task")
        if described["preparation"]["state"] != "preparing":
            return described
        assert time.monotonic() < deadline, described["preparation"]
        time.sleep(0.2)


@pytest.mark.anyio
async def test_initialize_answers_at_once_and_nothing_is_spent_before_the_run_is_ready(tmp_path):
    results = tmp_path / "results"
    imports_s = _imports_s()
    started = time.monotonic()
    with (tmp_path / "server.err").open("w+") as errlog:
        async with _server(results, errlog, SLOW_PREPARATION_S) as c:
            initialize_s = time.monotonic() - started
            assert initialize_s - imports_s < INITIALIZE_BOUND_S, (initialize_s, imports_s)
            described = await ok(c, "describe_task")
            status = described["preparation"]
            assert status["state"] == "preparing" and status["step"] and status["expected_left_s"] > 0, status
            assert described["baseline_score_ms"] is None and described["budget"]["attempts_used"] == 0
            assert [case["name"] for case in described["cases"]]  # the task itself is known at once
            assert _runs(results) and not any(name.startswith("run-") for name in _runs(results))

            progress: list[str] = []

            async def seen(done, total, message):
                progress.append(message)

            result = await c.call_tool("record_attempt", {"source": kernel("latency_us=50"), "rationale": "early"},
                                       progress_callback=seen)
            assert result.is_error
            message = result.content[0].text
            assert "preparing, ready in about" in message and "Nothing was spent" in message, message
            assert any("waiting for the run's preparation" in m for m in progress), progress
            why = await refused(c, "compile_kernel", source=kernel())
            assert why.startswith("preparing, ready in about"), why

            ready = await _until_ready(c, 60)
            assert ready["preparation"]["state"] == "ready" and ready["baseline_score_ms"] > 0
            budget = ready["budget"]
            assert (budget["attempts_used"], budget["probes_left_in_window"]) == (0, 20), budget
            run_dir = results / "run-001"
            tools = [e["data"]["tool"] for e in events(run_dir) if e["kind"] == "call"]
            assert "record_attempt" not in tools and "compile_kernel" not in tools, tools  # refused unlogged
            assert not (run_dir / "attempts" / "001.cu").exists()
            one = await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="once ready")
            assert (one["attempt"], one["verdict"]) == (1, "valid-faster")
        errlog.seek(0)
        assert "preparing a run of matmul_f32" in errlog.read()
    assert _runs(results) == ["run-001"]
    assert read_json(results / "run-001" / "history.json")["attempts"][0]["verdict"] == "baseline"


def _start(results: Path, prepare_s: float, stderr=subprocess.DEVNULL) -> subprocess.Popen:
    """A server on `results` over stdio, initialized: it answered `initialize`."""
    server = subprocess.Popen([sys.executable, FAKE_SERVER, str(results)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=stderr, cwd=results.parent,
                              env={**os.environ, **_environment(prepare_s)}, text=True)
    server.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE}) + "\n")
    server.stdin.flush()
    assert json.loads(server.stdout.readline())["id"] == 1
    return server


def test_a_start_killed_during_the_preparation_leaves_no_run_and_the_next_start_makes_it(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    server = _start(results, 60)
    time.sleep(0.5)  # into the preparation
    server.kill()
    server.wait(timeout=30)
    left = _runs(results)
    assert left and all(name.startswith(PREPARING) for name in left), left  # no run-NNN

    again = _start(results, 0)
    try:
        deadline = time.monotonic() + 60
        while _runs(results) != ["run-001"]:  # prepared, moved into place, the leftover swept
            assert time.monotonic() < deadline and again.poll() is None, _runs(results)
            time.sleep(0.1)
    finally:
        again.send_signal(signal.SIGTERM)
        again.wait(timeout=30)
    assert read_json(results / "run-001" / "history.json")["attempts"][0]["verdict"] == "baseline"


@pytest.mark.timeout(300)
def test_starts_killed_at_many_moments_leave_only_leftovers_or_a_run_that_verifies(tmp_path):
    """kill -9 at moments spread over a quick preparation and over the resumptions that follow it: each time, what
    is left is a `.preparing-*` leftover or run-001 whole (it verifies); the next start goes on from there."""
    from server.verify import verify_run

    results = tmp_path / "results"
    results.mkdir()
    for delay_s in (0.0, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.8, 1.2, 2.0):
        server = _start(results, 0)
        time.sleep(delay_s)
        server.kill()
        server.wait(timeout=30)
        left = _runs(results)
        assert all(name.startswith(PREPARING) or name == "run-001" for name in left), (delay_s, left)
        if "run-001" in left:
            report = verify_run(results / "run-001")
            assert report.ok, (delay_s, report.problems)
    again = _start(results, 0)
    try:
        deadline = time.monotonic() + 60
        while _runs(results) != ["run-001"]:
            assert time.monotonic() < deadline and again.poll() is None, _runs(results)
            time.sleep(0.1)
    finally:
        again.send_signal(signal.SIGTERM)
        again.wait(timeout=30)
    assert verify_run(results / "run-001").ok
    attempts = read_json(results / "run-001" / "history.json")["attempts"]
    assert [a["verdict"] for a in attempts] == ["baseline"]  # one baseline, however many starts


def test_a_client_that_leaves_during_the_preparation_leaves_no_folder(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    with (tmp_path / "server.err").open("w+") as errlog:
        server = _start(results, 60, stderr=errlog)
        time.sleep(0.5)
        server.stdin.close()  # the client leaves: the preparation stops and its folder goes
        assert server.wait(timeout=30) == 0
        errlog.seek(0)
        said = errlog.read()
    assert _runs(results) == []
    # The stop is said as the stop; the workers it closed are not blamed on the task
    assert "the client left before the run was prepared: stopped; no run was made" in said, said
    assert "could not be prepared" not in said, said
