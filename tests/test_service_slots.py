"""A cluster's GPUs counted again while the service serves (service/core.py `_refresh_slots`, `--ray`): a GPU that
joins is a slot a queued run is admitted on; where the cluster offers fewer, free slots go first and a slot a run
holds stays until it is let go; a cluster that cannot be counted offers none meanwhile. In process, with the fake
executor standing in for the cluster's."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
from starlette.testclient import TestClient

from harness.placement import GpuInfo
from service.app import build_app
from service.auth import ADMIN_TOKEN_ENV
from service.core import Service
from service.settings import ServiceSettings
from tests.fake_executor import FakeExecutor
from tests.service_support import ADMIN, MATMUL
from tests.test_service_api import BASE, _auth, _run, _wait_state

pytestmark = pytest.mark.usefixtures("own_gpu_claims")


def _ray(count: int) -> list[GpuInfo]:
    return [GpuInfo(i, f"ray-GPU-{i + 1}") for i in range(count)]


def _make(task, timing, gpu):
    return FakeExecutor(task, placed=gpu)


def test_a_gpu_that_joins_the_cluster_takes_the_next_queued_run(tmp_path):
    offered = _ray(1)
    settings = ServiceSettings(root=tmp_path / "service", scheduler_period_s=0.05, slots_refresh_s=0.1)
    app = build_app(settings, _make, offered, env={ADMIN_TOKEN_ENV: ADMIN}, slots_now=lambda: list(offered))
    with TestClient(app, base_url=BASE) as client:
        first, second = _run(client, ADMIN)["run"]["id"], _run(client, ADMIN)["run"]["id"]
        _wait_state(client, first, "running")
        time.sleep(0.5)
        assert client.get(f"/api/runs/{second}", headers=_auth(ADMIN)).json()["run"]["state"] == "queued"
        offered.append(_ray(2)[1])  # a node with one more GPU joins
        view = _wait_state(client, second, "running")
        assert view["run"]["gpu_uuid"] == "ray-GPU-2"


@dataclass
class _Claim:
    gpu: str


def test_fewer_gpus_drop_free_slots_first_and_held_ones_once_let_go(tmp_path):
    offered = _ray(4)

    def count() -> list[GpuInfo]:
        if not offered:
            raise RuntimeError("the Ray cluster has no GPU: no run could be placed there")
        return list(offered)

    service = Service(ServiceSettings(root=tmp_path / "service", slots_refresh_s=0.0), _make, _ray(4), {}, count)
    service.claims = {"r1": _Claim("ray-GPU-3"), "r2": _Claim("ray-GPU-4")}
    offered[:] = _ray(2)
    service._refresh_slots()
    assert sorted(service.slots) == ["ray-GPU-3", "ray-GPU-4"]  # the two runs keep theirs; the free two go
    offered[:] = _ray(4)
    service._refresh_slots()
    assert sorted(service.slots) == ["ray-GPU-1", "ray-GPU-2", "ray-GPU-3", "ray-GPU-4"]
    service.claims = {}
    offered[:] = _ray(1)
    service._refresh_slots()
    assert list(service.slots) == ["ray-GPU-1"]  # the one the cluster still names is the one kept
    offered.clear()
    service._refresh_slots()
    assert service.slots == {} and service._free_slot("r3") is None  # nothing is admitted meanwhile
    waiting = service.registry.enqueue(service.registry.create(MATMUL, "red", "matmul_f32", 3).id)
    place = service.place(waiting.id)  # its place and expected wait are still told
    assert (place.position, place.length) == (1, 1) and place.expected_wait_s > 0
