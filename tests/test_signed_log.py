"""The signed audit log: a run folder whose log was cut, re-chained or signed again, or whose files were added,
removed or changed, fails `verify`; a fingerprint held outside pins the key; `--key-dir` keeps the key out."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import anyio
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from server import keys
from server.audit import AuditError, AuditLog, canonical_json, record_hash, sha256_file
from server.cli import main
from server.lifecycle import resume_run
from server.log_head import HEAD_NAME, head_digest
from server.run import RunError
from server.signed_log import manifest_digest
from server.verify import verify_run
from tests.report_support import FIXTURE_RUNS
from tests.server_support import client, executor, kernel, new_run, ok


async def _finish(run) -> dict:
    async with client(run) as c:
        await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="tiles of 32")
        await ok(c, "record_attempt", source=kernel("note: same"), rationale="no change")
        return await ok(c, "finish", reason="done")


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, dict]:
    """A finished run made on the CPU (the fake executor), and finish's answer; tests take copies."""
    run = new_run(tmp_path_factory.mktemp("signed"))
    try:
        answer = anyio.run(_finish, run, backend="asyncio")
    finally:
        run.close()
    return run.dir, answer


@pytest.fixture
def run_dir(finished, tmp_path) -> Path:
    copy = tmp_path / "run-001"
    shutil.copytree(finished[0], copy)
    return copy


def _lines(run_dir: Path) -> list[bytes]:
    return (run_dir / "events.jsonl").read_bytes().splitlines()


