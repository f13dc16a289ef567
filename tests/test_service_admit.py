"""A run's admission goes on beside the scheduler (service/core.py `_admit_behind`): a run resumed after a restart
whose executor takes long to start (its workers starting, on a cluster its actor waiting for a placement) holds up
no other run; a run queued meanwhile is admitted on the other GPU at once. An admission that fails half-way
(service/live.py `admit`) leaves the run queued with its own executor. In process, with the fake executor."""

from __future__ import annotations

import threading
import time

import pytest
from starlette.testclient import TestClient

from server.run import RunSettings
from service import live
from service.app import build_app
from service.auth import ADMIN_TOKEN_ENV
from service.settings import ServiceSettings
from tests.fake_executor import FakeExecutor, fake_gpus
from tests.service_support import ADMIN, MATMUL
from tests.test_service_api import BASE, _auth, _run, _wait_state

pytestmark = pytest.mark.usefixtures("own_gpu_claims")


def _service(tmp_path, make) -> TestClient:
    settings = ServiceSettings(root=tmp_path / "service", scheduler_period_s=0.05)
    return TestClient(build_app(settings, make, fake_gpus(2), env={ADMIN_TOKEN_ENV: ADMIN}), base_url=BASE)


def _until(check, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def test_a_slow_resumption_holds_up_no_other_run_s_admission(tmp_path):
    with _service(tmp_path, lambda task, timing, gpu: FakeExecutor(task, placed=gpu)) as client:
        first = _run(client, ADMIN)["run"]["id"]
        _wait_state(client, first, "running")
        service = client.app.state.service
        assert _until(lambda: service.registry.run_dir(first) is not None, 30)  # its run folder made: it resumes

    release, starting = threading.Event(), threading.Event()

    class SlowToStart(FakeExecutor):
        def start(self) -> dict:
            starting.set()
            assert release.wait(60)
            return super().start()

    made: list[FakeExecutor] = []

    def make(task, timing, gpu):  # the first executor made after the restart is the resumed run's
        made.append((SlowToStart if not made else FakeExecutor)(task, placed=gpu))
        return made[-1]

    with _service(tmp_path, make) as client:
        try:
            assert starting.wait(30)  # the first run's resumption is under way, and waits
            second = _run(client, ADMIN)["run"]["id"]
            view = lambda run_id: client.get(f"/api/runs/{run_id}", headers=_auth(ADMIN)).json()["run"]  # noqa: E731
            # admitted on the other GPU meanwhile, well before the resumption could end (it waits up to 60 s)
            assert _until(lambda: view(second)["state"] == "running", 10), view(second)
            assert view(second)["gpu_uuid"] != view(first)["gpu_uuid"] and not release.is_set()
        finally:
            release.set()
        service = client.app.state.service
        assert _until(lambda: first in service.live and service.live[first].admitted, 30)


def test_an_admission_that_fails_half_way_leaves_the_run_queued_with_its_executor(tmp_path, monkeypatch):
    made: list[FakeExecutor] = []

    def make(task, timing, gpu):
        made.append(FakeExecutor(task, placed=gpu))
        return made[-1]

    run = live.open_queued(MATMUL, tmp_path / "results", RunSettings(max_attempts=3), make, lambda: (1, 1, 0.0))
    queued = run.executor

    def broken(unplaced, placed):
        raise OSError("the compile cache could not be read")

    carry = live._carry_compiles
    monkeypatch.setattr(live, "_carry_compiles", broken)
    with pytest.raises(OSError, match="compile cache"):
        live.admit(run, tmp_path / "results", fake_gpus(1)[0], make)
    placed = made[-1]
    assert run.executor is queued and not queued.closed.is_set()  # still the queued run it was
    assert placed is not queued and placed.closed.is_set()  # the executor made for the GPU is closed
    monkeypatch.setattr(live, "_carry_compiles", carry)
    live.admit(run, tmp_path / "results", fake_gpus(1)[0], make)  # the next step's try admits it
    try:
        assert run.executor is made[-1] and queued.closed.is_set()
        assert run.preparation.wait(30) and run.preparation.ready
    finally:
        run.executor.close()
        run.close()
