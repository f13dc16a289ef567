"""`serve` refuses what it cannot serve before anything is made: a busy port, a host beyond loopback, a run folder
that is not there, a malformed --gpu. One line on stderr, the documented exit code (README, "Exit codes"), no
run folder, and no GPU looked for first (these run on machines without one)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx2
import pytest

from server import transport
from server.cli_args import EXIT_PORT_IN_USE, EXIT_USAGE
from tests.cli_support import REPO, one_line_error, run_cli

MATMUL = REPO / "cases" / "matmul_f32"


def _serve(tmp_path, *args: str):
    return run_cli("serve", *args, "--results", tmp_path / "results", cwd=tmp_path,
                   timeout=120)


def _nothing_made(tmp_path) -> None:
    assert not (tmp_path / "results").exists(), sorted((tmp_path / "results").rglob("*"))


@pytest.mark.parametrize("listening", [True, False], ids=["listening", "bound"])
def test_a_busy_port_is_refused_before_a_run_is_made(tmp_path, listening):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        if listening:
            taken.listen()
        port = taken.getsockname()[1]
        done = _serve(tmp_path, "--task", str(MATMUL), "--transport", "http", "--port", str(port))
    assert done.returncode == EXIT_PORT_IN_USE, done.stderr
    assert done.stdout == ""
    line = one_line_error(done)
    assert line.startswith(f"kernel-referee serve: port {port} on 127.0.0.1 is in use by another process"), line
    assert "claude mcp add" not in done.stderr and "GPU" not in line
    _nothing_made(tmp_path)


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.7", "::", "gpu-box.example"])
def test_a_host_beyond_loopback_is_refused_before_a_run_is_made(tmp_path, host):
    done = _serve(tmp_path, "--task", str(MATMUL), "--transport", "http", "--host", host)
    assert done.returncode == EXIT_USAGE and done.stdout == ""
    assert one_line_error(done).startswith(f"kernel-referee serve: refusing to serve on {host!r}: ")
    _nothing_made(tmp_path)


def test_a_missing_run_folder_is_named_not_the_missing_gpu(tmp_path):
    missing = tmp_path / "run-404"
    done = _serve(tmp_path, "--run", str(missing))
    assert done.returncode == EXIT_USAGE
    assert one_line_error(done) == f"kernel-referee serve: {missing}: no such run folder"
    not_a_run = _serve(tmp_path, "--run", str(tmp_path))
    assert not_a_run.returncode == EXIT_USAGE
    assert one_line_error(not_a_run).endswith("not a run folder (no run.json, lock.json or events.jsonl)")
    _nothing_made(tmp_path)


def test_a_malformed_gpu_is_refused_before_the_gpu_is_looked_for(tmp_path):
    done = _serve(tmp_path, "--task", str(MATMUL), "--gpu", "first")
    assert done.returncode == EXIT_USAGE
    assert one_line_error(done).startswith("kernel-referee serve: --gpu 'first' is neither a GPU index")
    _nothing_made(tmp_path)


def test_the_port_is_held_from_listen_until_released():
    with transport.listen("127.0.0.1", 0) as held:
        port = held.getsockname()[1]
        with pytest.raises(transport.PortInUse, match=f"port {port} on 127.0.0.1 is in use"):
            transport.listen("127.0.0.1", port)
        with pytest.raises(transport.PortInUse):
            transport.listen("localhost", port)
    transport.listen("127.0.0.1", port).close()  # free again once released


# The port taken first, then a pause where the run is made, then served on the held socket.
HELD_SERVER = """
import sys, time
from mcp.server.mcpserver import MCPServer
from server.transport import http_auth, listen, run

port, token = int(sys.argv[1]), sys.argv[2]
held = listen("127.0.0.1", port)
time.sleep(1.0)
run(MCPServer("held", **http_auth(token, "127.0.0.1", port)), "http", port=port, token=token, listener=held)
"""


def test_a_client_that_connects_while_the_run_is_made_is_served_on_the_held_port(tmp_path):
    token = "held-token-0123456789-abcdefghij"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = tmp_path / "held.py"
    script.write_text(HELD_SERVER)
    server = subprocess.Popen([sys.executable, str(script), str(port), token], cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while True:  # listening from the first moment: the connection is accepted before uvicorn starts
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "the port was never taken"
                time.sleep(0.05)
        body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}}
        response = httpx2.post(f"http://127.0.0.1:{port}/mcp", json=body, timeout=20, headers={
            "Accept": "application/json, text/event-stream", "Authorization": f"Bearer {token}"})
        assert response.status_code == 200, response.text
    finally:
        server.kill()
        server.wait(timeout=10)
