"""A run queued for a GPU compiles without one: GpuExecutor made with no GPU (service/live.py `open_queued`) knows
its arch from NVML, compiles in its compile worker without starting a GPU worker, and hands its compiles to the
executor placed on the GPU, which answers the same from its cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.task import load_task
from server.executor import GpuExecutor
from service.live import _carry_compiles

MATMUL = Path(__file__).resolve().parents[2] / "cases" / "matmul_f32"

pytestmark = pytest.mark.gpu


def test_an_unplaced_executor_compiles_for_the_gpus_arch_without_a_gpu_worker():
    task = load_task(MATMUL)
    unplaced = GpuExecutor(task)
    try:
        arch = unplaced.compile_arch()
        assert arch is not None and arch.startswith("sm_")
        early = unplaced.compile(task.source("initial"), ())
        assert early.ok and early.arch.startswith(arch) and early.mix is not None, early.log
        assert not unplaced.pool.candidate.alive  # no CUDA context was made for it
        placed = GpuExecutor(task)
        try:
            _carry_compiles(unplaced, placed)
            assert placed.hello()["arch"] == arch  # NVML's arch is the worker's
            again = placed.compile(task.source("initial"), ())
            assert again.cache_hit and again.cubin == early.cubin and again.log == early.log
        finally:
            placed.close()
    finally:
        unplaced.close()
