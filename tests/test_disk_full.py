"""A full disk under the results folder: the call fails with a clear error, the audit log still verifies, and an
attempt's budget is counted exactly once (not at all when the disk fills before its slot is claimed, once and as
rejected when it fills after), so the next attempt is numbered right, in this session and after a resume.

The disk is simulated: from a chosen write on (a run file by its path, an events.jsonl record by its kind, or the
attempt's claim file), every write of the run fails with ENOSPC until the test frees the space. A failed file write
first writes part of its temporary file, as a real full disk does.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Callable

import pytest

from server import audit
from server.verify import verify_run
from server.lifecycle import resume_run
from server.run import Run
from tests.server_support import client, events, executor, kernel, new_run, ok, read_json

NO_SPACE = os.strerror(errno.ENOSPC)



class FullDisk:
    """Writes of one run that fail with ENOSPC from the first one `fill_at` accepts until `free`."""

    def __init__(self, run: Run, monkeypatch: pytest.MonkeyPatch):
        self.run = run
        self.trigger: Callable[[str], bool] | None = None
        self.full = False
        self.short = False
        self.failed: list[str] = []
        real_write_all, real_write, real_open = audit._write_all, os.write, os.open

        def write_all(fd, data):  # every atomic file write of the run goes through here
            if self._hits(f"file:{self._target(fd)}"):
                real_write(fd, bytes(data[:len(data) // 2]))
                raise OSError(errno.ENOSPC, NO_SPACE)
            real_write_all(fd, data)

        def write(fd, data):
            if fd == run.audit._fd and self._hits(f"log:{json.loads(bytes(data))['kind']}"):
                if self.short:  # a prefix reaches the file, as on a nearly full disk
                    return real_write(fd, bytes(data[:len(data) // 3]))
                raise OSError(errno.ENOSPC, NO_SPACE)
            return real_write(fd, data)

        def open_(path, flags, mode=0o777, *args, **kwargs):
            if str(path).endswith(".claim") and self._hits(f"claim:{Path(path).relative_to(run.dir).as_posix()}"):
                raise OSError(errno.ENOSPC, NO_SPACE, str(path))
            return real_open(path, flags, mode, *args, **kwargs)

        monkeypatch.setattr(audit, "_write_all", write_all)
        monkeypatch.setattr(os, "write", write)
        monkeypatch.setattr(os, "open", open_)

    def _target(self, fd: int) -> str:
        tmp = Path(os.readlink(f"/proc/self/fd/{fd}"))  # .NAME.<12 hex>.tmp beside NAME
        return (tmp.parent / tmp.name[1:-len(".0123456789ab.tmp")]).relative_to(self.run.dir.resolve()).as_posix()

    def _hits(self, event: str) -> bool:
        if not self.full and self.trigger is not None and self.trigger(event):
            self.full = True
        if self.full:
            self.failed.append(event)
        return self.full

    def fill_at(self, trigger: Callable[[str], bool], *, short: bool = False) -> None:
        self.trigger, self.full, self.short, self.failed = trigger, False, short, []

    def free(self) -> None:
        self.trigger, self.full = None, False


async def _fails_for_lack_of_space(c, tool: str, **arguments) -> str:
    result = await c.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    message = result.content[0].text
    assert message.startswith(f"Error executing tool {tool}: the referee could not write its results folder "
                              f"({NO_SPACE})"), message
    return message


def _strays(run: Run) -> list[str]:
    return sorted(p.relative_to(run.dir).as_posix() for p in run.dir.rglob("*")
                  if p.name.endswith((".tmp", ".claim")) or ".torn-" in p.name)


def _attempts(run_dir: Path) -> list[tuple[int, str]]:
    return [(e["attempt"], e["verdict"]) for e in read_json(run_dir / "history.json")["attempts"]]


BEFORE_THE_CLAIM = {
    # a new source: its candidate record is the first write of the call
    "candidate record": (False, lambda e: e.startswith("file:candidates/"), "file:candidates/"),
    "claim file": (True, lambda e: e.startswith("claim:"), "claim:attempts/002.claim"),
    "slot file": (True, lambda e: e.startswith("file:attempts/"), "file:attempts/002.cu"),
    "slot record": (True, lambda e: e == "log:file_written", "log:file_written"),
    "the whole call": (True, lambda e: True, "log:call"),
}


@pytest.mark.anyio
@pytest.mark.parametrize("where", list(BEFORE_THE_CLAIM))
async def test_a_disk_full_before_the_slot_is_claimed_counts_nothing(tmp_path, monkeypatch, where):
    by_id, trigger, first_failure = BEFORE_THE_CLAIM[where]
    run = new_run(tmp_path)
    disk = FullDisk(run, monkeypatch)
    source = kernel("latency_us=40")
    async with client(run) as c:
        await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="one")
        arguments = {"source": source}
        if by_id:
            arguments = {"candidate_id": (await ok(c, "compile_kernel", source=source))["candidate"]}
        disk.fill_at(trigger)
        await _fails_for_lack_of_space(c, "record_attempt", rationale="two", **arguments)
        disk.free()
        assert disk.failed[0].startswith(first_failure), disk.failed
        assert run.attempts_used == 1 and [e.attempt for e in run.history] == [0, 1]
        assert sorted(p.name for p in (run.dir / "attempts").iterdir()) == ["000.cu", "001.cu"]
        assert _strays(run) == []
        report = verify_run(run.dir)
        assert report.ok, report.problems
        assert (await ok(c, "describe_task"))["budget"]["attempts_used"] == 1

        again = await ok(c, "record_attempt", rationale="two, again", **arguments)
        assert (again["attempt"], again["verdict"], again["budget"]["attempts_used"]) == (2, "valid-faster", 2)
    run.close()
    assert _attempts(run.dir) == [(0, "baseline"), (1, "valid-faster"), (2, "valid-faster")]
    assert [e["data"]["attempt"] for e in events(run.dir) if e["kind"] == "attempt_started"] == [0, 1, 2]
    report = verify_run(run.dir)
    assert report.ok, report.problems

    run = resume_run(run.dir, executor())  # the candidate of the failed call was recorded by the retry
    assert run.attempts_used == 2 and [e.attempt for e in run.history] == [0, 1, 2]
    async with client(run) as c:
        assert (await ok(c, "describe_task"))["best_attempt"] == 2
        third = await ok(c, "record_attempt", source=kernel("latency_us=30"), rationale="three")
        assert (third["attempt"], third["verdict"]) == (3, "valid-faster")
    run.close()
    assert verify_run(run.dir).ok


AFTER_THE_CLAIM = {
    # the disk fills at this write, which comes after attempts/002.cu is written and logged
    "attempt_started record": lambda e: e == "log:attempt_started",
    "compile log": lambda e: e.startswith("file:compile-logs/"),
    "best.cu": lambda e: e == "file:best.cu",
    "best-case record": lambda e: e == "file:best-case-1.json",
    "history.json": lambda e: e == "file:history.json",
}


@pytest.mark.anyio
@pytest.mark.parametrize("where", list(AFTER_THE_CLAIM))
async def test_a_disk_filling_up_after_the_claim_counts_the_attempt_once_as_rejected(tmp_path, monkeypatch, where):
    run = new_run(tmp_path)
    disk = FullDisk(run, monkeypatch)
    async with client(run) as c:
        await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="one")
        disk.fill_at(AFTER_THE_CLAIM[where])
        await _fails_for_lack_of_space(c, "record_attempt", source=kernel("latency_us=40"), rationale="two")
        disk.free()
        assert disk.failed and AFTER_THE_CLAIM[where](disk.failed[0]), disk.failed
        assert (run.dir / "attempts" / "002.cu").read_text() == kernel("latency_us=40")
        assert run.attempts_used == 2
        interrupted = run.history[-1]
        assert (interrupted.attempt, interrupted.verdict) == (2, "rejected")
        reason = interrupted.reasons[0]
        assert reason.code == "worker_crashed"
        assert NO_SPACE in reason.detail and "stays counted" in reason.detail
        assert _strays(run) == []
        report = verify_run(run.dir)
        assert report.ok, report.problems
        described = await ok(c, "describe_task")
        assert (described["budget"]["attempts_used"], described["best_attempt"]) == (2, 1)

        third = await ok(c, "record_attempt", source=kernel("latency_us=30"), rationale="three")
        assert (third["attempt"], third["verdict"], third["budget"]["attempts_used"]) == (3, "valid-faster", 3)
    run.close()
    assert _attempts(run.dir) == [(0, "baseline"), (1, "valid-faster"), (2, "rejected"), (3, "valid-faster")]
    assert read_json(run.dir / "summary.json")["budget"] == {"max_attempts": 7, "used": 3, "left": 4}
    assert (read_json(run.dir / "summary.json")["best_attempt"], (run.dir / "best.cu").read_text()) == \
        (3, kernel("latency_us=30"))
    report = verify_run(run.dir)
    assert report.ok, report.problems

    run = resume_run(run.dir, executor())
    assert run.attempts_used == 3 and [(e.attempt, e.verdict) for e in run.history][2] == (2, "rejected")
    assert [e["kind"] for e in events(run.dir)].count("attempt_interrupted") <= 1
    run.close()


@pytest.mark.anyio
async def test_a_resume_after_a_disk_full_attempt_records_it_once(tmp_path, monkeypatch):
    """The disk stays full through the failed call's own clean-up; the resume settles the slot."""
    run = new_run(tmp_path)
    disk = FullDisk(run, monkeypatch)
    async with client(run) as c:
        disk.fill_at(lambda e: e.startswith("file:compile-logs/"))
        await _fails_for_lack_of_space(c, "record_attempt", source=kernel("latency_us=40"), rationale="one")
    disk.free()
    run.close()
    assert verify_run(run.dir).ok
    assert _attempts(run.dir) == [(0, "baseline")]  # history.json could not be written

    run = resume_run(run.dir, executor())
    assert run.attempts_used == 1 and [(e.attempt, e.verdict) for e in run.history] == [(0, "baseline"),
                                                                                           (1, "rejected")]
    async with client(run) as c:
        second = await ok(c, "record_attempt", source=kernel("latency_us=40"), rationale="two")
        assert (second["attempt"], second["verdict"]) == (2, "valid-faster")
    run.close()
    assert _attempts(run.dir) == [(0, "baseline"), (1, "rejected"), (2, "valid-faster")]
    assert verify_run(run.dir).ok


