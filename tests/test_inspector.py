"""An independent client, the MCP Inspector CLI (TypeScript SDK), against the real server over stdio.

The server is tests/fake_server.py: the real MCP server, run folder and NVRTC compiles, with the
fake executor in place of the GPU (starting a run computes the expected outputs on a GPU), so this
runs on a CPU. The Inspector lists the tools, calls describe_task and compile_kernel, and sees a
refused call as a tool error (its exit code 5).

Skipped, with the reason, where Node >= 22.19 or the inspector is missing; nothing is downloaded.
Install it with `npm install -g @modelcontextprotocol/inspector`, or anywhere with
`npm install --prefix DIR @modelcontextprotocol/inspector` and
KERNEL_REFEREE_INSPECTOR=DIR/node_modules/.bin/mcp-inspector. KERNEL_REFEREE_NODE names the node
binary to run it with (default: `node` on PATH).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FAKE_SERVER = REPO / "tests" / "fake_server.py"
INITIAL = (REPO / "cases" / "matmul_f32" / "initial.cu").read_text()
MIN_NODE = (22, 19)
TOOLS = {"describe_task", "compile_kernel", "run_cases", "validate", "time_kernel", "profile_kernel", "record_attempt",
         "finish"}


def _node() -> tuple[str | None, str]:
    node = os.environ.get("KERNEL_REFEREE_NODE") or shutil.which("node")
    if not node:
        return None, "no node on PATH (the MCP Inspector needs Node >= 22.19; or set KERNEL_REFEREE_NODE)"
    try:
        version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{node} --version failed: {exc}"
    found = re.match(r"v(\d+)\.(\d+)", version)
    if not found or tuple(map(int, found.groups())) < MIN_NODE:
        return None, f"{node} is {version or 'of unknown version'}; the MCP Inspector v2 needs Node >= 22.19"
    return node, version


def _inspector() -> tuple[list[str] | None, str]:
    node, why = _node()
    if node is None:
        return None, why
    inspector = os.environ.get("KERNEL_REFEREE_INSPECTOR") or shutil.which("mcp-inspector")
    if not inspector or not Path(inspector).exists():
        return None, ("the MCP Inspector is not installed (npm install -g @modelcontextprotocol/inspector, or set "
                      "KERNEL_REFEREE_INSPECTOR to its mcp-inspector); the test does not download it")
    return [node, inspector], ""


INSPECTOR, MISSING = _inspector()
pytestmark = pytest.mark.skipif(INSPECTOR is None, reason=MISSING)


def inspect(server_folder: Path, *options: str) -> tuple[int, dict | None, str]:
    """One Inspector CLI call: (exit code, the JSON result, stderr). Under --cli, what precedes `--` is the
    server's command line, what follows it the Inspector's own options."""
    command = INSPECTOR + ["--cli", sys.executable, str(FAKE_SERVER), str(server_folder), "--",
                           *options, "--format", "json", "--connect-timeout", "120000"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    result = json.loads(done.stdout)["result"] if done.returncode == 0 and done.stdout.strip() else None
    return done.returncode, result, done.stderr


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    """A run the first call creates (results folder -> run-001); later calls resume it. The first call is one that
    waits for the new run's preparation: a client that leaves while a run is still being prepared leaves no run."""
    results = tmp_path_factory.mktemp("inspector")
    arguments = {"source": INITIAL, "launch": {"grid": ["ceil_div(n, 16)", "ceil_div(m, 16)"], "block": [16, 16]}}
    code, _, err = inspect(results, "--method", "tools/call", "--tool-name", "compile_kernel",
                           "--tool-args-json", json.dumps(arguments))
    assert code == 0, err[-3000:]
    code, listed, err = inspect(results / "run-001", "--method", "tools/list")
    assert code == 0, err[-3000:]
    names = {tool["name"] for tool in listed["tools"]}
    assert names == TOOLS
    schemas = {tool["name"]: tool for tool in listed["tools"]}
    assert "source" in schemas["compile_kernel"]["inputSchema"]["properties"]
    assert "outputSchema" in schemas["record_attempt"]
    return results / "run-001"


def test_the_inspector_lists_the_tools(run_folder):
    assert (run_folder / "lock.json").exists()


def test_the_inspector_calls_describe_task(run_folder):
    code, result, err = inspect(run_folder, "--method", "tools/call", "--tool-name", "describe_task")
    assert code == 0, err[-3000:]
    task = result["structuredContent"]
    assert task["name"] == "matmul_f32" and task["budget"]["attempts_left"] == 7
    assert [c["name"] for c in task["cases"]] == ["odd-31x37x29", "square-2048", "rect-2000x1500x1000"]


def test_the_inspector_compiles_a_kernel(run_folder):
    arguments = {"source": INITIAL, "launch": {"grid": ["ceil_div(n, 16)", "ceil_div(m, 16)"], "block": [16, 16]}}
    code, result, err = inspect(run_folder, "--method", "tools/call", "--tool-name", "compile_kernel",
                                "--tool-args-json", json.dumps(arguments))
    assert code == 0, err[-3000:]
    answer = result["structuredContent"]
    assert not result.get("isError") and answer["ok"] and answer["resources"]["shared_bytes"] == 2112
    assert (run_folder / "candidates" / f"{answer['candidate']}.json").exists()


def test_a_refused_call_is_a_tool_error_for_the_inspector(run_folder):
    code, _, err = inspect(run_folder, "--method", "tools/call", "--tool-name", "validate",
                           "--tool-args-json", json.dumps({"candidate_id": "c0123456789abcde"}))
    assert code == 5, err[-3000:]  # the Inspector's exit code for isError: true
    assert "unknown candidate id" in err
