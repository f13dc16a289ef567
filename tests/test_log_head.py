"""The log's signed head (events-head.json, server/log_head.py): records cut from the end of an unfinished run, a
head rewritten, unsigned or removed fail `verify`; a kill between an append and the head's write leaves a head one
record behind, which verifies and which resuming the run writes again; a signed run made before heads were kept
verifies with exit 5."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import anyio
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from server import audit
from server.audit import AuditLog
from server.cli import main
from server.lifecycle import resume_run
from server.log_head import HEAD_NAME, KEEPS_HEAD, head_bytes, head_digest, read_head
from server.records import EventKind
from server.run import RunError
from server.signed_log import run_key
from server.verify import verify_run
from tests.server_support import client, events, executor, kernel, new_run, ok

CALLS_AFTER_ATTEMPT = 5


async def _attempt_then_look(run) -> None:
    async with client(run) as c:
        await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="tiles of 32")
        for _ in range(CALLS_AFTER_ATTEMPT):  # one record each, after the last one summary.json names
            await ok(c, "describe_task")


@pytest.fixture(scope="module")
def unfinished(tmp_path_factory) -> Path:
    """An unfinished run (an attempt, then calls), its server stopped; tests take copies."""
    run = new_run(tmp_path_factory.mktemp("head"))
    try:
        anyio.run(_attempt_then_look, run, backend="asyncio")
    finally:
        run.close()
    return run.dir


@pytest.fixture
def run_dir(unfinished, tmp_path) -> Path:
    copy = tmp_path / "run-001"
    shutil.copytree(unfinished, copy)
    return copy


def _lines(run_dir: Path) -> list[bytes]:
    return (run_dir / "events.jsonl").read_bytes().splitlines(keepends=True)


def _cut(run_dir: Path, count: int) -> None:
    (run_dir / "events.jsonl").write_bytes(b"".join(_lines(run_dir)[:-count]))  # head -n -COUNT events.jsonl


def _last_seq(run_dir: Path) -> int:
    return json.loads(_lines(run_dir)[-1])["seq"]


def _kill_before_the_head(monkeypatch):
    """The process dies after a record is appended and before its head is written."""
    real = audit.write_bytes_atomic

    def write(path, data):
        if Path(path).name == HEAD_NAME:
            raise SystemExit("killed")
        return real(path, data)

    monkeypatch.setattr(audit, "write_bytes_atomic", write)
    return lambda: monkeypatch.setattr(audit, "write_bytes_atomic", real)


def test_an_unfinished_run_keeps_a_signed_head_naming_its_last_record(run_dir):
    head, why = read_head(run_dir)
    assert why is None and head.seq == _last_seq(run_dir)
    assert events(run_dir)[0]["data"][KEEPS_HEAD] == HEAD_NAME
    report = verify_run(run_dir)
    assert report.ok and report.end_pinned, report.problems


@pytest.mark.parametrize("cut", [1, 2, 5])
def test_records_cut_from_the_end_of_an_unfinished_run_fail_verify_naming_how_many(run_dir, cut, capsys):
    last = _last_seq(run_dir)
    _cut(run_dir, cut)  # the calls after the attempt: summary.json and every recorded file still hold
    missing = f"{cut} record{'s' if cut > 1 else ''}"
    says = (f"events.jsonl ends at record {last - cut}, but its signed head (events-head.json) is record {last}: "
            f"{missing} missing from the end (cut)")
    assert verify_run(run_dir).problems == [says]
    assert main(["verify", str(run_dir)]) == 1
    assert says in capsys.readouterr().out
    with pytest.raises(RunError, match=r"missing from the end \(cut\)"):
        resume_run(run_dir, executor())


def _record(run_dir: Path, back: int) -> dict:
    return json.loads(_lines(run_dir)[-1 - back])


def _other_key_sign(digest: str) -> str:
    return Ed25519PrivateKey.generate().sign(bytes.fromhex(digest)).hex()


@pytest.mark.parametrize("forge, says", [
    # the seq and hash of an earlier record, the head's signature kept
    (lambda head, r: {**head, "seq": r(2)["seq"], "hash": r(2)["hash"]},
     "events-head.json: its signature does not verify"),
    # an earlier record's own signature: it signs the record's hash, not a head
    (lambda head, r: {"seq": r(2)["seq"], "hash": r(2)["hash"], "sig": r(2)["sig"]},
     "events-head.json: its signature does not verify"),
    # signed with another key
    (lambda head, r: {"seq": r(2)["seq"], "hash": r(2)["hash"],
                      "sig": _other_key_sign(head_digest(r(2)["seq"], r(2)["hash"]))},
     "events-head.json: its signature does not verify"),
    # unsigned
    (lambda head, r: {"seq": r(2)["seq"], "hash": r(2)["hash"]}, "events-head.json: not a log head (rewritten)"),
])
def test_a_head_rewritten_to_cover_a_cut_fails_verify_and_resume(run_dir, forge, says):
    head = forge(json.loads((run_dir / HEAD_NAME).read_text()), lambda back: _record(run_dir, back))
    _cut(run_dir, 2)
    (run_dir / HEAD_NAME).write_text(json.dumps(head))
    report = verify_run(run_dir)
    assert not report.ok
    assert [p for p in report.problems if p.startswith(says)], report.problems
    with pytest.raises(RunError, match="events-head.json"):
        resume_run(run_dir, executor())


def test_a_head_signed_with_the_runs_key_for_an_earlier_record_still_fails_against_the_log(run_dir):
    earlier = _record(run_dir, 3)
    (run_dir / HEAD_NAME).write_bytes(head_bytes(earlier["seq"], earlier["hash"], run_key(run_dir)))
    assert verify_run(run_dir).problems == [
        f"events.jsonl holds 3 records after its signed head (events-head.json, record {earlier['seq']}); a head "
        "lags at most one record (a kill between an append and the head's write)"]


def test_the_head_removed_fails_verify_and_resume(run_dir, capsys):
    (run_dir / HEAD_NAME).unlink()
    last = _last_seq(run_dir)
    assert verify_run(run_dir).problems == [
        f"events-head.json: missing, though the run's first record says it keeps one (removed: where the log ends "
        f"is unknown, events.jsonl holds records 0 to {last})"]
    assert main(["verify", str(run_dir)]) == 1
    assert "events-head.json: missing" in capsys.readouterr().out
    with pytest.raises(RunError, match="events-head.json: missing"):
        resume_run(run_dir, executor())


def test_a_kill_between_an_append_and_its_head_verifies_and_resuming_writes_the_head_again(run_dir, monkeypatch):
    before = _last_seq(run_dir)
    restore = _kill_before_the_head(monkeypatch)
    log = AuditLog(run_dir / "events.jsonl", signer=run_key(run_dir))
    with pytest.raises(SystemExit):
        log.append(EventKind.CALL, {"tool": "describe_task"})
    log.close()
    restore()
    assert _last_seq(run_dir) == before + 1 and read_head(run_dir)[0].seq == before  # the head lags, never leads
    report = verify_run(run_dir)
    assert report.ok and report.end_pinned, report.problems

    unpinned = run_dir.with_name("unpinned")  # what remains: the one record the kill left unpinned can be cut
    shutil.copytree(run_dir, unpinned)
    _cut(unpinned, 1)
    assert verify_run(unpinned).ok
    _cut(unpinned, 1)  # but no more
    assert not verify_run(unpinned).ok

    resumed = resume_run(run_dir, executor())
    resumed.close()
    assert _last_seq(run_dir) > before + 1  # the kill's record, then the resume's
    assert read_head(run_dir)[0].seq == _last_seq(run_dir)
    assert verify_run(run_dir).ok


def test_a_head_that_cannot_be_written_lags_one_record_and_is_written_before_the_next(run_dir, monkeypatch):
    real = audit.write_bytes_atomic
    full = {"on": True}

    def write(path, data):
        if Path(path).name == HEAD_NAME and full["on"]:
            raise OSError(28, "No space left on device")
        return real(path, data)

    monkeypatch.setattr(audit, "write_bytes_atomic", write)
    before = _last_seq(run_dir)
    with AuditLog(run_dir / "events.jsonl", signer=run_key(run_dir)) as log:
        log.append(EventKind.CALL, {"tool": "describe_task"})  # in the log; its head is not
        assert read_head(run_dir)[0].seq == before and verify_run(run_dir).ok
        with pytest.raises(OSError, match="No space"):  # the head first: never two records past it
            log.append(EventKind.CALL, {"tool": "describe_task"})
        assert _last_seq(run_dir) == before + 1
        full["on"] = False
        log.append(EventKind.CALL, {"tool": "describe_task"})
    assert read_head(run_dir)[0].seq == _last_seq(run_dir) == before + 2
    assert verify_run(run_dir).ok


def test_the_compile_rate_limit_cannot_be_rolled_back_by_cutting_the_log(tmp_path):
    async def compile_twice(run) -> None:
        async with client(run) as c:
            for mark in ("v1", "v2"):
                await ok(c, "compile_kernel", source=kernel(mark))

    run = new_run(tmp_path, compiles_per_minute=3)
    anyio.run(compile_twice, run, backend="asyncio")
    run.close()
    kinds = [e["kind"] for e in events(run.dir)]
    first_compile = kinds.index("compile_charged") - 1  # its call record
    cut = len(kinds) - first_compile
    _cut(run.dir, cut)  # the compiles gone, so the rebuilt window would be empty
    with pytest.raises(RunError, match=rf"{cut} records missing from the end \(cut\)"):
        resume_run(run.dir, executor())
    assert any(p.endswith(f"{cut} records missing from the end (cut)") for p in verify_run(run.dir).problems)


def test_a_signed_run_made_before_heads_were_kept_verifies_with_exit_5_until_it_is_resumed(tmp_path, monkeypatch,
                                                                                          capsys):
    real_append = AuditLog.append

    def append_as_before(self, kind, data):  # no head promised in the first record, none written
        return real_append(self, kind, {k: v for k, v in data.items() if k != KEEPS_HEAD})

    monkeypatch.setattr(AuditLog, "append", append_as_before)
    monkeypatch.setattr(AuditLog, "_write_head", lambda self: setattr(self, "_head_behind", False))
    run = new_run(tmp_path)
    run.close()
    monkeypatch.undo()
    assert not (run.dir / HEAD_NAME).exists()
    report = verify_run(run.dir)
    assert report.ok and report.signed and not report.end_pinned, report.problems
    assert main(["verify", str(run.dir)]) == 5
    assert "end not pinned (signed before the log kept its signed head, events-head.json)" in capsys.readouterr().out

    resumed = resume_run(run.dir, executor())  # its end pinned from now on
    resumed.close()
    assert read_head(run.dir)[0].seq == _last_seq(run.dir)
    assert main(["verify", str(run.dir)]) == 0


def test_a_head_whose_seq_no_digest_can_hold_is_refused_not_a_crash(run_dir):
    (run_dir / HEAD_NAME).write_text(json.dumps({"seq": 1 << 64, "hash": "0" * 64, "sig": "00"}))
    assert "events-head.json: not a log head (rewritten)" in verify_run(run_dir).problems
    with pytest.raises(RunError, match="events-head.json: not a log head"):
        resume_run(run_dir, executor())


def test_a_record_appended_while_verify_reads_the_folder_is_no_cut(run_dir, monkeypatch):
    """A read-only call (describe_task) is logged without the run's mutex, so verify (the finished run's report)
    may read the log and then the head a concurrent append wrote: that is a longer log, not a shorter one."""
    from server import verify as verify_module
    real = verify_module._recorded_files

    def append_meanwhile(folder, parsed):  # after the log was read
        with AuditLog(folder / "events.jsonl", signer=run_key(folder)) as log:
            log.append(EventKind.CALL, {"tool": "describe_task"})
        return real(folder, parsed)

    monkeypatch.setattr(verify_module, "_recorded_files", append_meanwhile)
    report = verify_run(run_dir)
    assert report.ok and report.end_pinned, report.problems