@pytest.mark.anyio
async def test_a_disk_full_at_the_summary_keeps_the_recorded_verdict(tmp_path, monkeypatch):
    """history.json holds the attempt before summary.json is written: the attempt keeps its verdict."""
    run = new_run(tmp_path)
    disk = FullDisk(run, monkeypatch)
    async with client(run) as c:
        disk.fill_at(lambda e: e == "file:summary.json")
        await _fails_for_lack_of_space(c, "record_attempt", source=kernel("latency_us=50"), rationale="one")
        disk.free()
        assert disk.failed[0] == "file:summary.json"
        assert _attempts(run.dir) == [(0, "baseline"), (1, "valid-faster")]
        assert verify_run(run.dir).ok
        described = await ok(c, "describe_task")
        assert (described["budget"]["attempts_used"], described["best_attempt"]) == (1, 1)
        second = await ok(c, "record_attempt", source=kernel("latency_us=40"), rationale="two")
        assert (second["attempt"], second["verdict"], second["best_attempt"]) == (2, "valid-faster", 2)
    run.close()
    assert read_json(run.dir / "summary.json")["best_attempt"] == 2
    assert verify_run(run.dir).ok


PROBE_LOG = {
    "the call record": (lambda e: e == "log:call", False),
    "the probe's record": (lambda e: e == "log:probe_done", False),
    "a short write of the probe's record": (lambda e: e == "log:probe_done", True),
}


