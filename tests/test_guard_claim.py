"""The guard's executors hold their GPU's serving claim while they live: taken as each step's executor is made, let
go when it closes, so a guard of several approvals on a one-GPU host places each step on the GPU with its claim
(not shared with itself), and a server starting on the host meanwhile finds the GPU free again between steps."""

from __future__ import annotations

import pytest

from guard import measure
from harness.gpu_lease import LEASE_DIR_ENV, ServingClaim
from harness.placement import GpuInfo
from harness.settings import TimingSettings
from harness.task import load_task
from tests.server_support import REPO

GPUS = [GpuInfo(0, "GPU-c1a10000-0000-4000-8000-000000000001", 80 << 30),
        GpuInfo(1, "GPU-c1a10000-0000-4000-8000-000000000002", 80 << 30)]


@pytest.fixture
def host(tmp_path, monkeypatch):
    monkeypatch.setenv(LEASE_DIR_ENV, str(tmp_path / "leases"))
    monkeypatch.setattr(measure, "list_gpus", lambda: GPUS[:1])
    return load_task(REPO / "cases" / "matmul_f32")


def _taken(gpu: GpuInfo) -> bool:
    return ServingClaim(gpu.uuid, "a server starting beside the guard").is_taken()


def test_a_step_s_executor_holds_the_claim_until_it_closes(host):
    make = measure.local_executor("approved")
    assert not _taken(GPUS[0])  # making the factory claims nothing
    executor = make(host, TimingSettings())
    assert executor.gpu == GPUS[0] and not executor.placement.shared and _taken(GPUS[0])
    executor.close()
    assert not _taken(GPUS[0])


def test_steps_one_after_another_each_get_the_gpu_with_its_claim(host):
    for name in ("first", "second", "third"):
        executor = measure.local_executor(name)(host, TimingSettings())
        try:
            assert executor.gpu == GPUS[0] and executor.placement.claim is not None, name
        finally:
            executor.close()
    assert not _taken(GPUS[0])


def test_an_executor_that_cannot_be_made_lets_its_claim_go(host, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the compile worker could not be made")

    monkeypatch.setattr(measure.GpuExecutor, "__init__", broken)
    with pytest.raises(RuntimeError, match="could not be made"):
        measure.local_executor("approved")(host, TimingSettings())
    assert not _taken(GPUS[0])
