"""A run that ends in this process has its report due until it is written, once (server/report_files.py
`write_end_report`), and the audit service shows a run finished only once its report is written and signed: a
reviewer who reads or verifies the run folder as soon as the API says finished finds it whole."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest
from starlette.testclient import TestClient

from server import report_files
from server.attempt import record_attempt
from server.lifecycle import resume_run
from server.report_files import REPORT_NAME, write_end_report
from server.verify import verify_run
from service.app import build_app
from service.auth import ADMIN_TOKEN_ENV
from service.core import _close_run
from service.settings import ServiceSettings
from tests.fake_executor import FakeExecutor, fake_gpus
from tests.server_support import client, executor, kernel, new_run, ok, prepared
from tests.service_support import ADMIN, MATMUL

BASE = "http://127.0.0.1:8000"


AUTH = {"Authorization": f"Bearer {ADMIN}"}


def _service(tmp_path, gpus: int) -> TestClient:
    settings = ServiceSettings(root=tmp_path / "service", scheduler_period_s=0.05)
    app = build_app(settings, lambda task, timing, gpu: FakeExecutor(task, placed=gpu), fake_gpus(gpus),
                    env={ADMIN_TOKEN_ENV: ADMIN})
    return TestClient(app, base_url=BASE)


def _made(http: TestClient) -> str:
    """A run of one attempt, queued by the admin."""
    answer = http.post("/api/runs", json={"task_dir": str(MATMUL), "max_attempts": 1}, headers=AUTH)
    assert answer.status_code == 201, answer.text
    return answer.json()["run"]["id"]


def _state(http: TestClient, run_id: str) -> str:
    return http.get(f"/api/runs/{run_id}", headers=AUTH).json()["run"]["state"]


def _prepared(http: TestClient, run_id: str):
    """The run, once the service admitted it and its preparation ended."""
    service, deadline = http.app.state.service, time.monotonic() + 60
    while not (run_id in service.live and service.live[run_id].admitted):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    run = service.live[run_id].run
    assert run.preparation.wait(60) and run.preparation.ready
    return run


def _counted_writes(monkeypatch, pause_s: float = 0.0) -> list:
    """Every report write, slowed by `pause_s` (the window in which the run is finished and its report not yet
    written), counted."""
    real, writes = report_files.write_report, []

    def counted(run_dir, cost_inputs=None):
        writes.append(run_dir)
        time.sleep(pause_s)
        return real(run_dir, cost_inputs)

    monkeypatch.setattr(report_files, "write_report", counted)
    return writes


def test_a_run_ended_here_has_its_report_due_until_it_is_written_once(tmp_path, monkeypatch):
    writes = _counted_writes(monkeypatch)
    run = new_run(tmp_path, max_attempts=1)
    try:
        assert not run.report_due
        record_attempt(run, run.candidate(None, kernel("latency_us=50")), "the one attempt", None, None)
        assert run.finished and run.report_due and not (run.dir / REPORT_NAME).exists()
        write_end_report(run)
        write_end_report(run)  # a second writer (the service after the server) finds it written
        assert not run.report_due and len(writes) == 1
        assert (run.dir / REPORT_NAME).is_file()
    finally:
        run.close()
    verified = verify_run(run.dir)
    assert verified.ok, verified.problems


@pytest.mark.anyio
async def test_the_server_writes_the_report_after_the_finishing_call_and_it_is_no_longer_due(tmp_path):
    run = new_run(tmp_path, max_attempts=1)
    try:
        async with client(run) as c:
            await prepared(c)
            await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="the one attempt")
            deadline = time.monotonic() + 30
            while run.report_due:  # written in the background of the server's lifespan
                assert time.monotonic() < deadline
                await anyio.sleep(0.05)
        assert run.finished and (run.dir / REPORT_NAME).is_file()
    finally:
        run.close()


@pytest.mark.usefixtures("own_gpu_claims")
def test_the_service_shows_a_run_finished_only_once_its_report_is_written_and_signed(tmp_path, monkeypatch):
    writes = _counted_writes(monkeypatch, pause_s=0.5)
    with _service(tmp_path, gpus=1) as http:
        run_id = _made(http)
        run = _prepared(http, run_id)
        # Ended by a call that writes no report itself: the service writes it before it shows the run finished.
        record_attempt(run, run.candidate(None, kernel("latency_us=50")), "the one attempt", None, None)
        deadline = time.monotonic() + 60
        while (state := _state(http, run_id)) != "finished":
            assert state == "running" and time.monotonic() < deadline, state
            time.sleep(0.02)
        assert (run.dir / REPORT_NAME).is_file() and len(writes) == 1
        verified = verify_run(run.dir)
        assert verified.ok, verified.problems


def _ended_without_its_report(tmp_path) -> Path:
    """A run whose budget is spent and whose process stopped before its report was written (closed, as a kill
    leaves it: the folder let go)."""
    run = new_run(tmp_path, max_attempts=1)
    try:
        record_attempt(run, run.candidate(None, kernel("latency_us=50")), "the one attempt", None, None)
        assert run.finished and run.report_due
    finally:
        run.close()
    return run.dir


def test_a_resumed_run_whose_report_a_stop_cut_short_has_it_written_and_verifies(tmp_path, monkeypatch):
    run_dir = _ended_without_its_report(tmp_path)
    (run_dir / "heatmap.svg").write_text("<svg/>")  # the stop came after the first file, before the signature
    assert not verify_run(run_dir).ok
    writes = _counted_writes(monkeypatch)
    run = resume_run(run_dir, executor())
    run.close()
    assert len(writes) == 1 and not run.report_due and (run_dir / REPORT_NAME).is_file()
    verified = verify_run(run_dir)
    assert verified.ok, verified.problems
    again = resume_run(run_dir, executor())  # whole now: not written again
    again.close()
    assert len(writes) == 1


def test_a_replay_file_that_disagrees_is_not_signed_over_by_a_resume(tmp_path, monkeypatch):
    run_dir = _ended_without_its_report(tmp_path)
    resume_run(run_dir, executor()).close()  # the report written and signed
    assert verify_run(run_dir).ok
    (run_dir / "replay.json").write_text('{"decision": "GO"}')  # a replay no derived.json lists
    (run_dir / REPORT_NAME).unlink()
    writes = _counted_writes(monkeypatch)
    resume_run(run_dir, executor()).close()
    assert writes == []  # left as it is: verify names it
    assert any("replay.json" in problem for problem in verify_run(run_dir).problems)


def test_the_service_stopping_writes_a_report_still_due_and_lets_the_folder_go_whole(tmp_path):
    run = new_run(tmp_path, max_attempts=1)
    record_attempt(run, run.candidate(None, kernel("latency_us=50")), "the one attempt", None, None)
    assert run.report_due
    _close_run(SimpleNamespace(run=run))
    assert not run.report_due and run.executor.closed.is_set()
    verified = verify_run(run.dir)
    assert verified.ok, verified.problems
    resume_run(run.dir, executor()).close()  # the folder was let go


@pytest.mark.usefixtures("own_gpu_claims")
def test_a_report_being_written_holds_up_no_other_runs_admission(tmp_path, monkeypatch):
    release = threading.Event()
    real = report_files.write_report

    def held(run_dir, cost_inputs=None):
        assert release.wait(60)
        return real(run_dir, cost_inputs)

    monkeypatch.setattr(report_files, "write_report", held)
    with _service(tmp_path, gpus=2) as http:
        first = _made(http)
        run = _prepared(http, first)
        record_attempt(run, run.candidate(None, kernel("latency_us=50")), "the one attempt", None, None)
        time.sleep(0.3)  # the scheduler's steps meet the finished run: its report is being written, held
        second = _made(http)
        deadline = time.monotonic() + 60
        try:
            while _state(http, second) != "running":  # admitted on the other GPU while the first's report is held
                assert time.monotonic() < deadline, _state(http, second)
                time.sleep(0.05)
            assert _state(http, first) == "running"  # not shown finished before its report is written
        finally:
            release.set()
        while _state(http, first) != "finished":
            assert time.monotonic() < deadline
            time.sleep(0.05)
