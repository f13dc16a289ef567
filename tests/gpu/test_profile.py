"""profile_kernel on the GPU (issue 22, item 1): the demo's naive and register-blocked kernels profiled with
Nsight Compute through the real tool, in the confined one-shot worker, and told apart in the expected
direction."""

from __future__ import annotations

import time

import pytest

from harness.ncu_profile import ncu_path
from harness.settings import TimingSettings
from harness.task import load_task
from server import demo
from server.executor import GpuExecutor
from server.lifecycle import new_run
from server.call import CALL_DEADLINE_S
from server.run import RunSettings
from tests.server_support import MATMUL, client, ok

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(ncu_path() is None, reason="ncu is not on PATH")]
CASE = "square-2048"


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    timing = TimingSettings(warmups=3, iterations=20)
    executor = GpuExecutor(load_task(MATMUL), timing)
    run = new_run(MATMUL, tmp_path_factory.mktemp("results"), RunSettings(timing=timing, profile=True), executor)
    yield run
    executor.close()
    run.close()


def step(label: str) -> demo.Step:
    return next(s for s in demo.PLAN if s.label == label)


@pytest.mark.anyio
async def test_the_profiles_tell_the_naive_and_register_blocked_kernels_apart(run):
    digests = {}
    async with client(run) as c:
        for label in ("naive", "register-blocked 128x128"):
            s = step(label)
            started = time.monotonic()
            answer = await ok(c, "profile_kernel", source=s.source, launch=s.launch, case=CASE)
            assert time.monotonic() - started < CALL_DEADLINE_S
            assert answer["case"] == CASE and (run.dir / "profiles" / f"{answer['profile']}.csv").is_file()
            digests[label] = answer["digest"]
    naive, blocked = digests["naive"], digests["register-blocked 128x128"]
    assert naive["kernel"] == blocked["kernel"] == "matmul_f32"
    assert blocked["duration_ms"] < naive["duration_ms"]
    assert blocked["compute"]["fma_pipe_pct"] > naive["compute"]["fma_pipe_pct"]
    assert blocked["compute"]["flops_per_second"]["fp32"] > 2 * naive["compute"]["flops_per_second"]["fp32"]
    assert blocked["memory"]["l1_bytes"] < naive["memory"]["l1_bytes"]  # the naive kernel rereads A and B
    assert blocked["occupancy"]["registers_per_thread"] > naive["occupancy"]["registers_per_thread"]
    assert naive["top_stalls"] and blocked["occupancy"]["limited_by"]
    assert run.budget().probes_left_in_window == RunSettings().probes_per_window - 2
