"""Review on a real finished CPU run (the fake executor): replay, approve with the service's key, reject; every
action a signed record of the run's log, and the folder still verifies."""

from __future__ import annotations

from guard.signing import trusted_keys
from guard.store import approval_dir, keys_dir, load_approval
from server.verify import verify_run
from service.review import (ReviewAction, approval_name, approve_run, decision_of, reject_run, replay_for_review,
                            reviews, service_approver)
from tests.approval_support import fake, fresh_run, run_dir  # noqa: F401 - run_dir and fresh_run are fixtures


def test_the_service_key_is_made_once_and_trusted_by_its_store(tmp_path):
    first = service_approver(tmp_path)
    again = service_approver(tmp_path)
    assert first == again and first.key.read_bytes() == again.key.read_bytes()
    assert len(trusted_keys(keys_dir(first.store))) == 1
    assert (first.key.stat().st_mode & 0o777) == 0o600


def test_replay_then_approve_writes_a_signed_approval_and_logs_both(fresh_run, tmp_path):
    approver = service_approver(tmp_path / "service")
    replayed = replay_for_review(fresh_run, "rita", fake, repeats=1)
    assert replayed.outcome == "GO"
    made = approve_run(fresh_run, approver, approval_name("matmul_f32", "r0001"), "rita", "looks <b>right</b>", fake)
    assert made.outcome == "approved", made.detail
    loaded = load_approval(approver.store, "matmul_f32-r0001")
    # its accepted ratio measured in interleaved rounds through the service's executor, as the guard measures
    assert loaded.approval.ratio_measurement.source == "guard-rounds"
    assert loaded.approval.provenance.approver == "rita"
    assert loaded.approval.provenance.note == "looks <b>right</b>"
    assert loaded.approval.provenance.replay.decision == "GO"
    assert approval_dir(approver.store, "matmul_f32-r0001").is_dir()
    logged = reviews(fresh_run)
    assert [(e.action, e.outcome) for e in logged] == [(ReviewAction.REPLAY, "requested"),
                                                      (ReviewAction.APPROVE, "approved")]
    report = verify_run(fresh_run)
    assert report.ok and report.signed, report.problems


def test_approval_without_a_replay_is_refused_with_the_guards_reason_and_logged(fresh_run, tmp_path):
    approver = service_approver(tmp_path / "service")
    refused = approve_run(fresh_run, approver, "matmul_f32-r0002", "rita", "")
    assert refused.outcome == "refused" and "no replay" in refused.detail
    assert not approval_dir(approver.store, "matmul_f32-r0002").exists()
    assert [e.outcome for e in reviews(fresh_run)] == ["refused"]
    assert decision_of(reviews(fresh_run)) is None


def test_a_rejection_is_logged_signed_and_is_the_decision(fresh_run):
    reject_run(fresh_run, "rex", "speedup only on the tiny case")
    decided = decision_of(reviews(fresh_run))
    assert (decided.action, decided.reviewer, decided.note) == (ReviewAction.REJECT, "rex",
                                                                 "speedup only on the tiny case")
    assert verify_run(fresh_run).ok


def test_an_edited_review_breaks_the_runs_chain(fresh_run):
    reject_run(fresh_run, "rex", "no")
    log = fresh_run / "events.jsonl"
    log.write_text(log.read_text().replace('"rejected"', '"approved"'))
    assert not verify_run(fresh_run).ok


def test_an_approval_refused_by_the_store_names_why(fresh_run, tmp_path):
    approver = service_approver(tmp_path / "service")
    replay_for_review(fresh_run, "rita", fake, repeats=1)
    assert approve_run(fresh_run, approver, "dup", "rita", "", fake).outcome == "approved"
    again = approve_run(fresh_run, approver, "dup", "rita", "", fake)
    assert again.outcome == "refused" and "exists" in again.detail
    assert load_approval(approver.store, "dup").approval.name == "dup"  # the first is kept, and still opens
