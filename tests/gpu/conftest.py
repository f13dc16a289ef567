from pathlib import Path

import pytest

from harness.worker_side.nvrtc import compile_kernel
from harness.referee import Referee
from harness.settings import CompiledKernel, TimingSettings
from harness.task import load_task
from harness.gpu_workers import gpu_worker_pool

MATMUL = Path(__file__).resolve().parents[2] / "cases" / "matmul_f32"


@pytest.fixture(scope="module")
def matmul_task():
    return load_task(MATMUL)


@pytest.fixture(scope="module")
def pool():
    with gpu_worker_pool() as pool:
        yield pool


@pytest.fixture(scope="module")
def arch(pool):
    return pool.candidate.ensure_started()["arch"]


@pytest.fixture(scope="module")
def referee(matmul_task, pool, arch):
    reference = build(matmul_task.source("reference"), matmul_task, arch, label="reference")
    return Referee(matmul_task, pool, reference, TimingSettings(warmups=3, iterations=40))


def build(source: str, task, arch: str, label: str = "candidate", launch=None) -> CompiledKernel:
    compiled = compile_kernel(source, task.kernel_name, arch=arch)
    assert compiled.ok, compiled.log
    assert compiled.resources is not None and compiled.resources.registers > 0
    return CompiledKernel(label, compiled.cubin, compiled.lowered_name, launch or task.launch)