@pytest.mark.anyio
@pytest.mark.parametrize("tool", ["run_cases", "validate", "time_kernel"])
@pytest.mark.parametrize("where", list(PROBE_LOG))
async def test_a_full_disk_while_a_probe_appends_to_the_log(tmp_path, monkeypatch, tool, where):
    trigger, short = PROBE_LOG[where]
    run = new_run(tmp_path)
    disk = FullDisk(run, monkeypatch)
    async with client(run) as c:
        candidate = (await ok(c, "compile_kernel", source=kernel()))["candidate"]
        await ok(c, "validate", candidate_id=candidate)
        size = (run.dir / "events.jsonl").stat().st_size
        disk.fill_at(trigger, short=short)
        result = await c.call_tool(tool, {"candidate_id": candidate})
        disk.free()
        assert result.is_error
        reason = os.strerror(errno.EIO) if short else NO_SPACE
        assert result.content[0].text.startswith(
            f"Error executing tool {tool}: the referee could not write its results folder ({reason})"), \
            result.content[0].text
        assert len(disk.failed) == 1 and trigger(disk.failed[0]), disk.failed
        log = (run.dir / "events.jsonl").read_bytes()
        assert log.endswith(b"\n")  # the failed record left no bytes behind: the log ends with what came before
        if where == "the call record":
            assert len(log) == size
        else:
            assert [e["kind"] for e in events(run.dir)][-1] == "call"
        report = verify_run(run.dir)
        assert report.ok, report.problems
        left = run.budget().probes_left_in_window
        assert left == 19  # the failed probe is not counted: the log, which a resume counts from, lacks it
        assert (await ok(c, tool, candidate_id=candidate))["budget"]["probes_left_in_window"] == 18
    run.close()
    assert verify_run(run.dir).ok
    run = resume_run(run.dir, executor())
    assert run.budget().probes_left_in_window == 18
    run.close()


