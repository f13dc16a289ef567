"""The transports: bearer-token auth, Host/Origin checks and a stdout kept clean, against a real server."""

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
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel

from server import transport
from server.transport import (
    CLIENT_ID,
    SCOPE,
    TOKEN_ENV,
    StaticTokenVerifier,
    http_auth,
    resolve_token,
    run,
    transport_security,
)
from tests.server_support import free_port

REPO = Path(__file__).resolve().parents[1]
TOKEN = "test-token-0123456789-abcdefghij"
STARTUP_TIMEOUT_S = 20.0

# A tiny server started through server.transport.run, exactly as the real command will.
SERVER_SCRIPT = """
import sys
from pydantic import BaseModel
from mcp.server.mcpserver import MCPServer
from server.transport import http_auth, run


class Pong(BaseModel):
    ok: bool
    message: str


mode, port, token = sys.argv[1], int(sys.argv[2]), sys.argv[3]
kwargs = http_auth(token, "127.0.0.1", port) if mode == "http" else {}
server = MCPServer("ping-test", **kwargs)


@server.tool()
def ping(message: str = "pong") -> Pong:
    return Pong(ok=True, message=message)


run(server, mode, port=port, token=token, token_generated=True)
"""


class Pong(BaseModel):
    ok: bool


def _ping_server(**kwargs) -> MCPServer:
    server = MCPServer("ping-test", **kwargs)

    @server.tool()
    def ping() -> Pong:
        return Pong(ok=True)

    return server


def _child_env() -> dict[str, str]:
    # Unbuffered, so anything written to stdout would already be in the file when it is read.
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


def _wait_until_accepting(proc: subprocess.Popen, port: int, stderr_path: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}: {stderr_path.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"server did not accept on port {port} within {STARTUP_TIMEOUT_S} s: {stderr_path.read_text()}")


class LiveServer:
    def __init__(self, port: int, stdout: Path, stderr: Path) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}/mcp"
        self.stdout = stdout
        self.stderr = stderr


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    folder = tmp_path_factory.mktemp("http-server")
    script = folder / "serve.py"
    script.write_text(SERVER_SCRIPT)
    port = free_port()
    stdout, stderr = folder / "stdout.txt", folder / "stderr.txt"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(script), "http", str(port), TOKEN],
            cwd=REPO, env=_child_env(), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
        )
    try:
        _wait_until_accepting(proc, port, stderr)
        yield LiveServer(port, stdout, stderr)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _initialize_body() -> dict:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"},
        },
    }


def _post_initialize(live: LiveServer, **headers: str) -> httpx2.Response:
    base = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    return httpx2.post(live.url, json=_initialize_body(), headers={**base, **headers}, timeout=10)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_initialize_without_a_token_is_unauthorized(live):
    response = _post_initialize(live)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")


def test_a_401_names_the_protected_resource_metadata_which_answers_without_a_token(live):
    # RFC 9728: a client without the token learns from the 401 where to read what this resource wants.
    header = _post_initialize(live).headers["www-authenticate"]
    metadata_url = f"http://127.0.0.1:{live.port}/.well-known/oauth-protected-resource/mcp"
    assert header.startswith("Bearer ") and f'resource_metadata="{metadata_url}"' in header, header
    metadata = httpx2.get(metadata_url, timeout=10)
    assert metadata.status_code == 200
    document = metadata.json()
    assert document["resource"] == live.url
    assert document["bearer_methods_supported"] == ["header"]
    assert document["scopes_supported"] == [SCOPE]
    assert _post_initialize(live, **_bearer("wrong-token-0123456789-abcdefghij")).headers[
        "www-authenticate"].endswith(f'resource_metadata="{metadata_url}"')


def test_initialize_with_a_wrong_token_is_unauthorized(live):
    assert _post_initialize(live, **_bearer("wrong-token-0123456789-abcdefghij")).status_code == 401
    assert _post_initialize(live, **_bearer(TOKEN[:-1])).status_code == 401


def test_a_foreign_host_header_is_refused(live):
    assert _post_initialize(live, Host="evil.example", **_bearer(TOKEN)).status_code == 421


def test_a_host_header_with_another_port_is_refused(live):
    assert _post_initialize(live, Host="127.0.0.1:1", **_bearer(TOKEN)).status_code == 421


def test_a_foreign_origin_is_refused(live):
    assert _post_initialize(live, Origin="http://evil.example", **_bearer(TOKEN)).status_code == 403


def test_the_unauthenticated_check_comes_before_the_host_check(live):
    # Whoever lacks the token learns nothing from the Host/Origin checks.
    assert _post_initialize(live, Host="evil.example").status_code == 401


async def _session_over_http(url: str, token: str) -> tuple[list[str], object]:
    async with httpx2.AsyncClient(headers=_bearer(token), timeout=30) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            tools = await client.list_tools()
            result = await client.call_tool("ping", {"message": "hello"})
            return [tool.name for tool in tools.tools], result


def test_a_real_session_with_the_right_token(live):
    names, result = anyio.run(_session_over_http, live.url, TOKEN)
    assert names == ["ping"]
    assert not result.is_error
    assert result.structured_content == {"ok": True, "message": "hello"}


