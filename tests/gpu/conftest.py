from pathlib import Path

import pytest

from harness.compile import compile_kernel
from harness.evaluate import Kernel, Referee, Settings
from harness.task import load_task
from sandbox.pool import WorkerPool

MATMUL = Path(__file__).resolve().parents[2] / "cases" / "matmul_f32"


@pytest.fixture(scope="module")
def matmul_task():
    return load_task(MATMUL)


@pytest.fixture(scope="module")
def pool():
    with WorkerPool() as pool:
        yield pool


@pytest.fixture(scope="module")
def arch(pool):
    return pool.candidate.ensure_started()["arch"]


@pytest.fixture(scope="module")
def referee(matmul_task, pool, arch):
    reference = build(matmul_task.source("reference"), matmul_task, arch, label="reference")
    return Referee(matmul_task, pool, reference, Settings(warmups=3, iterations=40))


def build(source: str, task, arch: str, label: str = "candidate", launch=None) -> Kernel:
    compiled = compile_kernel(source, task.kernel_name, arch=arch)
    assert compiled.ok, compiled.log
    assert compiled.resources is not None and compiled.resources.registers > 0
    return Kernel(label, compiled.cubin, compiled.lowered_name, launch or task.launch)
