"""The audit service in a subprocess (tests/fake_service.py) and an MCP client of one run's endpoint."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from harness.gpu_lease import LEASE_DIR_ENV
from service.auth import ADMIN_TOKEN_ENV

REPO = Path(__file__).resolve().parents[1]
MATMUL = REPO / "cases" / "matmul_f32"
ADMIN = "service-admin-token-0123456789"
STARTUP_TIMEOUT_S = 60.0


class ServiceProcess:
    def __init__(self, root: Path, port: int, gpus: int = 1):
        self.root, self.port, self.gpus = root, port, gpus
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "ServiceProcess":
        # Its GPU claims in a folder of its own (kept across a restart on the same root): no other test's service
        # or run, in this process or another, holds one of its fake GPUs.
        leases = self.root.parent / f"{self.root.name}-leases"
        env = {**os.environ, ADMIN_TOKEN_ENV: ADMIN, LEASE_DIR_ENV: str(leases), "PYTHONPATH": str(REPO)}
        with (self.root.parent / f"{self.root.name}-stderr.txt").open("ab") as err:
            self.proc = subprocess.Popen(self.command(), cwd=REPO, env=env,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"the service exited with {self.proc.returncode}: {self.stderr()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"the service did not accept within {STARTUP_TIMEOUT_S} s") from None
                time.sleep(0.1)

    def command(self) -> list[str]:
        return [sys.executable, str(REPO / "tests" / "fake_service.py"), str(self.root), str(self.port), str(self.gpus)]

    def stderr(self) -> str:
        return (self.root.parent / f"{self.root.name}-stderr.txt").read_text(errors="replace")

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill9()

    def api(self, token: str = ADMIN) -> httpx2.Client:
        return httpx2.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)

    def create_run(self, max_attempts: int = 3) -> dict:
        with self.api() as http:
            answer = http.post("/api/runs", json={"task_dir": str(MATMUL), "max_attempts": max_attempts})
        assert answer.status_code == 201, answer.text
        return answer.json()

    def wait_state(self, run_id: str, states: tuple[str, ...], timeout_s: float = 120.0) -> dict:
        deadline = time.monotonic() + timeout_s
        with self.api() as http:
            while True:
                view = http.get(f"/api/runs/{run_id}").json()
                if view["run"]["state"] in states:
                    return view
                if time.monotonic() > deadline:
                    raise AssertionError(f"run {run_id} still {view['run']['state']} after {timeout_s} s")
                time.sleep(0.1)


@asynccontextmanager
async def agent(mcp_url: str, token: str):
    """An MCP client of one run's endpoint, with that run's agent token."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as http:
        async with Client(streamable_http_client(mcp_url, http_client=http)) as client:
            yield client


async def described(client) -> dict:
    """describe_task's answer, which must not be an error."""
    answer = await client.call_tool("describe_task", {})
    assert not answer.is_error, answer.content[0].text
    return json.loads(answer.content[0].text)


async def until_prepared(client, timeout_s: float = 120.0) -> dict:
    """describe_task once the run is prepared (a resumed run's preparation is null), failing on a failed one."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = await described(client)
        preparation = answer.get("preparation")
        if preparation is None or preparation["state"] == "ready":
            return answer
        assert preparation["state"] != "failed", preparation
        assert time.monotonic() < deadline, preparation
        await anyio.sleep(0.2)
