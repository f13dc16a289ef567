"""How the MCP server is reached: stdio for a local agent, or streamable HTTP guarded by a bearer token.

The MCP server takes its auth settings at construction, so the factory asks this module for them
(`http_auth`) and then hands the built server to `run`.

Over HTTP the SDK checks the bearer token before the Host/Origin headers: a request with no valid
token gets 401 whatever its Host, and only an authenticated request can see 421 (Host) or 403
(Origin). Nothing here writes to stdout, which belongs to the stdio protocol.
"""

from __future__ import annotations

import copy
import errno
import hmac
import ipaddress
import os
import secrets
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from mcp.server.auth.provider import AccessToken, TokenVerifier
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings

TOKEN_ENV = "KERNEL_REFEREE_TOKEN"
SCOPE = "kernel-referee"
CLIENT_ID = "kernel-referee-client"
MCP_PATH = "/mcp"
MIN_TOKEN_LENGTH = 16

_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
LISTEN_BACKLOG = 64
_WILDCARD_HOSTS = ("0.0.0.0", "::", "")


class StaticTokenVerifier(TokenVerifier):
    """Accepts exactly one token, the one the user was shown or set in the environment."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("the bearer token must not be empty")
        self._expected = token.encode("utf-8")

    async def verify_token(self, token: str) -> AccessToken | None:
        # Bytes, because compare_digest refuses non-ASCII str and a client may send anything.
        presented = token.encode("utf-8", errors="surrogatepass")
        if not hmac.compare_digest(presented, self._expected):
            return None
        return AccessToken(token=token, client_id=CLIENT_ID, scopes=[SCOPE], expires_at=None)


def resolve_token(env: Mapping[str, str] = os.environ) -> tuple[str, bool]:
    """The token to require: the environment's if set, else a fresh random one (then generated is True)."""
    token = env.get(TOKEN_ENV, "").strip()
    if not token:
        return secrets.token_urlsafe(32), True
    if len(token) < MIN_TOKEN_LENGTH:
        raise ValueError(
            f"{TOKEN_ENV} is {len(token)} characters long; use at least {MIN_TOKEN_LENGTH} "
            f"(e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(32))'), or unset it to get a generated one"
        )
    if not (token.isascii() and token.isprintable()) or " " in token:
        raise ValueError(f"{TOKEN_ENV} must be printable ASCII without spaces, so it can travel in an HTTP header")
    return token, False


