"""A client that goes away mid-call: the attempt in flight runs to its verdict and is recorded, the server says
so in one line (no traceback, no audit error) and, over stdio, exits 0; a cancelled attempt stays counted."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx2
import pytest

from server.cli import main
from server.lifecycle import resume_run
from server.record_files import read_history
from tests.server_support import REPO, client, events, executor, kernel, new_run, ok, free_port

FAKE_SERVER = REPO / "tests" / "fake_server.py"
TOKEN = "test-token-0123456789-abcdefghij"
INITIALIZE = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}
SLOW_ATTEMPT = {"name": "record_attempt", "arguments": {"source": kernel("slow_s=2"), "rationale": "slow"},
                "_meta": {"progressToken": "attempt"}}
EXIT_BOUND_S = 60  # the attempt takes about 4 s with the fake; a server that hangs is caught well before this

# A client over stdio that starts a slow record_attempt, says so on stderr once the server reports progress on
# it (the attempt is claimed and running), and waits to be killed.
CLIENT = """
import json, sys
def send(message):
    sys.stdout.write(json.dumps(message) + "\\n")
    sys.stdout.flush()
def until(test):
    for line in sys.stdin:
        if test(json.loads(line)):
            return
    sys.exit("the server closed the pipe")
send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": json.loads(sys.argv[1])})
until(lambda m: m.get("id") == 1)
send({"jsonrpc": "2.0", "method": "notifications/initialized"})
send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": json.loads(sys.argv[2])})
# the attempt's own progress, not the wait for the new run's preparation (server/preparation.py) before it
until(lambda m: m.get("method") == "notifications/progress" and "preparation" not in m["params"].get("message", ""))
print("attempt running", file=sys.stderr, flush=True)
sys.stdin.read()
"""



def _wait_for(path: Path, text: str, process: subprocess.Popen, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in path.read_text():
        assert process.poll() is None, path.read_text()
        assert time.monotonic() < deadline, f"no {text!r} within {timeout_s} s"
        time.sleep(0.05)


def _assert_settled(run_dir: Path, stderr: str) -> None:
    """No traceback, no audit error; attempt 1 recorded with its own verdict; the folder verifies."""
    assert "Traceback" not in stderr and "AuditError" not in stderr, stderr
    assert [(e.attempt, e.verdict) for e in read_history(run_dir).attempts] == \
        [(0, "baseline"), (1, "valid-not-faster")]
    assert main(["verify", str(run_dir)]) == 0
    run = resume_run(run_dir, executor())
    assert run.attempts_used == 1
    run.close()
    assert not [e for e in events(run_dir) if e["kind"] == "attempt_interrupted"]


def test_a_client_killed_mid_attempt_over_stdio_leaves_the_attempt_recorded_and_the_server_exits_0(tmp_path):
    to_server_r, to_server_w = os.pipe()
    to_client_r, to_client_w = os.pipe()
    server_err, client_err = tmp_path / "server.stderr", tmp_path / "client.stderr"
    with server_err.open("wb") as s_err, client_err.open("wb") as c_err:
        server = subprocess.Popen([sys.executable, str(FAKE_SERVER), str(tmp_path / "results")], cwd=tmp_path,
                                  stdin=to_server_r, stdout=to_client_w, stderr=s_err)
        agent = subprocess.Popen([sys.executable, "-c", CLIENT, json.dumps(INITIALIZE), json.dumps(SLOW_ATTEMPT)],
                                 stdin=to_client_r, stdout=to_server_w, stderr=c_err)
    for fd in (to_server_r, to_server_w, to_client_r, to_client_w):
        os.close(fd)  # the two processes hold the only ends: killing the client closes its side
    try:
        _wait_for(client_err, "attempt running", agent)
        agent.kill()
        agent.wait(timeout=10)
        started = time.monotonic()
        returncode = server.wait(timeout=EXIT_BOUND_S)
    finally:
        for process in (server, agent):
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
    stderr = server_err.read_text()
    assert returncode == 0 and time.monotonic() - started < EXIT_BOUND_S, stderr
    assert "kernel-referee: the client went away" in stderr
    _assert_settled(tmp_path / "results" / "run-001", stderr)


def _post(url: str, headers: dict, message: dict) -> httpx2.Response:
    return httpx2.post(url, headers=headers, json={"jsonrpc": "2.0", **message}, timeout=30)


def _open_session(url: str) -> dict:
    headers = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json, text/event-stream",
               "Content-Type": "application/json"}
    answer = _post(url, headers, {"id": 1, "method": "initialize", "params": INITIALIZE})
    assert answer.status_code == 200, answer.text
    headers = {**headers, "mcp-session-id": answer.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
    assert _post(url, headers, {"method": "notifications/initialized"}).status_code == 202
    return headers


def _wait_until_accepting(port: int, server: subprocess.Popen, stderr: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert server.poll() is None and time.monotonic() < deadline, stderr.read_text()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)


def test_a_connection_dropped_mid_attempt_over_http_leaves_the_attempt_recorded(tmp_path):
    port, server_err = free_port(), tmp_path / "server.stderr"
    with server_err.open("wb") as err:
        server = subprocess.Popen([sys.executable, str(FAKE_SERVER), str(tmp_path / "results"), str(port)],
                                  cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                  env={**os.environ, "KERNEL_REFEREE_TOKEN": TOKEN})
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        _wait_until_accepting(port, server, server_err)
        headers = _open_session(url)
        body = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": SLOW_ATTEMPT}
        with httpx2.Client(timeout=30) as http, http.stream("POST", url, headers=headers, json=body) as answer:
            next(line for line in answer.iter_lines() if "notifications/progress" in line)
        # The connection is gone; another session sees the attempt counted, then its verdict.
        other = _open_session(url)
        deadline = time.monotonic() + EXIT_BOUND_S
        while (server.poll() is None and time.monotonic() < deadline
               and "valid-not-faster" not in _post(url, other, {"id": 3, "method": "resources/read",
                                                                  "params": {"uri": "referee://history.json"}}).text):
            time.sleep(0.2)
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=EXIT_BOUND_S)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=10)
    _assert_settled(tmp_path / "results" / "run-001", server_err.read_text())


@pytest.mark.anyio
async def test_a_cancelled_attempt_runs_to_its_verdict_and_stays_counted(tmp_path):
    run = new_run(tmp_path)
    async with client(run) as c:
        timed_before = run.executor.calls.count("time")
        with anyio.move_on_after(30) as waited:
            async with anyio.create_task_group() as group:
                group.start_soon(c.call_tool, "record_attempt", {"source": kernel("slow_s=2"), "rationale": "slow"})
                while run.executor.calls.count("time") == timed_before:
                    await anyio.sleep(0.02)
                group.cancel_scope.cancel()  # the client gives up on the call
        assert not waited.cancelled_caught
        assert run.executor.aborted == 0  # nothing of the attempt was stopped
        assert (await ok(c, "describe_task"))["budget"]["attempts_used"] == 1
        second = await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="after the cancel")
        assert (second["attempt"], second["budget"]["attempts_used"]) == (2, 2)
    run.close()
    assert [(e.attempt, e.verdict) for e in read_history(run.dir).attempts] == \
        [(0, "baseline"), (1, "valid-not-faster"), (2, "valid-faster")]
    assert main(["verify", str(run.dir)]) == 0


@pytest.mark.anyio
async def test_a_cancelled_probe_stops_its_job_and_is_counted(tmp_path):
    run = new_run(tmp_path)
    async with client(run) as c:
        candidate = (await ok(c, "compile_kernel", source=kernel("slow_s=60")))["candidate"]
        timed_before = run.executor.calls.count("time")
        started = time.monotonic()
        async with anyio.create_task_group() as group:
            group.start_soon(c.call_tool, "time_kernel", {"candidate_id": candidate})
            while run.executor.calls.count("time") == timed_before:  # the candidate is being timed
                await anyio.sleep(0.02)
            group.cancel_scope.cancel()
        await ok(c, "compile_kernel", source=kernel())  # the gate opens once the cancelled probe has ended
        assert (await ok(c, "describe_task"))["budget"]["probes_left_in_window"] == 19
        assert run.executor.aborted == 1 and time.monotonic() - started < 30
    run.close()
    assert [e["data"]["tool"] for e in events(run.dir) if e["kind"] == "probe_done"] == ["time_kernel"]
