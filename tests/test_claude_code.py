"""Claude Code, the client most users start from, against the real server: `claude mcp add`, then `claude mcp list`.

`claude mcp list` starts (stdio) or calls (HTTP) each configured server, runs the MCP handshake and prints
"✔ Connected" for those that answered within its connection timeout (MCP_TIMEOUT, 30 s by default; the test
clears it so the default holds). The server is tests/fake_server.py on a results folder with no run yet, so
each test connects to a new run as a user's first `kernel-referee serve --task ...` would.

Claude Code keeps its configuration in the user's home; here HOME and the XDG folders are a temporary folder
and the scope is `user`, so nothing outside it is written (the `project` scope would write .mcp.json into the
working folder). No account is needed for `mcp add` and `mcp list`. CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC
(auto-update, telemetry, error reports) keeps every call on this host; test_nothing_leaves_the_host checks it.

Runs where KERNEL_REFEREE_CLAUDE names the `claude` binary (.ci/run installs it); skipped, with the reason,
where it is unset. Nothing is downloaded here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.server_support import free_port

REPO = Path(__file__).resolve().parents[1]
FAKE_SERVER = REPO / "tests" / "fake_server.py"
CLAUDE_ENV = "KERNEL_REFEREE_CLAUDE"
CLAUDE = os.environ.get(CLAUDE_ENV, "")
NAME = "kernel-referee"
TOKEN = "claude-code-test-token-0123456789abcdef"
CONNECTED = "✔ Connected"
# A new run's reference outputs and baseline take 30-90 s on a GPU, beyond Claude Code's 30 s: the server answers
# the handshake while it prepares the run (tests/fake_server.py's $FAKE_SERVER_PREPARE_S stands in for the GPU).
GPU_PREPARE_S = 45
# Variables that would change what Claude Code reads or how long it waits: a developer's own are not this test's.
FOREIGN = re.compile(r"^(CLAUDE_|ANTHROPIC_|MCP_|DISABLE_)")

pytestmark = pytest.mark.skipif(not CLAUDE, reason=(
    f"{CLAUDE_ENV} is unset: it names the Claude Code CLI (npm package @anthropic-ai/claude-code, which .ci/run "
    "installs into .ci/node); the test does not download it"))


class ClaudeHome:
    """A user's home for Claude Code, in a temporary folder: every `claude` call reads and writes only there."""

    def __init__(self, home: Path) -> None:
        self.home = home
        kept = {key: value for key, value in os.environ.items() if not FOREIGN.match(key)}
        self.env = {**kept, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
                    "XDG_CACHE_HOME": str(home / ".cache"), "XDG_DATA_HOME": str(home / ".local" / "share"),
                    "XDG_STATE_HOME": str(home / ".local" / "state"),
                    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"}

    def claude(self, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        return subprocess.run([*prefix, CLAUDE, *args], cwd=self.home, env=self.env, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=180)

    def add(self, transport: str, *rest: str) -> None:
        """`claude mcp add --scope user --transport TRANSPORT kernel-referee REST...`, into this home's config."""
        done = self.claude("mcp", "add", "--scope", "user", "--transport", transport, NAME, *rest)
        assert done.returncode == 0, done.stdout + done.stderr
        assert NAME in json.loads((self.home / ".claude.json").read_text())["mcpServers"]

    def status(self, prefix: tuple[str, ...] = ()) -> str:
        """What `claude mcp list` says of kernel-referee: the text after its ` - `, e.g. "✔ Connected"."""
        listed = self.claude("mcp", "list", prefix=prefix)
        assert listed.returncode == 0, listed.stdout + listed.stderr
        line = next((line for line in listed.stdout.splitlines() if line.startswith(f"{NAME}: ")), None)
        assert line is not None, f"{NAME} is not in `claude mcp list`:\n{listed.stdout}{listed.stderr}"
        return line.rsplit(" - ", 1)[-1]

    def mcp_logs(self) -> str:
        """Claude Code's log of its MCP connections, with the server's stderr: what a failed check needs."""
        logs = sorted((self.home / ".cache").glob("claude-cli-nodejs/*/mcp-logs-*/*"))
        return "\n".join(log.read_text(errors="replace") for log in logs)[-6000:]


@pytest.fixture
def home(tmp_path) -> ClaudeHome:
    binary = Path(CLAUDE)
    # Set but missing is a broken install, which must fail CI rather than skip the test.
    assert binary.is_file() and os.access(binary, os.X_OK), f"{CLAUDE_ENV}={CLAUDE} is not an executable file"
    folder = tmp_path / "home"
    folder.mkdir()
    return ClaudeHome(folder)


@pytest.fixture(scope="module")
def http_server(tmp_path_factory):
    """The fake server over streamable HTTP on a free loopback port with TOKEN, preparing a new run: its URL."""
    folder = tmp_path_factory.mktemp("claude-http")
    port, stderr = free_port(), folder / "server.stderr"
    with stderr.open("wb") as err:
        server = subprocess.Popen([sys.executable, str(FAKE_SERVER), str(folder / "results"), str(port)],
                                  cwd=folder, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                  env={**os.environ, "KERNEL_REFEREE_TOKEN": TOKEN,
                                       "FAKE_SERVER_PREPARE_S": str(GPU_PREPARE_S)})
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None and time.monotonic() < deadline, stderr.read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.kill()
        server.wait(timeout=10)


def _strace_works() -> bool:
    if shutil.which("strace") is None:
        return False
    probe = subprocess.run(["strace", "-f", "-qq", "-e", "trace=connect", "-o", os.devnull, "true"],
                           capture_output=True)
    return probe.returncode == 0  # a container may forbid ptrace


@pytest.mark.parametrize("prepare_s", [0, GPU_PREPARE_S], ids=["prepared-at-once", "prepared-as-on-a-gpu"])
def test_claude_code_connects_to_a_new_run_over_stdio(home, prepare_s):
    home.add("stdio", "-e", f"FAKE_SERVER_PREPARE_S={prepare_s}", "--",
             sys.executable, str(FAKE_SERVER), str(home.home / "results"))
    assert home.status() == CONNECTED, home.mcp_logs()


def test_claude_code_connects_over_http_with_the_bearer_token(home, http_server):
    # The line `serve --transport http` prints for Claude Code (server/transport.py); --header takes the rest.
    home.add("http", http_server, "--header", f"Authorization: Bearer {TOKEN}")
    assert home.status() == CONNECTED, home.mcp_logs()


def test_claude_code_with_a_wrong_token_does_not_connect(home, http_server):
    home.add("http", http_server, "--header", f"Authorization: Bearer wrong-{TOKEN}")
    status = home.status()
    assert status.startswith("✘ Failed to connect") and "401" in status, status


@pytest.mark.skipif(not _strace_works(), reason="no strace that may trace here: it watches where Claude Code connects")
def test_nothing_leaves_the_host(home):
    home.add("stdio", "--", sys.executable, str(FAKE_SERVER), str(home.home / "results"))
    trace = home.home / "connect.trace"
    status = home.status(prefix=("strace", "-f", "-qq", "-e", "trace=connect", "-o", str(trace)))
    assert status == CONNECTED, home.mcp_logs()
    # Unix sockets and loopback only: no update check, telemetry or error report.
    inet = [line for line in trace.read_text().splitlines() if re.search(r"connect\(.*AF_INET6?\b", line)]
    outside = [line for line in inet if not re.search(r'inet_addr\("127\.|inet_pton\(AF_INET6, "::1"', line)]
    assert not outside, "\n".join(outside)