def _write_lines(run_dir: Path, lines: list[bytes]) -> None:
    (run_dir / "events.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))


def _fingerprint(run_dir: Path) -> str:
    return json.loads((run_dir / "lock.json").read_text())["signing_key"]["fingerprint"]


def _rechain(records: list[dict], sign=None, keep_sig: bool = True) -> list[bytes]:
    """The records with every hash (and, given `sign`, every signature) computed again, as an editor would."""
    prev, lines = "0" * 64, []
    for record in records:
        record = {k: v for k, v in record.items() if k != "sig" or keep_sig}
        record["prev"] = prev
        record["hash"] = prev = record_hash(record)
        if sign is not None:
            record["sig"] = sign(record["hash"])
        lines.append(canonical_json(record))
    return lines


def _with_verdict_raised(run_dir: Path) -> list[dict]:
    """The log's records with attempt 2's verdict turned from valid-not-faster to valid-faster."""
    records = [json.loads(line) for line in _lines(run_dir)]
    done = [r for r in records if r["kind"] == "attempt_done" and r["data"].get("verdict") == "valid-not-faster"]
    assert done, [r["data"] for r in records if r["kind"] == "attempt_done"]
    done[-1]["data"]["verdict"] = "valid-faster"
    return records


def test_a_finished_run_is_signed_and_verifies_against_its_fingerprint(finished, run_dir, capsys):
    fingerprint = _fingerprint(run_dir)
    assert finished[1]["signing_key_fingerprint"] == fingerprint
    records = [json.loads(line) for line in _lines(run_dir)]
    assert all("sig" in r for r in records)
    assert records[0]["data"]["signing_key"]["fingerprint"] == fingerprint
    report = verify_run(run_dir, public_key=fingerprint)
    assert report.ok, report.problems
    assert report.fingerprint == fingerprint
    assert main(["verify", str(run_dir), "--public-key", fingerprint]) == 0
    assert f"signed by key {fingerprint}" in capsys.readouterr().out


@pytest.mark.parametrize("cut", [1, 2, 3, 5])
def test_a_log_cut_at_a_line_boundary_is_refused(run_dir, cut):
    _write_lines(run_dir, _lines(run_dir)[:-cut])  # head -n -CUT events.jsonl
    report = verify_run(run_dir)
    assert not report.ok
    # summary.json names a record the log no longer holds, or (one line cut) its own write is gone
    assert any("removed from the end" in p or p.startswith("summary.json: sha256 differs") for p in report.problems)


def test_a_verdict_raised_and_the_chain_recomputed_is_refused(run_dir):
    records = _with_verdict_raised(run_dir)
    _write_lines(run_dir, _rechain(records))  # the old signatures kept
    report = verify_run(run_dir)
    assert not report.ok
    assert any("signature does not verify" in p for p in report.problems), report.problems

    _write_lines(run_dir, _rechain(records, keep_sig=False))  # the signatures dropped: an "old", unsigned log
    report = verify_run(run_dir)
    assert not report.ok
    assert any("signatures removed" in p for p in report.problems), report.problems


def test_a_run_whose_log_was_re_chained_is_not_resumed(run_dir):
    _write_lines(run_dir, _rechain(_with_verdict_raised(run_dir)))
    with pytest.raises(RunError, match="signature does not verify"):
        resume_run(run_dir, executor())


def test_a_log_signed_again_with_another_key_fails_against_the_fingerprint_held_outside(run_dir, capsys):
    held = _fingerprint(run_dir)
    records = _with_verdict_raised(run_dir)
    forger = Ed25519PrivateKey.generate()
    public = forger.public_key().public_bytes_raw().hex()
    anchor = {"algorithm": "ed25519", "public_key": public, "fingerprint": keys.fingerprint_of(public)}
    records[0]["data"]["signing_key"] = anchor
    lock = json.loads((run_dir / "lock.json").read_text())
    lock["signing_key"] = anchor
    (run_dir / "lock.json").write_text(json.dumps(lock))
    for record in records:
        if record["data"].get("path") == "lock.json":
            record["data"]["sha256"] = sha256_file(run_dir / "lock.json")
    _write_lines(run_dir, _rechain(records, sign=lambda h: forger.sign(bytes.fromhex(h)).hex()))
    # summary.json names the record it was written after: point it at the re-made one.
    summary = json.loads((run_dir / "summary.json").read_text())
    remade = {json.loads(line)["seq"]: json.loads(line)["hash"] for line in _lines(run_dir)}
    summary["chain_head"] = remade[summary["chain_seq"]]
    (run_dir / "summary.json").write_text(json.dumps(summary))
    records = [json.loads(line) for line in _lines(run_dir)]
    last_write = [r for r in records if r["data"].get("path") == "summary.json"][-1]  # after the record it names
    last_write["data"]["sha256"] = sha256_file(run_dir / "summary.json")
    _write_lines(run_dir, _rechain(records, sign=lambda h: forger.sign(bytes.fromhex(h)).hex()))
    manifest = json.loads((run_dir / "derived.json").read_text())
    manifest["sig"] = forger.sign(bytes.fromhex(manifest_digest(manifest["files"]))).hex()
    (run_dir / "derived.json").write_text(json.dumps(manifest))
    last = json.loads(_lines(run_dir)[-1])  # and the log's head, where it ends
    digest = head_digest(last["seq"], last["hash"])
    (run_dir / HEAD_NAME).write_text(json.dumps({"seq": last["seq"], "hash": last["hash"],
                                                 "sig": forger.sign(bytes.fromhex(digest)).hex()}))

    forged = verify_run(run_dir)
    assert forged.ok, forged.problems  # a whole forgery holds together: only the anchor held outside tells
    report = verify_run(run_dir, public_key=held)
    assert not report.ok
    assert any(f"is not the expected {held}" in p for p in report.problems), report.problems
    assert main(["verify", str(run_dir), "--public-key", held]) == 1
    assert "FAILED" in capsys.readouterr().out


@pytest.mark.parametrize("added", ["notes.txt", "attempts/009.cu", "task/extra.cu", "expected/extra.npy"])
def test_a_file_added_to_the_run_folder_is_refused(run_dir, added):
    target = run_dir / added
    target.parent.chmod(stat.S_IRWXU)  # the task copy is read-only
    target.write_bytes(b"// added\n")
    report = verify_run(run_dir)
    assert not report.ok
    assert f"{added}: added (no record of the log, nor lock.json, accounts for it)" in report.problems


@pytest.mark.parametrize("name", ["report.html", "heatmap.svg", "heatmap.png"])
def test_a_report_file_removed_or_changed_is_refused(run_dir, name):
    saved = (run_dir / name).read_bytes()
    (run_dir / name).unlink()
    report = verify_run(run_dir)
    assert not report.ok
    assert f"{name}: removed (listed in derived.json)" in report.problems
    (run_dir / name).write_bytes(saved + b" ")
    assert f"{name}: sha256 differs from derived.json" in verify_run(run_dir).problems
    (run_dir / name).write_bytes(saved)
    assert verify_run(run_dir).ok


def test_the_list_of_report_files_rewritten_without_the_key_is_refused(run_dir):
    (run_dir / "report.html").write_text("<p>valid-faster, 9.9x</p>")
    manifest = json.loads((run_dir / "derived.json").read_text())
    manifest["files"]["report.html"] = sha256_file(run_dir / "report.html")
    (run_dir / "derived.json").write_text(json.dumps(manifest))
    assert "derived.json: its signature does not verify (the list of report files was rewritten)" in \
        verify_run(run_dir).problems
    (run_dir / "derived.json").unlink()
    assert "report.html: not listed in a signed derived.json (none there)" in verify_run(run_dir).problems


def test_a_record_appended_without_the_key_is_refused(run_dir):
    with AuditLog(run_dir / "events.jsonl") as log, pytest.raises(AuditError, match="is signed"):
        log.append("call", {"tool": "describe_task"})


def test_report_refuses_a_folder_that_fails_verify(run_dir, capsys):
    history = run_dir / "history.json"
    history.write_bytes(history.read_bytes().replace(b"valid-not-faster", b"valid-faster", 1))
    page = (run_dir / "report.html").read_bytes()
    assert main(["report", str(run_dir)]) != 0
    assert "does not verify" in capsys.readouterr().err
    assert (run_dir / "report.html").read_bytes() == page


def test_report_written_again_is_listed_again_and_verifies(run_dir):
    (run_dir / "report.html").unlink()
    log = (run_dir / "events.jsonl").read_bytes()
    assert main(["report", str(run_dir)]) == 0
    assert verify_run(run_dir, public_key=_fingerprint(run_dir)).ok
    assert (run_dir / "events.jsonl").read_bytes() == log  # derived files leave the log as it was


def test_a_run_made_with_a_key_dir_verifies_and_its_folder_holds_no_private_key(tmp_path):
    key_dir = tmp_path / "keys"
    key_dir.mkdir(mode=0o700)
    run = new_run(tmp_path, key_dir=key_dir)
    try:
        answer = anyio.run(_finish, run, backend="asyncio")
    finally:
        run.close()
    fingerprint = answer["signing_key_fingerprint"]
    key_file = key_dir / f"{fingerprint}.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    private_hex = key_file.read_text().strip().encode()
    assert not (run.dir / keys.KEY_FILE).exists()
    assert not [p for p in run.dir.rglob("*") if p.is_file() and private_hex in p.read_bytes()]
    assert verify_run(run.dir, public_key=fingerprint).ok

    resumed = resume_run(run.dir, executor())  # the key folder, as the run recorded it, signs what follows
    resumed.close()
    assert verify_run(run.dir, public_key=fingerprint).ok


def test_a_key_dir_open_to_other_users_is_refused_before_a_run_is_made(tmp_path):
    key_dir = tmp_path / "keys"
    key_dir.mkdir()
    os.chmod(key_dir, 0o755)
    with pytest.raises(RunError, match="open to other users"):
        new_run(tmp_path, key_dir=key_dir)
    assert not list((tmp_path / "results").glob("run-*"))


def test_a_run_made_before_signing_verifies_as_unsigned_with_its_own_status(capsys):
    fixture = next(p for p in sorted(FIXTURE_RUNS.iterdir()) if (p / "events.jsonl").is_file())
    report = verify_run(fixture)
    assert report.ok and not report.signed
    assert main(["verify", str(fixture)]) == 5
    assert "unsigned (made before signing)" in capsys.readouterr().out
    assert main(["verify", str(fixture), "--public-key", "ab" * 32]) == 1
