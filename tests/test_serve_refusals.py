"""`serve` refuses what it cannot serve before anything is made: a busy port, a host beyond loopback, a run folder
that is not there, a malformed --gpu. One line on stderr, the documented exit code (README, "Exit codes"), no
run folder, and no GPU looked for first (these run on machines without one)."""

from __future__ import annotations

import socket

import pytest

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
