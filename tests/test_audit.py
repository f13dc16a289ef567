"""The audit store: atomic writes, the hash chain, repairs after a crash and whole-run checks."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest

from server.audit import GENESIS, AuditError, AuditLog, canonical_json, sha256_file, write_bytes_atomic, write_json_atomic
from server.verify import verify_chain, verify_run


def make_log(folder: Path, n: int = 6) -> Path:
    path = folder / "events.jsonl"
    with AuditLog(path) as log:
        for i in range(n):
            log.append("attempt", {"index": i, "score": 1234.5 + i, "note": f"kernel {i}"})
    return path


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def write_lines(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(lines))


def enospc(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


# -- the chain --------------------------------------------------------------------------------

def test_appended_records_form_a_valid_chain(tmp_path):
    path = tmp_path / "events.jsonl"
    with AuditLog(path) as log:
        assert (log.count, log.head) == (0, GENESIS)
        records = [log.append("attempt", {"index": i}) for i in range(5)]
        assert log.head == records[-1]["hash"]
        assert log.count == 5
    assert [r["seq"] for r in records] == [0, 1, 2, 3, 4]
    assert [r["prev"] for r in records] == [GENESIS] + [r["hash"] for r in records[:-1]]
    assert [json.loads(line) for line in lines_of(path)] == records
    stamp = datetime.fromisoformat(records[0]["time"])
    assert stamp.utcoffset() == timezone.utc.utcoffset(None)
    assert "." in records[0]["time"]
    report = verify_chain(path)
    assert report.ok and report.problems == [] and report.first_broken_line is None
    assert (report.records, report.head) == (5, records[-1]["hash"])


def test_each_hash_covers_the_canonical_record(tmp_path):
    path = make_log(tmp_path, 2)
    record = json.loads(lines_of(path)[1])
    body = {k: v for k, v in record.items() if k != "hash"}
    assert record["hash"] == hashlib.sha256(canonical_json(body)).hexdigest()
    assert lines_of(path)[1] == canonical_json(record) + b"\n"


def test_reopening_continues_the_chain(tmp_path):
    path = make_log(tmp_path, 3)
    head = json.loads(lines_of(path)[-1])["hash"]
    with AuditLog(path) as log:
        assert (log.count, log.head) == (3, head)
        record = log.append("more", {"x": 1})
    assert (record["seq"], record["prev"]) == (3, head)
    assert verify_chain(path).ok


def test_every_single_byte_edit_is_caught_at_its_line(tmp_path):
    path = make_log(tmp_path)
    original = lines_of(path)
    target = original[2]
    for offset in range(len(target) - 1):
        edited = bytearray(target)
        edited[offset] ^= 0x01
        write_lines(path, original[:2] + [bytes(edited)] + original[3:])
        report = verify_chain(path)
        assert not report.ok, f"edit at byte {offset} not caught"
        assert report.first_broken_line == 3
        assert report.problems[0].startswith("events.jsonl line 3:")


def test_a_changed_digit_in_the_data_is_an_edited_record(tmp_path):
    path = make_log(tmp_path)
    lines = lines_of(path)
    lines[3] = lines[3].replace(b'"index":3', b'"index":4')
    write_lines(path, lines)
    report = verify_chain(path)
    assert report.first_broken_line == 4
    assert report.problems == ["events.jsonl line 4: hash does not match its contents (record edited)"]


def test_an_equivalent_but_rewritten_number_is_caught(tmp_path):
    path = tmp_path / "events.jsonl"
    with AuditLog(path) as log:
        log.append("x", {"big": 1e20})
    assert b"1e+20" in path.read_bytes()
    path.write_bytes(path.read_bytes().replace(b"1e+20", b"1e020"))
    report = verify_chain(path)
    assert (report.ok, report.first_broken_line) == (False, 1)
    assert "canonical" in report.problems[0]


@pytest.mark.parametrize("removed", [1, 2, 4])
def test_a_removed_line_is_caught_where_it_was(tmp_path, removed):
    path = make_log(tmp_path)
    lines = lines_of(path)
    del lines[removed - 1]
    write_lines(path, lines)
    report = verify_chain(path)
    assert report.first_broken_line == removed
    assert len(report.problems) == 1


def test_swapped_lines_are_caught_at_the_first(tmp_path):
    path = make_log(tmp_path)
    lines = lines_of(path)
    lines[2], lines[3] = lines[3], lines[2]
    write_lines(path, lines)
    report = verify_chain(path)
    assert report.first_broken_line == 3
    assert "prev does not match line 2's hash" in report.problems[0]


def test_a_file_cut_mid_line_is_torn_at_its_last_line(tmp_path):
    path = make_log(tmp_path)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) - 40])
    report = verify_chain(path)
    assert report.first_broken_line == 6
    assert "torn" in report.problems[0]


def test_a_file_cut_at_a_line_boundary_fails_against_the_known_head(tmp_path):
    path = make_log(tmp_path)
    head = json.loads(lines_of(path)[-1])["hash"]
    write_lines(path, lines_of(path)[:4])
    assert verify_chain(path).ok
    report = verify_chain(path, expected_head=head)
    assert not report.ok
    assert "records removed from the end" in report.problems[0]


def test_a_forged_line_with_a_wrong_prev_is_caught(tmp_path):
    path = make_log(tmp_path)
    last = json.loads(lines_of(path)[-1])
    forged = {"seq": last["seq"] + 1, "time": last["time"], "kind": "attempt",
              "data": {"index": 99, "score": 1.0}, "prev": "f" * 64}
    forged["hash"] = hashlib.sha256(canonical_json(forged)).hexdigest()
    with open(path, "ab") as f:
        f.write(canonical_json(forged) + b"\n")
    report = verify_chain(path)
    assert report.first_broken_line == 7
    assert report.problems == ["events.jsonl line 7: prev does not match line 6's hash "
                               "(record removed or reordered)"]


@pytest.mark.parametrize("content, problem", [(None, "events.jsonl: missing"),
                                              (b"", "events.jsonl: empty")])
def test_a_missing_or_empty_log_is_a_problem(tmp_path, content, problem):
    path = tmp_path / "events.jsonl"
    if content is not None:
        path.write_bytes(content)
    report = verify_chain(path)
    assert (report.ok, report.problems, report.records, report.head) == (False, [problem], 0, None)


def test_a_line_that_is_not_json_is_named(tmp_path):
    path = make_log(tmp_path)
    lines = lines_of(path)
    lines.insert(4, b"hello\n")
    write_lines(path, lines)
    report = verify_chain(path)
    assert report.problems[0] == "events.jsonl line 5: not JSON"
    assert report.first_broken_line == 5


# -- crashes and failed writes ----------------------------------------------------------------

def test_a_torn_last_line_is_set_aside_and_repaired(tmp_path):
    path = make_log(tmp_path, 4)
    fragment = b'{"data":{"index":4,"sc'
    with open(path, "ab") as f:
        f.write(fragment)
    assert verify_chain(path).first_broken_line == 5
    with AuditLog(path) as log:
        assert log.count == 5
    aside = tmp_path / "events.jsonl.torn-1"
    assert aside.read_bytes() == fragment
    repaired = json.loads(lines_of(path)[-1])
    assert repaired["kind"] == "log_repaired"
    assert repaired["data"] == {"path": aside.name, "bytes": len(fragment),
                                "sha256": hashlib.sha256(fragment).hexdigest()}
    assert verify_chain(path).ok
    assert verify_run(tmp_path).ok


def test_a_log_holding_only_a_torn_line_restarts_the_chain(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"seq":0,"ti')
    (tmp_path / "events.jsonl.torn-1").write_bytes(b"an earlier repair")
    with AuditLog(path) as log:
        assert log.count == 1
    assert (tmp_path / "events.jsonl.torn-2").read_bytes() == b'{"seq":0,"ti'
    assert verify_chain(path).ok


def test_an_unreadable_last_record_refuses_to_open(tmp_path):
    path = make_log(tmp_path, 2)
    with open(path, "ab") as f:
        f.write(b"garbage\n")
    with pytest.raises(AuditError):
        AuditLog(path)


def test_a_short_append_leaves_the_log_as_it_was(tmp_path, monkeypatch):
    path = make_log(tmp_path, 3)
    before = path.read_bytes()
    real_write = os.write
    with AuditLog(path) as log:
        monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, data[: len(data) // 2]))
        with pytest.raises(OSError):
            log.append("attempt", {"index": 3})
        monkeypatch.setattr(os, "write", real_write)
        assert path.read_bytes() == before
        assert log.append("attempt", {"index": 3})["seq"] == 3
    assert verify_chain(path).ok


def test_an_append_whose_fsync_fails_is_undone(tmp_path, monkeypatch):
    path = make_log(tmp_path, 3)
    before = path.read_bytes()
    with AuditLog(path) as log:
        head = log.head
        with monkeypatch.context() as patch:
            patch.setattr(os, "fsync", enospc)
            with pytest.raises(OSError) as raised:
                log.append("attempt", {"index": 3})
        assert raised.value.errno == errno.ENOSPC
        assert (path.read_bytes(), log.head, log.count) == (before, head, 3)


def test_write_json_atomic_round_trips(tmp_path):
    path = tmp_path / "history.json"
    value = {"attempts": [1, 2.5, None], "name": "tiled ✓"}
    digest = write_json_atomic(path, value)
    assert json.loads(path.read_text(encoding="utf-8")) == value
    assert digest == sha256_file(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert write_json_atomic(path, {"replaced": True}) == sha256_file(path)
    assert json.loads(path.read_text()) == {"replaced": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.json"]


def test_write_bytes_atomic_returns_the_hash_of_what_it_wrote(tmp_path):
    path = tmp_path / "best.cu"
    data = b"__global__ void k() {}\n"
    assert write_bytes_atomic(path, data) == hashlib.sha256(data).hexdigest() == sha256_file(path)
    assert path.read_bytes() == data


def _failing_midway(real_write):
    calls = []

    def write(fd, data):
        calls.append(fd)
        if len(calls) == 1:
            return real_write(fd, bytes(data[:5]))
        raise OSError(errno.ENOSPC, "No space left on device")
    return write


@pytest.mark.parametrize("failure", ["fsync", "write"])
def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch, failure):
    path = tmp_path / "history.json"
    write_json_atomic(path, {"old": True})
    old = path.read_bytes()
    if failure == "fsync":
        monkeypatch.setattr(os, "fsync", enospc)
    else:
        monkeypatch.setattr(os, "write", _failing_midway(os.write))
    with pytest.raises(OSError) as raised:
        write_json_atomic(path, {"new": list(range(1000))})
    assert raised.value.errno == errno.ENOSPC
    assert path.read_bytes() == old
    assert [p.name for p in tmp_path.iterdir()] == ["history.json"]


def test_non_finite_numbers_are_written_as_strings(tmp_path):
    path = tmp_path / "x.json"
    write_json_atomic(path, {"got": [float("nan"), float("inf"), -float("inf"), 1.5]})
    assert json.loads(path.read_text()) == {"got": ["NaN", "Infinity", "-Infinity", 1.5]}
    log = AuditLog(tmp_path / "events.jsonl")
    assert log.append("mismatch", {"got": float("nan")})["data"] == {"got": "NaN"}
    assert verify_chain(tmp_path / "events.jsonl").ok


def test_a_value_that_is_not_json_writes_nothing(tmp_path):
    with pytest.raises(TypeError):
        write_json_atomic(tmp_path / "x.json", {"score": object()})
    assert list(tmp_path.iterdir()) == []


# -- whole runs -------------------------------------------------------------------------------

def make_run(run: Path) -> AuditLog:
    (run / "task").mkdir(parents=True)
    (run / "attempts").mkdir()
    (run / "task" / "reference.cu").write_bytes(b"__global__ void ref() {}\n")
    log = AuditLog(run / "events.jsonl")
    lock = {"files": {"task/reference.cu": sha256_file(run / "task" / "reference.cu")}}
    log.record_file(run / "lock.json", write_json_atomic(run / "lock.json", lock))
    log.record_file(Path("history.json"), write_json_atomic(run / "history.json", {"attempts": [1]}))
    cu = run / "attempts" / "001.cu"
    log.record_file(cu, write_bytes_atomic(cu, b"__global__ void k() {}\n"), kind="attempt_source")
    log.record_file(Path("history.json"), write_json_atomic(run / "history.json", {"attempts": [1, 2]}))
    log.record_file(Path("summary.json"), write_json_atomic(run / "summary.json", {"chain_head": log.head}))
    return log


def test_an_intact_run_verifies(tmp_path):
    make_run(tmp_path).close()
    report = verify_run(tmp_path)
    assert report.ok and report.problems == []
    assert report.records == 5


def test_a_recorded_file_edited_by_one_byte_is_named(tmp_path):
    make_run(tmp_path).close()
    history = tmp_path / "history.json"
    history.write_bytes(history.read_bytes().replace(b"2", b"3"))
    report = verify_run(tmp_path)
    assert not report.ok
    assert report.problems == [
        "history.json: sha256 differs from the last recorded write (events.jsonl line 4)"]
    assert report.first_broken_line is None


def test_a_recorded_file_that_vanished_is_named(tmp_path):
    make_run(tmp_path).close()
    (tmp_path / "attempts" / "001.cu").unlink()
    report = verify_run(tmp_path)
    assert report.problems == ["attempts/001.cu: missing (events.jsonl line 3)"]


def test_a_locked_file_edited_is_named(tmp_path):
    make_run(tmp_path).close()
    (tmp_path / "task" / "reference.cu").write_bytes(b"__global__ void ref() {;}\n")
    report = verify_run(tmp_path)
    assert report.problems == ["task/reference.cu: differs from lock.json"]
    (tmp_path / "task" / "reference.cu").unlink()
    assert verify_run(tmp_path).problems == ["task/reference.cu: missing (listed in lock.json)"]


def test_a_summary_claiming_an_unknown_head_is_caught(tmp_path):
    make_run(tmp_path).close()
    write_json_atomic(tmp_path / "summary.json", {"chain_head": "a" * 64})
    report = verify_run(tmp_path)
    assert not report.ok
    assert any(p.startswith("summary.json: chain_head " + "a" * 64) for p in report.problems)


def test_a_summary_outliving_removed_records_is_caught(tmp_path):
    with make_run(tmp_path) as log:
        log.append("attempt", {"index": 2})
        log.record_file(Path("summary.json"), write_json_atomic(tmp_path / "summary.json", {"chain_head": log.head}))
    path = tmp_path / "events.jsonl"
    write_lines(path, lines_of(path)[:-2])
    assert verify_chain(path).ok
    report = verify_run(tmp_path)
    assert {p.split(":")[0] for p in report.problems} == {"summary.json"}
    assert any("chain_head" in p for p in report.problems)


def test_a_broken_chain_makes_the_run_fail(tmp_path):
    make_run(tmp_path).close()
    path = tmp_path / "events.jsonl"
    lines = lines_of(path)
    del lines[1]
    write_lines(path, lines)
    report = verify_run(tmp_path)
    assert not report.ok and report.first_broken_line == 2


def test_record_file_refuses_paths_outside_the_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with AuditLog(run / "events.jsonl") as log:
        for outside in (tmp_path / "elsewhere.json", Path("../elsewhere.json")):
            with pytest.raises(ValueError):
                log.record_file(outside, "0" * 64)
        with pytest.raises(ValueError):
            log.record_file(Path("x.json"), "not a hash")


# -- concurrency ------------------------------------------------------------------------------

def test_concurrent_appends_keep_the_chain(tmp_path):
    path = tmp_path / "events.jsonl"
    with AuditLog(path) as log:
        def worker(thread: int) -> None:
            for i in range(50):
                log.append("tick", {"thread": thread, "i": i})
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert log.count == 200
    report = verify_chain(path)
    assert (report.ok, report.records) == (True, 200)
    seen = {(r["data"]["thread"], r["data"]["i"]) for r in map(json.loads, lines_of(path))}
    assert seen == {(t, i) for t in range(4) for i in range(50)}
