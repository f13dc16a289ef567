"""One server per run folder (server/folder_lock.py), with real server processes (tests/fake_server.py runs the
real MCP server with the fake executor); and no resume of a run whose audit chain is broken."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from harness.gpu_lease import LEASE_DIR_ENV
from server.cli import main
from server.folder_lock import EXIT_HELD, LOCK_NAME, FolderHeld, FolderLock
from server.lifecycle import resume_run
from server.replay import replay
from server.run import RunError
from server.verify import verify_run
from tests.fake_executor import FakeExecutor
from tests.server_support import REPO, events, executor, kernel, new_run, ok, read_json

FAKE_SERVER = str(REPO / "tests" / "fake_server.py")



def _server(folder: Path, errlog) -> Client:
    params = StdioServerParameters(command=sys.executable, args=[FAKE_SERVER, str(folder)], cwd=str(folder.parent),
                                   env={LEASE_DIR_ENV: os.environ[LEASE_DIR_ENV]})
    return Client(stdio_client(params, errlog=errlog), cache=None, read_timeout_seconds=60)


def _serve_once(folder: Path) -> subprocess.CompletedProcess:
    """A second server started on `folder` (it refuses before it reads its stdin)."""
    return subprocess.run([sys.executable, FAKE_SERVER, str(folder)], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=60)


def _holder_pid(run_dir: Path) -> int:
    return json.loads((run_dir / LOCK_NAME).read_text())["pid"]


@pytest.mark.anyio
async def test_a_second_server_is_refused_and_a_task_resume_starts_a_new_run(tmp_path):
    results = tmp_path / "results"
    first_err, second_err = (tmp_path / "first.err").open("w+"), (tmp_path / "second.err").open("w+")
    run1, run2 = results / "run-001", results / "run-002"
    async with _server(results, first_err) as first:
        one = await ok(first, "record_attempt", source=kernel("latency_us=50"), rationale="first server")
        assert (one["attempt"], one["verdict"]) == (1, "valid-faster")
        pid = _holder_pid(run1)
        assert "fake_server.py" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")

        refused = _serve_once(run1)  # serve --run run-001
        assert (refused.returncode, refused.stdout) == (EXIT_HELD, "")
        assert refused.stderr == f"kernel-referee: run-001 is being served by pid {pid}\n"

        async with _server(results, second_err) as second:  # serve --task: run-001 is held, so a new run
            two = await ok(second, "record_attempt", source=kernel("latency_us=40"), rationale="second server")
            assert (two["attempt"], two["budget"]["attempts_used"]) == (1, 1)
            assert (await ok(second, "describe_task"))["budget"]["probes_left_in_window"] == 20
        three = await ok(first, "record_attempt", source=kernel("latency_us=30"), rationale="first again")
        assert (three["attempt"], three["budget"]["attempts_used"]) == (2, 2)
    second_err.seek(0)
    assert f"run-001 is being served by pid {pid}: starting a new run of this task instead\n" in second_err.read()

    assert [e["attempt"] for e in read_json(run1 / "history.json")["attempts"]] == [0, 1, 2]
    assert [e["rationale"] for e in read_json(run1 / "history.json")["attempts"][1:]] == ["first server", "first again"]
    assert [e["attempt"] for e in read_json(run2 / "history.json")["attempts"]] == [0, 1]
    for run_dir in (run1, run2):
        kinds = [e["kind"] for e in events(run_dir)]
        assert kinds.count("run_created") == 1 and "run_resumed" not in kinds and "attempt_interrupted" not in kinds
        assert main(["verify", str(run_dir)]) == 0


def test_a_killed_servers_lock_file_blocks_nobody(tmp_path):
    run = new_run(tmp_path)
    run.close()
    server = subprocess.Popen([sys.executable, FAKE_SERVER, str(run.dir)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not ((run.dir / LOCK_NAME).exists() and (run.dir / LOCK_NAME).read_text()):
            assert time.monotonic() < deadline and server.poll() is None
            time.sleep(0.05)
        with pytest.raises(FolderHeld, match=f"^run-001 is being served by pid {server.pid}$"):
            resume_run(run.dir, executor())
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
        server.stdin.close()
        server.stdout.close()
    assert _holder_pid(run.dir) == server.pid  # its file stays, naming a dead process
    resumed = resume_run(run.dir, executor())
    assert _holder_pid(run.dir) == os.getpid()
    resumed.close()
    assert not (run.dir / LOCK_NAME).exists()  # a holder that ends normally removes it
    assert verify_run(run.dir).ok


def test_report_and_replay_refuse_a_folder_a_server_holds(tmp_path, capsys):
    run = new_run(tmp_path)
    try:
        assert main(["report", str(run.dir)]) == EXIT_HELD
        assert capsys.readouterr().err == f"kernel-referee: run-001 is being served by pid {os.getpid()}\n"
        assert replay(run.dir, io.StringIO(), make_executor=lambda task, timing: FakeExecutor(task)) == EXIT_HELD
        assert capsys.readouterr().err == f"kernel-referee: run-001 is being served by pid {os.getpid()}\n"
        assert not (run.dir / "report.html").exists() and not (run.dir / "replay.json").exists()
    finally:
        run.close()
    assert main(["report", str(run.dir)]) == 0
    assert (run.dir / "report.html").exists()
    with FolderLock.take(run.dir, "replay"):
        with pytest.raises(FolderHeld, match="^run-001 is being replayed by pid"):
            resume_run(run.dir, executor())


def _break_record(run_dir: Path, line: int) -> None:
    lines = (run_dir / "events.jsonl").read_bytes().split(b"\n")
    at = lines[line - 1].index(b'"kind":"') + 8
    lines[line - 1] = lines[line - 1][:at] + bytes([lines[line - 1][at] ^ 0x20]) + lines[line - 1][at + 1:]
    (run_dir / "events.jsonl").write_bytes(b"\n".join(lines))


def test_a_run_whose_audit_chain_is_broken_is_not_resumed(tmp_path):
    run = new_run(tmp_path)
    run.close()
    _break_record(run.dir, 5)
    before = (run.dir / "events.jsonl").read_bytes()
    first_broken = "events.jsonl line 5: hash does not match its contents (record edited)"
    with pytest.raises(RunError, match="^" + re.escape(f"run-001 cannot be resumed: its audit log does not verify "
                                                       f"(first broken record: {first_broken}); `kernel-referee verify")):
        resume_run(run.dir, executor())
    served = _serve_once(run.dir)
    assert served.returncode == 2 and served.stderr.count("\n") == 1
    assert served.stderr.startswith(f"kernel-referee: run-001 cannot be resumed: its audit log does not verify "
                                    f"(first broken record: {first_broken})")
    assert (run.dir / "events.jsonl").read_bytes() == before  # nothing was appended to the broken chain
    assert not (run.dir / LOCK_NAME).exists()


def test_a_torn_last_line_is_no_broken_chain(tmp_path):
    run = new_run(tmp_path)
    run.close()
    with open(run.dir / "events.jsonl", "ab") as log:
        log.write(b'{"seq": 99, "kind": "ca')  # a server killed while it appended
    run = resume_run(run.dir, executor())
    run.close()
    assert [e["kind"] for e in events(run.dir)][-2:] == ["log_repaired", "run_resumed"]
    assert verify_run(run.dir).ok


def test_a_lock_whose_stamp_the_disk_refuses_is_let_go_not_held_by_a_lost_descriptor(tmp_path, monkeypatch):
    def full(fd, data, offset):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(OSError):
        FolderLock.take(tmp_path, "report")
    monkeypatch.undo()
    held = FolderLock.take(tmp_path, "report")  # not FolderHeld: the failed take holds nothing
    held.release()
