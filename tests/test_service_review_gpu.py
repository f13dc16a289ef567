"""A review action's GPU: the service's replay and approval take a free GPU's serving claim as a queued run does,
their executor placed on it and the claim let go after them (also when they fail); with every GPU serving a run they
are refused at once (503, the reason on the page) with nothing spent. And an approval whose executor fails is a
refusal logged in the run's log, as every review action is."""

from __future__ import annotations

import shutil
import time

import pytest
from starlette.testclient import TestClient

from harness.gpu_lease import ServingClaim
from server.executor import ExecutorError
from server.folder_lock import FolderLock
from server.record_files import iter_events
from server.verify import verify_run
from service.app import build_app
from service.auth import ADMIN_TOKEN_ENV
from service.review import approve_run, replay_for_review, reviews, service_approver
from service.settings import ServiceSettings
from service.web import web_routes
from tests.approval_support import fake, good_run
from tests.fake_executor import FakeExecutor, fake_gpus
from tests.service_support import ADMIN, MATMUL
from tests.test_service_routes import BASE, _ask, _finish

pytestmark = pytest.mark.usefixtures("own_gpu_claims")


class Placements:
    """The service's executors, each recording the GPU it was placed on; `fail`: the next ones cannot start."""

    def __init__(self):
        self.gpus: list = []
        self.fail = False

    def __call__(self, task, timing, gpu):
        self.gpus.append(gpu)
        if self.fail:
            return StartFails(task, placed=gpu)
        return FakeExecutor(task, placed=gpu)


class StartFails(FakeExecutor):
    def start(self) -> dict:
        raise ExecutorError("the GPU worker could not start: CUDA_ERROR_NO_DEVICE")


@pytest.fixture
def one_gpu(tmp_path):
    """The app on one fake GPU; run `red` finished, run `blue` serving on the GPU; (client, placements, red, blue)."""
    placements = Placements()
    app = build_app(ServiceSettings(root=tmp_path / "service", scheduler_period_s=0.05), placements, fake_gpus(1),
                    routes=web_routes(), env={ADMIN_TOKEN_ENV: ADMIN})
    with TestClient(app, base_url=BASE) as client:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        runs = [client.post("/api/runs", json={"task_dir": str(MATMUL), "max_attempts": 1}, headers=admin).json()
                ["run"]["id"] for _ in range(2)]
        _finish(client, runs[0])  # its GPU goes to the second run
        service = client.app.state.service
        _until(lambda: runs[1] in service.live and service.live[runs[1]].admitted)
        yield client, placements, runs[0], runs[1]


def _until(done, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _claim_free(service) -> bool:
    gpu = next(iter(service.slots))
    return not any(key.startswith("review ") for key in service.claims) and not ServingClaim(gpu, "test").is_taken()


@pytest.mark.parametrize("path, form", [("replay", {}), ("review", {"action": "approve", "note": "n"})])
def test_with_every_gpu_serving_a_run_a_replay_or_approval_is_refused_at_once_and_spends_nothing(one_gpu, path,
                                                                                                  form):
    client, placements, red, _ = one_gpu
    service = client.app.state.service
    run_dir = service.registry.run_dir(red)
    logged, made = len(list(iter_events(run_dir))), len(placements.gpus)
    answer = _ask(client, "POST", f"/ui/runs/{red}/{path}", "page", {"form": form}, ADMIN)
    assert answer.status_code == 503
    assert "every GPU of the service is serving a run or another review action (1 in all)" in answer.text
    assert "nothing was spent" in answer.text
    assert len(list(iter_events(run_dir))) == logged and len(placements.gpus) == made  # no record, no executor
    assert not (run_dir / "replay.json").exists()


def test_on_a_free_gpu_the_review_runs_there_and_lets_it_go_after_also_when_it_fails(one_gpu):
    client, placements, red, blue = one_gpu
    service = client.app.state.service
    _finish(client, blue)
    _until(lambda: not service.claims)  # blue lets its GPU go
    gpu = service.slots[next(iter(service.slots))]
    made = len(placements.gpus)
    answer = _ask(client, "POST", f"/ui/runs/{red}/replay", "page", {"form": {}}, ADMIN)
    assert answer.status_code == 303, answer.text[:500]
    assert placements.gpus[made:] and all(g == gpu for g in placements.gpus[made:])  # the claimed GPU, not None
    assert _claim_free(service)
    # a review action that fails (its folder held by another writer) lets the GPU go too
    run_dir = service.registry.run_dir(red)
    with FolderLock.take(run_dir, "another writer"):
        answer = _ask(client, "POST", f"/ui/runs/{red}/replay", "page", {"form": {}}, ADMIN)
    assert answer.status_code == 409 and "the replay was not made" in answer.text
    assert _claim_free(service)
    # an approval whose executor cannot start: refused, logged, and the GPU let go
    placements.fail = True
    made = len(placements.gpus)
    answer = _ask(client, "POST", f"/ui/runs/{red}/review", "page", {"form": {"action": "approve", "note": "n"}},
                  ADMIN)
    assert answer.status_code == 303, answer.text[:500]
    assert placements.gpus[made:] and all(g == gpu for g in placements.gpus[made:])
    assert _claim_free(service)
    refused = reviews(run_dir)[-1]
    assert (refused.action.value, refused.outcome) == ("approve", "refused")
    assert "ExecutorError: the GPU worker could not start" in refused.detail


def test_an_approval_whose_executor_fails_is_a_refusal_logged_in_the_runs_log(tmp_path):
    run_dir = good_run(tmp_path / "run")
    approver = service_approver(tmp_path / "service")
    assert replay_for_review(run_dir, "rita", fake, repeats=1).outcome == "GO"
    failing = lambda task, timing: StartFails(task, gpu="Fake GPU")  # noqa: E731
    refused = approve_run(run_dir, approver, "matmul_f32-r0001", "rita", "", failing)
    assert refused.outcome == "refused"
    assert refused.detail.startswith("refused: the accepted ratio could not be measured, its executor failed: "
                                     "ExecutorError: the GPU worker could not start")
    assert [(e.action.value, e.outcome) for e in reviews(run_dir)] == [("replay", "requested"), ("approve", "refused")]
    assert verify_run(run_dir).ok


def test_an_approval_that_crashes_is_still_logged_as_refused(tmp_path, monkeypatch):
    run_dir = shutil.copytree(good_run(tmp_path / "run"), tmp_path / "run-001")

    def crashes(options, out):
        raise RuntimeError("a bug in the guard")

    monkeypatch.setattr("service.review.approve", crashes)
    refused = approve_run(run_dir, service_approver(tmp_path / "service"), "matmul_f32-r0001", "rita", "", fake)
    assert refused.outcome == "refused" and refused.detail == "the approval failed: RuntimeError: a bug in the guard"
    assert [e.outcome for e in reviews(run_dir)] == ["refused"] and verify_run(run_dir).ok