@pytest.mark.anyio
@pytest.mark.parametrize("slot_written", [False, True])
async def test_a_claim_left_by_a_server_stopped_while_claiming_does_not_block_the_slot(tmp_path, slot_written):
    run = new_run(tmp_path)
    run.close()
    (run.dir / "attempts" / "001.claim").touch()
    if slot_written:  # stopped after the slot file was in place: it counts, as an interrupted attempt
        (run.dir / "attempts" / "001.cu").write_text(kernel("latency_us=50"))
    run = resume_run(run.dir, executor())
    assert _strays(run) == []
    async with client(run) as c:
        answer = await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="after the restart")
    run.close()
    assert (answer["attempt"], answer["verdict"]) == (1 + slot_written, "valid-faster")
    assert _attempts(run.dir) == [(0, "baseline")] + [(1, "rejected")] * slot_written + [(1 + slot_written,
                                                                                          "valid-faster")]
    report = verify_run(run.dir)
    assert report.ok, report.problems


@pytest.mark.anyio
async def test_a_disk_full_during_the_last_attempt_leaves_a_run_that_finish_can_end(tmp_path, monkeypatch):
    run = new_run(tmp_path, max_attempts=2)
    disk = FullDisk(run, monkeypatch)
    async with client(run) as c:
        await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="one")
        disk.fill_at(lambda e: e.startswith("file:compile-logs/"))
        await _fails_for_lack_of_space(c, "record_attempt", source=kernel("latency_us=40"), rationale="two")
        disk.free()
        assert verify_run(run.dir).ok
        budget = (await ok(c, "describe_task"))["budget"]
        assert (budget["attempts_used"], budget["attempts_left"]) == (2, 0)
        answer = await ok(c, "finish", reason="no attempts left")
        assert answer["best_attempt"] == 1
    run.close()
    assert _attempts(run.dir) == [(0, "baseline"), (1, "valid-faster"), (2, "rejected")]
    summary = read_json(run.dir / "summary.json")
    assert (summary["status"], summary["best_attempt"], summary["budget"]["used"]) == ("finished", 1, 2)
    report = verify_run(run.dir)
    assert report.ok, report.problems
