"""Who may do what: the admin (a token from $KERNEL_REFEREE_ADMIN_TOKEN, else one generated and printed once),
reviewers (tokens the admin issues, each naming its team) and agents (one token per run, shown once, that run
only). Only tokens' SHA-256 are stored. An agent token is bound to its run's MCP endpoint (its RFC 8707
audience): the MCP SDK's bearer check refuses it on any other run's endpoint, and `principal` refuses it
everywhere but its own run's routes."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mcp.server.auth.provider import AccessToken, TokenVerifier
from starlette.requests import HTTPConnection

from service.records import Role, TokenFile, TokenRecord, now_iso, read_record, write_atomic

ADMIN_TOKEN_ENV = "KERNEL_REFEREE_ADMIN_TOKEN"
MIN_TOKEN_LENGTH = 16
SCOPE = "kernel-referee"
TOKENS = "tokens.json"


@dataclass(frozen=True)
class Principal:
    role: Role
    owner: str
    run_id: str | None = None

    def may_read(self, team: str, run_id: str) -> bool:
        """Whether this principal may see run `run_id` of `team`: the admin any, a reviewer its team's, an agent
        its own run only."""
        if self.role is Role.ADMIN:
            return True
        if self.role is Role.AGENT:
            return self.run_id == run_id
        return self.owner == team


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", errors="surrogatepass")).hexdigest()


def new_token() -> str:
    return "krt_" + secrets.token_urlsafe(32)


class TokenStore:
    """The service's tokens (ROOT/tokens.json), hashed; the admin's from the environment is never written."""

    def __init__(self, root: Path, env: Mapping[str, str] = os.environ):
        self.path = root / TOKENS
        self._lock = threading.Lock()
        self._file = read_record(self.path, TokenFile) if self.path.exists() else TokenFile()
        self._by_hash = {t.sha256: t for t in self._file.tokens}
        self._env_admin = env.get(ADMIN_TOKEN_ENV, "").strip()
        if self._env_admin and len(self._env_admin) < MIN_TOKEN_LENGTH:
            raise ValueError(f"{ADMIN_TOKEN_ENV} is shorter than {MIN_TOKEN_LENGTH} characters")

    def admin_token_to_show(self) -> str | None:
        """A generated admin token, to print once, where the environment names none and none was generated
        before (its hash is kept: it stays valid across restarts, and is never shown again)."""
        if self._env_admin or any(t.role is Role.ADMIN for t in self._file.tokens):
            return None
        return self.issue(Role.ADMIN, "admin")

    def issue(self, role: Role, owner: str, run_id: str | None = None) -> str:
        """A new token; only its hash is kept, so this is the one time it is known."""
        token = new_token()
        record = TokenRecord(sha256=hash_token(token), role=role, owner=owner, run_id=run_id, issued=now_iso())
        with self._lock:
            self._file = TokenFile(tokens=[*self._file.tokens, record])
            write_atomic(self.path, self._file)
            self._by_hash[record.sha256] = record
        return token

    def lookup(self, token: str) -> Principal | None:
        if not token:
            return None
        if self._env_admin and hmac.compare_digest(token.encode("utf-8", "surrogatepass"), self._env_admin.encode()):
            return Principal(Role.ADMIN, "admin")
        record = self._by_hash.get(hash_token(token))
        return None if record is None else Principal(record.role, record.owner, record.run_id)


def bearer(connection: HTTPConnection) -> str:
    scheme, _, token = connection.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def principal(connection: HTTPConnection, tokens: TokenStore) -> Principal | None:
    """The request's principal from its bearer token; None without a valid one."""
    return tokens.lookup(bearer(connection))


class RunTokenVerifier(TokenVerifier):
    """The MCP SDK's bearer check for the service: an agent token's audience is its own run's endpoint
    (`AccessToken.resource`), which the SDK compares with the endpoint asked (validate_token_resource)."""

    def __init__(self, tokens: TokenStore, endpoint_of):
        self._tokens = tokens
        self._endpoint_of = endpoint_of

    async def verify_token(self, token: str) -> AccessToken | None:
        who = self._tokens.lookup(token)
        if who is None or who.role is not Role.AGENT or who.run_id is None:
            return None
        return AccessToken(token=token, client_id=f"agent-{who.run_id}", scopes=[SCOPE],
                           resource=self._endpoint_of(who.run_id), subject=who.owner)
