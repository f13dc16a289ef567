"""A run whose report cannot be written at its end (a full disk, as a stand-in `write_report` fails): the service
lets its GPU go at once, keeps it running with the reason, tries the report again, and shows it finished once the
report stands whole; across a restart too, with no GPU claimed and no executor started (service/pending_reports.py)."""

from __future__ import annotations

import errno
import threading
import time
from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient

from server import report_files
from server.attempt import record_attempt
from server.report_files import report_whole
from server.signed_log import run_key
from server.verify import verify_run
from service import core, pending_reports
from service.app import build_app
from service.auth import ADMIN_TOKEN_ENV
from service import registry as registry_module
from service.records import RunState
from service.registry import Registry
from service.settings import ServiceSettings
from tests.fake_executor import FakeExecutor, fake_gpus
from tests.server_support import kernel
from tests.service_support import ADMIN, MATMUL
from service.web import web_routes
from tests.test_service_api import BASE, _admitted, _auth, _run, _wait_state

pytestmark = pytest.mark.usefixtures("own_gpu_claims")


class FullDisk:
    """report_files.write_report failing as on a full disk until `freed` is set."""

    def __init__(self, monkeypatch):
        self.freed, self.tries = threading.Event(), 0
        written = report_files.write_report

        def write_report(run_dir, *args):
            if not self.freed.is_set():
                self.tries += 1
                raise OSError(errno.ENOSPC, "No space left on device")
            return written(run_dir, *args)

        monkeypatch.setattr(report_files, "write_report", write_report)
        monkeypatch.setattr(pending_reports, "RETRY_S", 0.1)
        monkeypatch.setattr(pending_reports, "RETRY_MAX_S", 0.2)


def _client(tmp_path, make_executor=lambda task, timing, gpu: FakeExecutor(task, placed=gpu)) -> TestClient:
    """The service with its pages, on one fake GPU."""
    settings = ServiceSettings(root=tmp_path / "service", scheduler_period_s=0.05)
    return TestClient(build_app(settings, make_executor, fake_gpus(1), routes=web_routes(),
                                env={ADMIN_TOKEN_ENV: ADMIN}), base_url=BASE)


def _pending(client: TestClient, run_id: str) -> dict:
    deadline = time.monotonic() + 60
    while not (view := client.get(f"/api/runs/{run_id}", headers=_auth(ADMIN)).json()["run"])["report_pending_since"]:
        assert time.monotonic() < deadline and view["state"] == "running", view
        time.sleep(0.02)
    return view


def _finish(client: TestClient, run_id: str):
    """The run's one attempt recorded: its budget spent, so it is over."""
    run = _admitted(client, run_id)
    record_attempt(run, run.candidate(None, kernel("latency_us=50")), "the one attempt", None, None)
    return run


def test_a_run_whose_report_fails_lets_its_gpu_go_stays_running_with_the_reason_and_finishes_once_written(
        tmp_path, monkeypatch):
    disk = FullDisk(monkeypatch)
    with _client(tmp_path) as client:
        first, second = (_run(client, ADMIN, max_attempts=1)["run"]["id"] for _ in range(2))
        run = _finish(client, first)
        view = _pending(client, first)
        released = view["report_pending_since"]
        assert "its report could not be written" in view["waiting"] and not view["finished_at"], view
        page = client.get(f"/ui/runs/{first}", headers=_auth(ADMIN)).text
        assert '<td id="waiting">its attempts are over, but its report could not be written' in page
        started = _wait_state(client, second, "running")["run"]["started_at"]  # the one GPU, let go
        assert client.app.state.service.registry.get(first).state.value == "running"
        deadline = time.monotonic() + 60
        while disk.tries < 2:  # tried again, and failed again
            assert time.monotonic() < deadline, disk.tries
            time.sleep(0.02)
        assert not (run.dir / "report.html").exists()
        disk.freed.set()
        view = _wait_state(client, first, "finished")["run"]
        assert view["waiting"] is None and view["report_pending_since"] is None
        assert view["finished_at"] == released <= started  # when its GPU was let go, not when its report was written
        assert report_whole(run.dir, run.key) and verify_run(run.dir).ok
        assert 'id="waiting"' not in client.get(f"/ui/runs/{first}", headers=_auth(ADMIN)).text


def test_a_run_left_with_its_report_pending_by_a_stop_is_finished_after_the_restart_without_a_gpu(
        tmp_path, monkeypatch):
    disk = FullDisk(monkeypatch)
    with _client(tmp_path) as client:
        first = _run(client, ADMIN, max_attempts=1)["run"]["id"]
        run_dir = _finish(client, first).dir
        _pending(client, first)
    left = Registry(tmp_path / "service").get(first)
    assert left.state.value == "running" and left.report_pending_since and not (run_dir / "report.html").exists()

    disk.freed.set()
    made = []

    def make_executor(task, timing, gpu):
        made.append(task.name)
        return FakeExecutor(task, placed=gpu)

    with _client(tmp_path, make_executor) as client:
        view = _wait_state(client, first, "finished")["run"]
        assert client.app.state.service.claims == {}  # no GPU claimed for it
    assert made == []  # nor any executor started
    assert view["waiting"] is None and view["report_pending_since"] is None
    assert view["finished_at"] == left.report_pending_since  # the release before the stop, kept across it
    assert report_whole(run_dir, run_key(run_dir)) and verify_run(run_dir).ok


def test_a_reason_the_disk_refuses_is_kept_in_memory_and_a_change_of_state_is_not(tmp_path, monkeypatch):
    registry = Registry(tmp_path / "service")
    record = registry.create(MATMUL, "red", "matmul_f32", 1)

    def full(path, model):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(registry_module, "write_atomic", full)
    assert registry.note(record.id, waiting="why").waiting == "why"  # the API still says it
    assert registry.get(record.id).waiting == "why"
    with pytest.raises(OSError):
        registry.update(record.id, state=RunState.QUEUED)
    assert registry.get(record.id).state is RunState.CREATED
    assert Registry(tmp_path / "service").get(record.id).waiting is None  # what a restart reads: nothing written


def test_a_report_that_keeps_failing_is_tried_less_often_up_to_the_most_apart(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(pending_reports, "time", SimpleNamespace(monotonic=lambda: now[0]))  # this module's clock
    reports = pending_reports.PendingReports()
    waits = []
    for _ in range(7):
        reason = reports.failed("r0123456789ab")
        assert not reports.due("r0123456789ab")
        low = now[0]
        while not reports.due("r0123456789ab"):
            now[0] += 1.0
        waits.append(now[0] - low)
    assert waits == [10, 20, 40, 80, 160, 300, 300]
    assert "after 10 s" in reason and "at most 300 s apart" in reason
    reports.done("r0123456789ab")
    assert reports.due("r0123456789ab")  # forgotten: a later run of that id starts afresh


def test_a_try_that_raises_backs_off_as_one_that_fails(tmp_path, monkeypatch):
    calls = []

    def raising(run):
        calls.append(time.monotonic())
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(core, "end_report_whole", lambda run: False)  # the report fails at the run's end
    monkeypatch.setattr(pending_reports, "end_report_whole", raising)  # and every try after it raises
    monkeypatch.setattr(pending_reports, "RETRY_S", 0.2)
    with _client(tmp_path) as client:
        first = _run(client, ADMIN, max_attempts=1)["run"]["id"]
        _finish(client, first)
        _pending(client, first)
        time.sleep(1.5)  # 30 scheduler steps: tries at about 0.2, 0.6 and 1.4 s
        assert 1 <= len(calls) <= 4, len(calls)
        assert client.app.state.service.registry.get(first).state.value == "running"