def _url_host(host: str) -> str:
    """The host as written inside a URL: IPv6 literals need brackets."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


def base_url(host: str, port: int) -> str:
    return f"http://{_url_host(host)}:{port}"


def mcp_url(host: str, port: int) -> str:
    """The endpoint a client connects to."""
    return base_url(host, port) + MCP_PATH


def http_auth(token: str, host: str, port: int) -> dict[str, Any]:
    """Keyword arguments for MCPServer(...) that make every HTTP request carry `Authorization: Bearer TOKEN`.

    With resource_server_url the SDK publishes the protected resource metadata (RFC 9728) at
    /.well-known/oauth-protected-resource/mcp and names it in every 401's `WWW-Authenticate: Bearer
    resource_metadata="..."`: a client without the token learns that this resource wants a bearer
    token, where without it a client went looking for OAuth endpoints and reported "Dynamic Client
    Registration rejected (404)". The token is the one static token, checked by StaticTokenVerifier
    itself, so the SDK's check of a token's RFC 8707 audience is off.
    """
    auth = AuthSettings(issuer_url=base_url(host, port), resource_server_url=mcp_url(host, port),
                        required_scopes=[SCOPE], validate_token_resource=False)
    return {"token_verifier": StaticTokenVerifier(token), "auth": auth}


def is_loopback(host: str) -> bool:
    if host.strip("[]") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def transport_security(host: str, port: int, extra_hosts: Sequence[str] = ()) -> TransportSecuritySettings:
    """Host/Origin checks against DNS rebinding, pinned to the port actually served.

    Always explicit: the SDK turns these checks on by itself only for three literal loopback
    spellings, and leaves every other bind address (0.0.0.0, a LAN address) unprotected.
    """
    names = list(_LOOPBACK_NAMES)
    if host not in _WILDCARD_HOSTS:
        names.append(_url_host(host))
    if not is_loopback(host):
        names += [socket.gethostname(), socket.getfqdn()]
    names += [_url_host(name) for name in extra_hosts]
    names = list(dict.fromkeys(names))
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{name}:{port}" for name in names],
        allowed_origins=[f"http://{name}:{port}" for name in names],
    )


class PortInUse(Exception):
    """The HTTP port is taken by another process: nothing was made, and no client is sent there."""


def loopback_refusal(host: str) -> str | None:
    """Why `host` is not served (None for a loopback address): the command line has no way to serve beyond
    loopback, and says so before anything is made."""
    if is_loopback(host):
        return None
    return (f"refusing to serve on {host!r}: the token travels in clear over plain HTTP and the server runs code "
            "on this machine's GPU, so only loopback (127.0.0.1, localhost, ::1) is served; reach a remote GPU host "
            "through an SSH tunnel to its loopback port")


def listen(host: str, port: int) -> socket.socket:
    """The HTTP server's socket, bound and listening now: taken before the run is made, and held until the
    server serves on it, so a busy port is refused before anything exists and no other process can take the
    port in between (a client that connects meanwhile waits in the backlog)."""
    address = host.strip("[]")
    sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
    try:
        # As uvicorn does: connections of a server that just stopped (TIME_WAIT) do not hold the port. A port
        # another socket listens on is still refused.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(f"port {port} on {host} is in use by another process (another server?): nothing was "
                            "started; choose a free one with --port") from None
        raise
    return sock


def _check_http_args(server: MCPServer, host: str, port: int, allow_remote: bool) -> None:
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is not a TCP port (1-65535)")
    refusal = None if allow_remote else loopback_refusal(host)
    if refusal is not None:
        raise ValueError(f"{refusal} (or allow_remote set)")
    if server.settings.auth is None:
        raise ValueError("the HTTP transport needs bearer-token auth: build the server with MCPServer(**http_auth(...))")


def _serve_stdio(server: MCPServer) -> None:
    """Serve over stdin and stdout until the client leaves. A client that goes while a call is in flight (its
    process killed, its pipes closed) breaks the pipe: the server says so in one line and ends normally, once
    the call in flight has ended and been recorded (server/call_gate.py waits for it)."""
    try:
        server.run("stdio")
    except* (BrokenPipeError, ConnectionResetError):
        # What is still buffered for stdout would fail again at exit: it goes nowhere now.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        _stderr("kernel-referee: the client went away (its end of the stdio pipe is closed); the call in flight "
                "was seen to its end and recorded")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _announce(host: str, port: int, token: str | None, token_generated: bool) -> None:
    """Tell the user where to connect, on stderr; the token itself only when nobody else knows it."""
    url = mcp_url(host, port)
    shown = token if (token and token_generated) else f"${TOKEN_ENV}"
    _stderr(f"kernel-referee: serving MCP over streamable HTTP at {url}")
    if token_generated:
        _stderr(f"kernel-referee: generated bearer token (set {TOKEN_ENV} to choose your own): {token}")
    _stderr("kernel-referee: to connect Claude Code:")
    _stderr(f'claude mcp add --transport http kernel-referee {url} --header "Authorization: Bearer {shown}"')
    if not is_loopback(host):
        _stderr("kernel-referee: warning: serving beyond loopback over plain HTTP; the token can be sniffed")


# How long the server keeps an idle keep-alive connection open: longer than clients keep theirs (httpx and Node
# drop an idle connection after 4-5 s), so the client always closes first. With uvicorn's default (5 s) a client
# could send its next request on a connection the server was closing at that moment, and lose it (ReadError).
KEEP_ALIVE_S = 65


def _stderr_log_config() -> dict[str, Any]:
    """uvicorn's logging, with access lines sent to stderr: by default they go to stdout."""
    import uvicorn.config  # uvicorn loads only for the HTTP transport

    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    for handler in config["handlers"].values():
        handler["stream"] = "ext://sys.stderr"
    return config


def serve_app(app, host: str, port: int, log_level: str, listener: socket.socket | None) -> None:
    """Serve an ASGI app with uvicorn until stopped, its log on stderr, on `listener` where `listen` bound it (else
    uvicorn binds `host` and `port`): `serve --transport http`'s MCP app and the audit service's."""
    import uvicorn  # uvicorn loads only for what is served over HTTP

    config = uvicorn.Config(app, host=host.strip("[]"), port=port, log_level=log_level,
                            log_config=_stderr_log_config(), timeout_keep_alive=KEEP_ALIVE_S)
    uvicorn.Server(config).run(sockets=[listener] if listener is not None else None)


def _serve_http(server: MCPServer, host: str, port: int, security: TransportSecuritySettings,
                listener: socket.socket | None) -> None:
    # Not server.run("streamable-http"): that uses uvicorn's default logging, which writes to stdout.
    app = server.streamable_http_app(streamable_http_path=MCP_PATH, transport_security=security, host=host)
    serve_app(app, host, port, server.settings.log_level.lower(), listener)


def run(
    server: MCPServer,
    transport: Literal["stdio", "http"],
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    token_generated: bool = False,
    allow_remote: bool = False,
    extra_hosts: Sequence[str] = (),
    listener: socket.socket | None = None,
) -> None:
    """Serve until stopped. `token` is only shown to the user; the server checks the one given to http_auth.
    `listener`: the socket `listen` took for `host` and `port` (else uvicorn binds them itself).

    `extra_hosts` are further names (without port) that clients use to reach a remote server, as
    they will appear in the Host header.
    """
    if transport == "stdio":
        _serve_stdio(server)
        return
    if transport != "http":
        raise ValueError(f"unknown transport {transport!r}: use 'stdio' or 'http'")
    _check_http_args(server, host, port, allow_remote)
    _announce(host, port, token, token_generated)
    _serve_http(server, host, port, transport_security(host, port, extra_hosts), listener)