def test_http_banner_goes_to_stderr_and_stdout_stays_empty(live):
    # A served request first: uvicorn's default access log would go to stdout.
    assert _post_initialize(live).status_code == 401
    time.sleep(0.2)
    assert live.stdout.read_text() == ""
    banner = live.stderr.read_text()
    assert live.url in banner
    assert (
        f'claude mcp add --transport http kernel-referee {live.url} --header "Authorization: Bearer {TOKEN}"'
        in banner
    )


async def _session_over_stdio(script: Path) -> tuple[list[str], object]:
    params = StdioServerParameters(command=sys.executable, args=[str(script), "stdio", "0", TOKEN],
                                   cwd=str(REPO), env=_child_env())
    async with Client(params) as client:
        tools = await client.list_tools()
        result = await client.call_tool("ping", {})
        return [tool.name for tool in tools.tools], result


def test_stdio_serves_without_auth(tmp_path):
    script = tmp_path / "serve.py"
    script.write_text(SERVER_SCRIPT)
    names, result = anyio.run(_session_over_stdio, script)
    assert names == ["ping"]
    assert result.structured_content == {"ok": True, "message": "pong"}


def test_verifier_accepts_only_its_token():
    verifier = StaticTokenVerifier(TOKEN)
    access = anyio.run(verifier.verify_token, TOKEN)
    assert access is not None
    assert (access.client_id, access.scopes, access.expires_at) == (CLIENT_ID, [SCOPE], None)
    for other in ("", TOKEN[:-1], TOKEN + "x", "wrong-" + TOKEN[6:], "tëst-token-0123456789-abcdefghij"):
        assert anyio.run(verifier.verify_token, other) is None


def test_verifier_refuses_an_empty_token():
    with pytest.raises(ValueError):
        StaticTokenVerifier("")


def test_resolve_token_uses_the_environment():
    assert resolve_token({TOKEN_ENV: TOKEN}) == (TOKEN, False)


def test_resolve_token_refuses_a_short_token():
    with pytest.raises(ValueError, match="at least 16"):
        resolve_token({TOKEN_ENV: "short"})


def test_resolve_token_refuses_a_token_unfit_for_a_header():
    with pytest.raises(ValueError, match="printable ASCII"):
        resolve_token({TOKEN_ENV: "a token with spaces inside it"})


@pytest.mark.parametrize("env", [{}, {TOKEN_ENV: ""}])
def test_resolve_token_generates_one_when_unset(env):
    token, generated = resolve_token(env)
    assert generated
    assert len(token) == 43
    assert resolve_token(env)[0] != token


def test_http_auth_configures_a_bearer_only_server():
    kwargs = http_auth(TOKEN, "127.0.0.1", 8765)
    assert isinstance(kwargs["token_verifier"], StaticTokenVerifier)
    assert str(kwargs["auth"].resource_server_url) == "http://127.0.0.1:8765/mcp"
    assert kwargs["auth"].validate_token_resource is False  # the static token is checked by the verifier itself
    assert kwargs["auth"].required_scopes == [SCOPE]
    assert str(kwargs["auth"].issuer_url) == "http://127.0.0.1:8765"
    assert _ping_server(**kwargs).settings.auth is kwargs["auth"]


def test_http_refuses_a_non_loopback_host_without_writing_to_stdout(capfd):
    server = _ping_server(**http_auth(TOKEN, "0.0.0.0", 8765))
    with pytest.raises(ValueError, match="allow_remote"):
        run(server, "http", host="0.0.0.0", port=8765, token=TOKEN, token_generated=True)
    out, err = capfd.readouterr()
    assert out == ""
    assert TOKEN not in err


def test_http_refuses_a_server_built_without_auth(capfd):
    with pytest.raises(ValueError, match="http_auth"):
        run(_ping_server(), "http", port=8765)
    assert capfd.readouterr().out == ""


def test_an_unknown_transport_is_refused():
    with pytest.raises(ValueError, match="unknown transport"):
        run(_ping_server(), "carrier-pigeon")  # type: ignore[arg-type]


def test_loopback_protection_is_pinned_to_the_served_port():
    security = transport_security("127.0.0.1", 8765)
    assert security.enable_dns_rebinding_protection
    assert "127.0.0.1:8765" in security.allowed_hosts
    assert "localhost:8765" in security.allowed_hosts
    assert "http://localhost:8765" in security.allowed_origins
    assert all(not host.endswith(":*") for host in security.allowed_hosts)


def test_remote_protection_stays_on_and_names_the_machine():
    security = transport_security("0.0.0.0", 9000, extra_hosts=["gpu-box.lan"])
    assert security.enable_dns_rebinding_protection
    assert "gpu-box.lan:9000" in security.allowed_hosts
    assert f"{socket.gethostname()}:9000" in security.allowed_hosts
    assert "0.0.0.0:9000" not in security.allowed_hosts
    assert "[::1]:9000" in transport_security("::1", 9000).allowed_hosts


def test_mcp_url_brackets_ipv6():
    assert transport.mcp_url("::1", 8765) == "http://[::1]:8765/mcp"
    assert transport.mcp_url("127.0.0.1", 8765) == "http://127.0.0.1:8765/mcp"
