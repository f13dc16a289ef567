"""What a call costs: the tamper check hashes only what changed, yet catches what it promises to catch;
describe_task answers without waiting for a running attempt."""

from __future__ import annotations

import os
import time

import anyio
import pytest

from server import locked_files
from server.locked_files import Identity, LockedFiles
from server.lock import hash_files
from server.verify import verify_run
from tests.server_support import client, events, kernel, new_run, ok, refused

EXPECTED = "expected/square-2048/0/c.npy"



def _flip_a_byte_keeping_size_and_mtime(path) -> None:
    before = path.stat()
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    path.write_bytes(bytes(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def _settled(run) -> None:
    """Wait until the run's files are older than the check's racy margin (shortened for the test)."""
    time.sleep(locked_files.RACY_MARGIN_S + 0.05)


@pytest.mark.anyio
async def test_a_call_hashes_no_unchanged_file_and_catches_a_change_with_its_mtime_restored(tmp_path, monkeypatch):
    monkeypatch.setattr(locked_files, "RACY_MARGIN_S", 0.2)
    run = new_run(tmp_path)
    _settled(run)
    checker = run.locked_files
    async with client(run) as c:
        await ok(c, "describe_task")
        hashed = checker.hashed
        assert hashed == len(checker.locked)  # the first check hashed each file once
        for _ in range(3):
            await ok(c, "describe_task")
            await ok(c, "compile_kernel", source=kernel())
        assert checker.hashed == hashed  # nothing changed, nothing hashed again

        os.utime(run.dir / EXPECTED)  # a touch: hashed again, still the locked content, no refusal
        await ok(c, "describe_task")
        assert checker.hashed == hashed + 1

        _flip_a_byte_keeping_size_and_mtime(run.dir / EXPECTED)
        message = await refused(c, "describe_task")
        assert message.startswith(f"refused: the run's locked files changed ({EXPECTED} changed)")
        assert (await refused(c, "validate", source=kernel())).startswith("refused: the run's locked files changed")
    assert [e["data"]["problems"] for e in events(run.dir) if e["kind"] == "tamper"] == [[f"{EXPECTED} changed"]] * 2
    run.close()


def test_a_file_changed_within_a_coarse_timestamp_tick_is_still_caught(tmp_path, monkeypatch):
    """On a file system whose clock ticks once a second, a change right after a check leaves ctime as it was:
    a file changed that recently is not trusted by its stat identity and is hashed on every check."""
    (tmp_path / "task").mkdir()
    (tmp_path / "expected").mkdir()
    path = tmp_path / "expected" / "out.npy"
    path.write_bytes(b"\0" * 4096)
    real = Identity.of

    def coarse(st) -> Identity:
        identity = real(st)
        return Identity(identity.device, identity.inode, identity.size, identity.mtime_ns // 10**9 * 10**9,
                        identity.ctime_ns // 10**9 * 10**9)

    monkeypatch.setattr(Identity, "of", staticmethod(coarse))
    checker = LockedFiles(tmp_path, hash_files(tmp_path, locked_files.FOLDERS))
    assert checker.problems() == []
    path.write_bytes(b"\1" + b"\0" * 4095)
    assert checker.problems() == ["expected/out.npy changed"]


@pytest.mark.anyio
async def test_a_change_stat_cannot_see_is_caught_before_the_next_attempt(tmp_path, monkeypatch):
    """What stat cannot see (here: stat made blind) passes the cheap check of a probe, never the full check that
    comes before every record_attempt and finish."""
    monkeypatch.setattr(locked_files, "RACY_MARGIN_S", 0.2)
    run = new_run(tmp_path)
    _settled(run)
    async with client(run) as c:
        await ok(c, "describe_task")
        blind = {name: identity for name, identity in run.locked_files._trusted.items()}
        monkeypatch.setattr(run.locked_files, "_stat_all", lambda: blind)
        _flip_a_byte_keeping_size_and_mtime(run.dir / EXPECTED)
        await ok(c, "describe_task")
        for tool, arguments in [("record_attempt", {"source": kernel(), "rationale": "r"}), ("finish", {"reason": "r"})]:
            assert (await refused(c, tool, **arguments)).startswith(
                f"refused: the run's locked files changed ({EXPECTED} changed)")
    assert run.attempts_used == 0 and not run.finished
    run.close()


@pytest.mark.anyio
async def test_describe_task_answers_while_a_slow_attempt_runs(tmp_path):
    run = new_run(tmp_path)
    async with client(run) as c:
        answers = {}

        async def attempt() -> None:
            answers["attempt"] = await ok(c, "record_attempt", source=kernel("slow_s=3"), rationale="slow")

        timed_before = run.executor.calls.count("time")  # the baseline's
        async with anyio.create_task_group() as group:
            group.start_soon(attempt)
            with anyio.fail_after(10):
                while run.executor.calls.count("time") == timed_before:  # until the attempt is being timed
                    await anyio.sleep(0.02)
            started = time.perf_counter()
            described = await ok(c, "describe_task")
            answers["describe_s"] = time.perf_counter() - started
            assert "attempt" not in answers
        assert answers["describe_s"] < 1.0, answers
        # The attempt in flight is already counted; its verdict comes with the next description.
        assert described["budget"]["attempts_used"] == 1 and described["best_attempt"] == 0
        assert answers["attempt"]["verdict"] == "valid-not-faster"
        assert (await ok(c, "describe_task"))["budget"]["attempts_used"] == 1
    run.close()
    assert verify_run(run.dir).ok
