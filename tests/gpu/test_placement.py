"""A run placed on a named GPU of the host (harness/gpus.py): its workers run there, and its environment names it
by index and UUID. On one GPU the index-1 test skips; the path of one GPU is the rest of the GPU suite."""

import pytest

from harness.gpus import list_gpus, placement_for
from harness.settings import TimingSettings
from server.executor import GpuExecutor
from tests.gpu.conftest import build

pytestmark = pytest.mark.gpu


def _placed_facts(matmul_task, choice):
    gpus = list_gpus()
    placement = placement_for(gpus, choice, "check matmul_f32")
    executor = GpuExecutor(matmul_task, TimingSettings(warmups=2, iterations=20), gpu=placement.gpu)
    try:
        facts = executor.start()
        kernel = build(matmul_task.source("initial"), matmul_task, facts["arch"],
                       launch=matmul_task.own_launch("initial"))
        assert executor.time(kernel, [matmul_task.visible_cases[0]]).passed
        return placement.gpu, facts
    finally:
        executor.close()
        placement.release()


def test_a_run_placed_on_gpu_0_names_it_by_index_and_uuid(matmul_task):
    gpu, facts = _placed_facts(matmul_task, "0")
    assert (facts["gpu_index"], facts["gpu_uuid"]) == (0, gpu.uuid)
    assert facts["gpu_state"] is not None  # NVML opened by the UUID


def test_a_run_placed_on_gpu_1_runs_there(matmul_task):
    if len(list_gpus()) < 2:
        pytest.skip("needs a second GPU")
    gpu, facts = _placed_facts(matmul_task, list_gpus()[1].uuid)
    assert (facts["gpu_index"], facts["gpu_uuid"]) == (1, gpu.uuid)  # the worker's own driver says this UUID
