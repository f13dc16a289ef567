"""`kernel-referee approve` and `keygen` on CPU: approvals made from runs of the real run logic with the fake
executor, their replays made by the real replay with the fake, or recorded in the run."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil

import pytest

from guard.approve import ApproveOptions, approve
from guard.cli import main
from guard.store import ENVELOPE, READABLE, approval_dir, load_store
from server import entry
from server.replay import replay
from server.verify import verify_run
from tests.approval_support import NAME, approved, fake, fresh_run, new_store, no_gpu, run_dir  # noqa: F401 - fixtures
from server.attempt import record_attempt
from tests.server_support import HOLDOUT, kernel, new_run, read_json
from tests.test_replay import HoldoutFailsHere, make_run


def test_approve_makes_a_signed_approval_of_the_best_with_its_accepted_latency(fresh_run, tmp_path):
    code, store, _, out = approved(tmp_path, fresh_run, note="the tiled kernel")
    assert code == 0, out
    [loaded] = load_store(store)
    approval, history = loaded.approval, read_json(fresh_run / "history.json")
    best = history["attempts"][1]
    assert approval.name == NAME and approval.kernel.attempt == 1 and approval.baseline.attempt == 0
    assert approval.kernel.sha256 == best["source_sha256"]
    assert loaded.source("kernel.cu") == (fresh_run / "best.cu").read_text()
    assert loaded.source("baseline.cu") == (fresh_run / "attempts/000.cu").read_text()
    assert approval.kernel.launch == best["launch"]
    task_files = sorted(p.relative_to(fresh_run).as_posix() for p in (fresh_run / "task").rglob("*") if p.is_file())
    assert sorted(approval.task.files) == task_files and approval.task.name == "matmul_f32"
    assert all((loaded.folder / f).read_bytes() == (fresh_run / f).read_bytes() for f in task_files)
    assert [c.case for c in approval.cases] == sorted(best["timing"])
    for case in approval.cases:
        row = best["timing"][case.case]
        assert case.kernel.median_ms == row["stats"]["median_ms"] and case.kernel.ci_low_ms == row["stats"]["ci_low_ms"]
        assert case.baseline.median_ms == row["baseline_stats"]["median_ms"]
        assert case.speedup.ratio == pytest.approx(2.0, rel=0.02) and case.samples_ms == row["samples_ms"]
    assert approval.speedup.ratio == best["speedup_vs_baseline"]["ratio"]
    report, lock = verify_run(fresh_run), read_json(fresh_run / "lock.json")
    assert report.ok, report.problems  # the replay made for the approval is signed into the run's derived.json
    provenance = approval.provenance
    assert (provenance.run, provenance.chain_head, provenance.chain_records) == ("run-001", report.head, report.records)
    assert provenance.run_key_fingerprint == lock["signing_key"]["fingerprint"]
    assert provenance.replay.decision == "GO" and provenance.replay.document == "replay.json"
    assert provenance.replay.gpu == "Fake GPU" and provenance.note == "the tiled kernel"
    assert not provenance.forced and provenance.forced_over == []
    assert approval.fingerprint.gpu == lock["environment"]["gpu"]
    assert approval.fingerprint.referee_source_sha256 == lock["referee_source_sha256"]
    assert json.loads((loaded.folder / READABLE).read_text())["provenance"]["note"] == "the tiled kernel"
    assert "approved attempt 1 of run-001 as matmul-best" in out and "2x the baseline" in out


def test_a_replay_recorded_in_the_run_is_used_where_this_machine_has_no_gpu(fresh_run, tmp_path):
    assert replay(fresh_run, io.StringIO(), repeats=1, make_executor=fake) == 0
    code, store, _, _ = approved(tmp_path, fresh_run, make_executor=None, gpu_absent=no_gpu, from_run=True)
    assert code == 0
    approval = load_store(store)[0].approval
    replay_record = approval.provenance.replay
    assert (replay_record.decision, replay_record.document) == ("GO", "replay.json")
    assert replay_record.document_sha256 == hashlib.sha256((fresh_run / "replay.json").read_bytes()).hexdigest()
    # --from-run: no GPU needed, the accepted ratio is the run's, and the approval says so
    assert approval.ratio_measurement.source == "run" and "--from-run" in approval.ratio_measurement.why
    assert all(case.ratio is None for case in approval.cases) and not approval.provenance.forced


def test_without_a_replay_nor_a_gpu_approve_exits_3_unless_forced_and_force_is_recorded(run_dir, tmp_path, capsys):
    code, store, key, _ = approved(tmp_path / "a", run_dir, make_executor=None, gpu_absent=no_gpu)
    assert code == 3 and not approval_dir(store, NAME).exists()
    assert "kernel-referee replay" in capsys.readouterr().err
    code, store, _, out = approved(tmp_path / "b", run_dir, make_executor=None, gpu_absent=no_gpu, force=True)
    assert code == 0, out
    provenance = load_store(store)[0].approval.provenance
    assert provenance.forced and provenance.replay.decision == "none"
    assert provenance.forced_over[0] == (f"no replay of attempt 1 is recorded for this state of the run, and none "
                                         f"can be made here ({no_gpu()})")
    # nor can the accepted ratio be measured here: the run's is taken, as an override
    assert provenance.forced_over[1].startswith("the accepted ratio was not measured in rounds (the accepted ratio "
                                                "is measured on a GPU (32 interleaved rounds)")
    assert len(provenance.forced_over) == 2
    assert load_store(store)[0].approval.ratio_measurement.source == "run"


def test_a_replay_that_says_no_go_refuses_the_approval_unless_forced(run_dir, tmp_path, capsys):
    run = shutil.copytree(run_dir, tmp_path / "run-001")
    holdout_fails = lambda task, timing: HoldoutFailsHere(task)  # noqa: E731
    code, store, _, _ = approved(tmp_path / "a", run, make_executor=holdout_fails)
    assert code == 1 and not approval_dir(store, NAME).exists()
    assert f"says NO-GO: holdout {HOLDOUT} failed" in capsys.readouterr().err
    code, store, _, _ = approved(tmp_path / "b", run, make_executor=None, gpu_absent=no_gpu, force=True)
    assert code == 0  # the NO-GO replay is recorded in the run now: approve reads it
    provenance = load_store(store)[0].approval.provenance
    assert provenance.replay.decision == "NO-GO" and provenance.forced
    assert provenance.forced_over[0].startswith(f"its replay (replay.json) says NO-GO: holdout {HOLDOUT} failed")


def test_a_run_that_does_not_verify_is_refused_naming_the_problem(run_dir, tmp_path, capsys):
    run = shutil.copytree(run_dir, tmp_path / "run-001")
    history = read_json(run / "history.json")
    history["attempts"][1]["rationale"] = "rewritten"
    (run / "history.json").write_text(json.dumps(history))
    code, store, _, _ = approved(tmp_path, run)
    assert code == 1 and not (store / "approvals").exists()
    assert "does not verify (history.json: sha256 differs from the last recorded write" in capsys.readouterr().err


def test_an_attempt_is_approved_by_its_number(tmp_path):
    run = make_run(tmp_path, kernel("latency_us=70"), kernel("latency_us=50"))
    code, store, _, _ = approved(tmp_path, run, attempt=1)
    assert code == 0
    approval = load_store(store)[0].approval
    assert approval.kernel.attempt == 1 and approval.provenance.replay.document == "replay-attempt-001.json"
    assert approval.cases[0].speedup.ratio == pytest.approx(100 / 70, rel=0.02)


def test_keygen_and_approve_through_the_command_line(run_dir, tmp_path, capsys, monkeypatch):
    assert main(["keygen", str(tmp_path / "keys"), "--name", "ci"]) == 0
    private, public = tmp_path / "keys/ci.key", tmp_path / "keys/ci.pub"
    assert os.stat(private).st_mode & 0o777 == 0o600 and "key id:" in capsys.readouterr().out
    assert main(["keygen", str(tmp_path / "keys"), "--name", "ci"]) == 2  # never over another key
    store = tmp_path / "store"
    args = ["approve", str(run_dir), "--store", str(store), "--name", NAME, "--key", str(private), "--force"]
    monkeypatch.setattr("guard.approve.gpu_absent_reason", no_gpu)
    assert main(args) == 2  # the key is not trusted by the store yet
    assert "is not trusted by the store" in capsys.readouterr().err
    (store / "keys").mkdir(parents=True)
    shutil.copy(public, store / "keys")
    assert main(args + ["--note", "taken on knowingly"]) == 0, capsys.readouterr().err
    approval = load_store(store)[0].approval
    assert approval.provenance.forced and approval.provenance.note == "taken on knowingly"
    assert main(args) == 2 and "exists" in capsys.readouterr().err  # an approval is never replaced silently
    assert (approval_dir(store, NAME) / ENVELOPE).is_file()


def test_a_key_the_store_does_not_trust_signs_nothing(run_dir, tmp_path):
    store, _ = new_store(tmp_path / "a")
    _, other_key = new_store(tmp_path / "b")
    with pytest.raises(Exception, match="is not trusted by the store"):
        approve(ApproveOptions(run=run_dir, store=store, name=NAME, key=other_key, make_executor=fake), io.StringIO())
    assert not (store / "approvals").exists()


def test_the_scripts_door_hands_the_guards_commands_to_guard_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["kernel-referee", "keygen", str(tmp_path / "keys")])
    assert entry.main() == 0 and (tmp_path / "keys/approver.pub").is_file()
    monkeypatch.setattr("sys.argv", ["kernel-referee", "verify", str(tmp_path / "nothing")])
    assert entry.main() == 2 and "no such run folder" in capsys.readouterr().err  # the referee's own commands


def test_a_run_still_going_is_refused_unless_forced(tmp_path, capsys):
    run = new_run(tmp_path)
    try:
        record_attempt(run, run.candidate(None, kernel("latency_us=50")), "try 1", None, None)
    finally:
        run.close()
    code, _, _, _ = approved(tmp_path / "a", run.dir)
    assert code == 1 and "the run is not finished (status running)" in capsys.readouterr().err
    code, store, _, _ = approved(tmp_path / "b", run.dir, force=True)
    assert code == 0
    assert load_store(store)[0].approval.provenance.forced_over == [
        "the run is not finished (status running): its best may change"]
