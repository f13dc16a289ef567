"""What a kill -9 leaves between a submission's steps, settled when the service starts again (service/core.py
`_settle_interrupted`): the state such a kill leaves is written by hand (the kill need not land at that exact point),
then the service is started on it."""

from __future__ import annotations

import time

import pytest
from starlette.testclient import TestClient

from service.app import build_app
from service.auth import ADMIN_TOKEN_ENV, TokenStore
from service.records import Role, RunState
from service.registry import Registry
from service.settings import ServiceSettings, TeamLimits
from tests.fake_executor import FakeExecutor, fake_gpus
from tests.service_support import ADMIN, MATMUL

pytestmark = pytest.mark.usefixtures("own_gpu_claims")
BASE = "http://127.0.0.1:8000"


def test_a_run_registered_but_never_queued_is_failed_with_its_cause_and_leftovers_are_swept(tmp_path):
    root = tmp_path / "service"
    registry = Registry(root)
    cut = registry.create(MATMUL, "red", "matmul_f32", 3)              # killed before `enqueue`
    TokenStore(root, {}).issue(Role.AGENT, "red", cut.id)             # its token issued, its answer never sent
    (root / "intake" / "0123456789abcdef" / "unpacked").mkdir(parents=True)   # a submission being linted
    half = registry.folder("r0123456789ab")                           # a `create` killed while it copied the task
    (half / "task").mkdir(parents=True)
    (half / "task" / "task.toml").write_text("")

    limits = TeamLimits(max_queued_runs=1, max_attempts_per_day=70)
    settings = ServiceSettings(root=root, limits=limits, scheduler_period_s=0.05)
    app = build_app(settings, lambda task, timing, gpu: FakeExecutor(task, placed=gpu), fake_gpus(1),
                    env={ADMIN_TOKEN_ENV: ADMIN})
    with TestClient(app, base_url=BASE) as client:
        time.sleep(0.3)  # a few scheduler steps: a run left created must not reach the queue or the GPU
        view = client.get(f"/api/runs/{cut.id}", headers={"Authorization": f"Bearer {ADMIN}"}).json()
        assert view["run"]["state"] == "failed" and view["queue_position"] == 0
        assert "before its agent token was shown" in view["run"]["error"]
        assert not list(root.glob("intake/*")) and not half.exists()
        listed = client.get("/api/runs", headers={"Authorization": f"Bearer {ADMIN}"}).json()["runs"]
        assert [v["run"]["id"] for v in listed] == [cut.id]
        # It counts against no limit of its team: neither as a run waiting nor as attempts of the day.
        client.app.state.service.check_limits("red", 70)
        assert client.app.state.service.registry.run_dir(cut.id) is None  # it never had a GPU
    assert Registry(root).get(cut.id).state is RunState.FAILED  # what the next start reads
