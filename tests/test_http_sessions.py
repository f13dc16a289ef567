"""Two clients of one HTTP server (tests/fake_server.py: the real server and run folder, the fake executor): what
one session asks for (its log level) is its own."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from server.transport import TOKEN_ENV
from tests.server_support import kernel, free_port

REPO = Path(__file__).resolve().parents[1]
TOKEN = "sessions-token-0123456789-abcdef"
STARTUP_TIMEOUT_S = 60.0
# The client's own calls of the deprecated logging capability warn; the server's must not.
DEPRECATED_LOGGING = "ignore:The logging capability is deprecated:mcp.shared.exceptions.MCPDeprecationWarning"


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    folder = tmp_path_factory.mktemp("http-sessions")
    port = free_port()
    env = {**os.environ, TOKEN_ENV: TOKEN, "PYTHONPATH": str(REPO)}
    with (folder / "stderr.txt").open("wb") as err:
        proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "fake_server.py"), str(folder / "results"),
                                 str(port)], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited with {proc.returncode}: {(folder / 'stderr.txt').read_text()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"server did not accept within {STARTUP_TIMEOUT_S} s")
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _session(url: str, http: httpx2.AsyncClient, received: list) -> Client:
    async def on_log(params) -> None:
        received.append((params.level, params.data))

    # A client of the 2025 protocol: it asks for log messages with logging/setLevel, once per session.
    return Client(streamable_http_client(url, http_client=http), mode="legacy", logging_callback=on_log)


@pytest.mark.filterwarnings(DEPRECATED_LOGGING)
def test_a_log_level_set_by_one_http_session_is_that_sessions_alone(url):
    async def drive():
        talkative, quiet, unasked = [], [], []
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as http:
            async with _session(url, http, talkative) as a, _session(url, http, quiet) as b, \
                    _session(url, http, unasked) as c:
                await a.set_logging_level("info")
                await b.set_logging_level("error")
                for session, mark in ((a, "a"), (b, "b"), (c, "c")):
                    result = await session.call_tool("time_kernel", {"source": kernel(f"latency_us=50", mark)})
                    assert not result.is_error, result.content[0].text
                await b.set_logging_level("debug")  # b's change leaves a's level and c's silence as they are
                result = await c.call_tool("validate", {"source": kernel("latency_us=50", "c2")})
                assert not result.is_error, result.content[0].text
        return talkative, quiet, unasked

    talkative, quiet, unasked = anyio.run(drive, backend="asyncio")
    assert talkative and {level for level, _ in talkative} == {"info"}
    assert "timed" in [data for _, data in talkative]
    assert quiet == [] and unasked == []
