"""`kernel-referee service --ray` on a real GPU: a local Ray cluster of this host's GPUs, a run's executor the real
GpuExecutor in a Ray actor asking for one GPU. The actor claims the GPU Ray gave it on the node, its facts name that
GPU and the node, a candidate compiles, checks and times there, and closing the run lets the claim go."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import pytest

from harness.gpu_lease import LEASE_DIR_ENV, ServingClaim, lease_folder
from harness.gpus import list_gpus
from harness.settings import CompiledKernel, TimingSettings
from harness.task import load_task
from service.ray_executor import GPU, RayFleet, node_gpu_executor

REPO = Path(__file__).resolve().parents[2]
MATMUL = REPO / "cases" / "matmul_f32"

ray = pytest.importorskip("ray", reason="Ray is the optional extra kernel-referee[fleet]: not installed here")

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def cluster():
    # The actors import the project from the checkout and keep the node's claims where this test session keeps its.
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO), LEASE_DIR_ENV: str(lease_folder())}})
    try:
        yield
    finally:
        ray.shutdown()


def test_a_runs_executor_on_the_ray_clusters_gpu_claims_it_and_judges_there(cluster):
    fleet = RayFleet(partial(node_gpu_executor, confine=True), GPU)
    gpus = {g.uuid: g for g in list_gpus()}
    assert len(fleet.slots()) == len(gpus) >= 1  # one queue slot per GPU Ray counts on this host
    task = load_task(MATMUL)
    executor = fleet.make_executor(task, TimingSettings(warmups=3, iterations=20), None)
    try:
        facts = executor.start()
        node = facts["ray_node"]
        assert node["pid"] != os.getpid() and node["ray_gpu_ids"]
        assert node["gpu_uuid"] == facts["gpu_uuid"] and facts["gpu_uuid"] in gpus  # the GPU Ray gave, by NVML
        assert node["serving_claim"] == "held"
        assert ServingClaim(facts["gpu_uuid"], "test").is_taken()  # held by the actor's process, not this one
        assert executor.compile_arch() == facts["arch"]
        compiled = executor.compile(task.source("initial"), ())
        assert compiled.ok, compiled.log
        kernel = CompiledKernel("candidate", compiled.cubin, compiled.lowered_name, task.launch)
        checked = executor.check(kernel, list(task.visible_cases))
        assert checked.passed, checked
        timed = executor.time(kernel, list(task.performance_cases))
        assert timed.passed and timed.score_ms > 0, timed
    finally:
        executor.close()
    assert not ServingClaim(facts["gpu_uuid"], "test").is_taken()  # closing the run let the node's claim go
