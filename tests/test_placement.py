"""Which GPU a run goes on (harness/placement.py, harness/gpus.py): N fake GPUs, claims held by other processes."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from harness.gpus import place_run, visible
from harness.nvml import Nvml
from harness.placement import GpuInfo, PlacementError, choose_gpu, parse_choice
from harness.task import load_task
from sandbox.pool import Worker
from server.executor import ExecutorError, GpuExecutor
from tests.server_support import MATMUL
from tests.lease_holder import LeaseHolder

FAKE_WORKER = (sys.executable, str(Path(__file__).with_name("fake_worker.py")))

GPUS = [GpuInfo(i, f"GPU-fa4e000{i}-0000-4000-8000-00000000000{i}", 80 << 30) for i in range(4)]


def test_an_index_or_a_uuid_picks_that_gpu():
    assert choose_gpu(GPUS, 1, set()) == (GPUS[1], False)
    assert choose_gpu(GPUS, GPUS[2].uuid, set()) == (GPUS[2], False)
    assert choose_gpu(GPUS, GPUS[3].uuid.lower(), {GPUS[3].uuid}) == (GPUS[3], True)  # asked for: shared if held


def test_an_unknown_gpu_is_refused_in_one_line():
    for wanted in (4, "GPU-00000000-0000-0000-0000-000000000000"):
        with pytest.raises(PlacementError) as refused:
            choose_gpu(GPUS, wanted, set())
        assert "\n" not in str(refused.value) and f"no GPU {wanted}" in str(refused.value)
        assert GPUS[3].uuid in str(refused.value)  # says what is present
    with pytest.raises(PlacementError, match="neither a GPU index"):
        parse_choice("first")
    assert parse_choice("1") == 1 and parse_choice(GPUS[0].uuid) == GPUS[0].uuid


def test_without_a_choice_the_first_free_gpu_then_sharing():
    assert choose_gpu(GPUS, None, {GPUS[0].uuid, GPUS[1].uuid}) == (GPUS[2], False)
    assert choose_gpu(list(reversed(GPUS)), None, set()) == (GPUS[0], False)  # by index, not by listing order
    assert choose_gpu(GPUS, None, {g.uuid for g in GPUS}) == (GPUS[0], True)
    with pytest.raises(PlacementError):
        choose_gpu([], None, set())


def test_one_gpu_serves_several_runs_as_before():
    one = GPUS[:1]
    first = place_run(one, None, "serve run-001")
    try:
        second = place_run(one, None, "serve run-002")
        assert (second.gpu, second.shared, second.claim) == (one[0], True, None)
    finally:
        first.release()


def test_two_servers_on_two_gpus_get_different_ones():
    """Another process serving on GPU 0 (its claim held): a server started without --gpu goes on GPU 1."""
    two = GPUS[:2]
    other = LeaseHolder(two[0].uuid, "serve run-001", serving=True)
    try:
        placed = place_run(two, None, "serve run-002")
        assert (placed.gpu, placed.shared) == (two[1], False)
        third = place_run(two, None, "serve run-003")  # both taken: shares the first
        assert (third.gpu, third.shared) == (two[0], True)
        placed.release()
        assert place_run(two, None, "serve run-004").gpu == two[1]  # freed by the release
    finally:
        other.close()
    assert place_run(two, None, "serve run-005").gpu == two[0]  # freed with the process


def test_an_explicit_gpu_goes_there_even_when_another_is_free():
    placed = place_run(GPUS, 3, "serve run-001")
    try:
        assert placed.gpu == GPUS[3] and placed.claim is not None and placed.claim.held
    finally:
        placed.release()


def test_cuda_visible_devices_narrows_the_gpus_placed_on():
    assert visible(GPUS, None) == GPUS
    assert visible(GPUS, "2,0") == [GPUS[0], GPUS[2]]
    assert visible(GPUS, f"{GPUS[3].uuid[:12]}") == [GPUS[3]]
    assert visible(GPUS, "") == []


def test_a_placed_worker_sees_only_its_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    with Worker("test", command=FAKE_WORKER, startup_timeout_s=30, gpu_uuid=GPUS[2].uuid) as placed:
        assert placed.start()["cuda_visible_devices"] == GPUS[2].uuid  # its device 0 is that GPU
    with Worker("test", command=FAKE_WORKER, startup_timeout_s=30) as unplaced:
        assert unplaced.start()["cuda_visible_devices"] == "0,1,2,3"


def test_nvml_finds_a_placed_gpu_by_its_uuid(monkeypatch):
    by = []
    fake = types.SimpleNamespace(nvmlInit=lambda: None,
                                 nvmlDeviceGetHandleByUUID=lambda uuid: by.append(("uuid", uuid)) or "handle",
                                 nvmlDeviceGetHandleByPciBusId=lambda bus: by.append(("pci", bus)) or "handle",
                                 nvmlDeviceGetHandleByIndex=lambda index: by.append(("index", index)) or "handle")
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert Nvml("00000000:01:00.0", uuid=GPUS[1].uuid).available
    assert Nvml("00000000:01:00.0").available
    assert by == [("uuid", GPUS[1].uuid), ("pci", "00000000:01:00.0")]


def test_the_executor_starts_its_workers_on_its_gpu_and_refuses_a_worker_elsewhere():
    executor = GpuExecutor(load_task(MATMUL), gpu=GPUS[1], confine=False)
    try:
        assert executor.pool.reference.gpu_uuid == executor.pool.candidate.gpu_uuid == GPUS[1].uuid
        assert executor._placed_uuid(None) == GPUS[1].uuid
        with pytest.raises(ExecutorError, match=f"runs on {GPUS[2].uuid}, not on GPU 1"):
            executor._placed_uuid(GPUS[2].uuid)
    finally:
        executor.close()
