"""Claude Code against the real `kernel-referee serve --task cases/matmul_f32` on this host's GPU: `claude mcp add`,
then `claude mcp list`, which starts the server, runs the MCP handshake and prints "✔ Connected" where the server
answered within Claude Code's connection timeout (30 s), although the new run's preparation (its reference outputs
and baseline timing, 15 to 25 s on an H100) is still going on. Runs where KERNEL_REFEREE_CLAUDE names the `claude`
binary; skipped with the reason elsewhere. On the GPU host that is the last release that runs on Node (.ci/gpu's
`claude` stage), which marks a connected server "✓" where later releases mark it "✔"."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.test_claude_code import CLAUDE, CLAUDE_ENV, CONNECTED, ClaudeHome, home  # noqa: F401 - home: the fixture

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CLAUDE, reason=f"{CLAUDE_ENV} is unset: it names the Claude "
                                                  "Code CLI; the test does not download it")]
MATMUL = Path(__file__).resolve().parents[2] / "cases" / "matmul_f32"
CONNECTED_MARKS = {CONNECTED, "✓ Connected"}


def test_claude_code_connects_to_a_fresh_run_of_matmul_f32_on_this_gpu(home: ClaudeHome):  # noqa: F811
    home.add("stdio", "--", sys.executable, "-m", "server.cli", "serve", "--task", str(MATMUL),
             "--results", str(home.home / "results"))
    assert home.status() in CONNECTED_MARKS, home.mcp_logs()
