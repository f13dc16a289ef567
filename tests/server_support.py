"""Shared helpers of the server tests: a run on the matmul task with the fake executor, in-process MCP calls."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import anyio
from mcp import Client

from harness.task import load_task
from server.app import build_server
from server import lifecycle
from server.run import Run, RunSettings
from tests.fake_executor import FakeExecutor

REPO = Path(__file__).resolve().parents[1]
MATMUL = REPO / "cases" / "matmul_f32"
INITIAL = (MATMUL / "initial.cu").read_text()
VISIBLE = ["odd-31x37x29", "square-2048", "rect-2000x1500x1000"]
HOLDOUT = "holdout-97x83x61"
BROKEN = ('extern "C" __global__ void matmul_f32(const float* a, const float* b, float* c, int m, int n, int k)\n'
          "{ undefined_thing; }\n")


def kernel(*marks: str) -> str:
    """The baseline's source with `// fake: MARK` comments that steer the fake executor."""
    return INITIAL + "".join(f"\n// fake: {mark}" for mark in marks) + "\n"


def executor(gpu: str = "Fake GPU", **options) -> FakeExecutor:
    return FakeExecutor(load_task(MATMUL), gpu=gpu, **options)


def new_run(tmp_path: Path, executor_options: dict | None = None, **settings) -> Run:
    return lifecycle.new_run(MATMUL, tmp_path / "results", RunSettings(**settings), executor(**(executor_options or {})))


def client(run: Run) -> Client:
    return Client(build_server(run), cache=None)


async def ok(c: Client, tool: str, **arguments) -> dict:
    result = await c.call_tool(tool, arguments)
    assert not result.is_error, result.content[0].text
    return result.structured_content


async def prepared(c: Client, within_s: float = 60.0) -> dict:
    """describe_task once the new run's preparation (reference outputs, baseline) has ended: a server answers at
    once and prepares its run behind."""
    deadline = time.monotonic() + within_s
    while True:
        described = await ok(c, "describe_task")
        state = (described.get("preparation") or {}).get("state", "ready")
        if state != "preparing" or time.monotonic() > deadline:
            assert state == "ready", described.get("preparation")
            return described
        await anyio.sleep(0.05)


async def refused(c: Client, tool: str, **arguments) -> str:
    result = await c.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    text = result.content[0].text
    prefix = f"Error executing tool {tool}: "
    assert text.startswith(prefix), text
    return text[len(prefix):]


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def read_json(path: Path):
    return json.loads(path.read_text())


def free_port() -> int:
    """A loopback TCP port free at the time of asking."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
