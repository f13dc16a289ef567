"""No tool call outlives its 55 s, whatever the kernel, on a real GPU and through the real MCP tools: a kernel
that spins about 30 s per launch on the performance cases is stopped at its first such launch (too_slow),
and one whose every thread mallocs 1 MiB and never frees it (120 s before a verdict, once) is rejected
in time. The run folder stays verifiable, the attempt counted once, and the GPU free for the next one."""

import time
from pathlib import Path

import pytest

from harness.settings import TimingSettings
from harness.task import load_task
from server.call import CALL_DEADLINE_S
from server.executor import GpuExecutor
from server.lifecycle import new_run
from server.run import RunSettings
from server.verify import verify_run
from tests.server_support import client

pytestmark = pytest.mark.gpu
MATMUL = Path(__file__).resolve().parents[2] / "cases" / "matmul_f32"
SPIN = (Path(__file__).with_name("kernels") / "spin_on_performance.cu").read_text()
EXPLOITS_DIR = Path(__file__).parents[1] / "exploits"


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run as `serve` makes it: the default protocol, the default call deadline."""
    timing = TimingSettings()
    executor = GpuExecutor(load_task(MATMUL), timing)
    run = new_run(MATMUL, tmp_path_factory.mktemp("results"), RunSettings(timing=timing), executor)
    assert run.call_deadline_s == CALL_DEADLINE_S == 55.0
    yield run
    executor.close()
    run.close()


async def _timed(c, tool: str, **arguments):
    started = time.monotonic()
    result = await c.call_tool(tool, arguments)
    return result, time.monotonic() - started


@pytest.mark.anyio
async def test_a_kernel_spinning_30_s_per_launch_is_too_slow_in_time_and_the_gpu_free_after(run):
    used = run.attempts_used
    async with client(run) as c:
        result, seconds = await _timed(c, "validate", source=SPIN)
        assert not result.is_error and seconds < CALL_DEADLINE_S, seconds
        assert [r["code"] for case in result.structured_content["cases"] for r in case["reasons"]] == ["too_slow"]

        result, seconds = await _timed(c, "record_attempt", source=SPIN, rationale="spins on the large shapes")
        assert not result.is_error and seconds < CALL_DEADLINE_S, seconds
        answer = result.structured_content
        assert answer["verdict"] == "rejected"
        assert {r["code"] for r in answer["reasons"]} == {"too_slow"}, answer["reasons"]
        assert not run.executor.pool.candidate.alive  # its worker was killed, with the spinning kernel

        # The GPU is free: an honest attempt, with the whole default protocol, answers in time too.
        result, seconds = await _timed(c, "record_attempt", source=MATMUL.joinpath("initial.cu").read_text(),
                                       rationale="the baseline again")
        assert not result.is_error and seconds < CALL_DEADLINE_S, seconds
        assert result.structured_content["verdict"].startswith("valid"), result.structured_content["reasons"]
    assert run.attempts_used == used + 2
    assert verify_run(run.dir).ok


# (exploit, the reasons it must be rejected for; None: any, in time)
EXPLOITS = [("malloc_flood", None), ("infinite_loop", {"too_slow"})]


@pytest.mark.anyio
@pytest.mark.parametrize("name, codes", EXPLOITS, ids=[e[0] for e in EXPLOITS])
async def test_a_hostile_kernel_is_rejected_in_time_through_record_attempt(run, name, codes):
    used = run.attempts_used
    source = (EXPLOITS_DIR / f"{name}.cu").read_text()
    async with client(run) as c:
        result, seconds = await _timed(c, "record_attempt", source=source, rationale=name)
    assert not result.is_error and seconds < CALL_DEADLINE_S, seconds
    answer = result.structured_content
    assert answer["verdict"] == "rejected" and answer["reasons"], answer
    if codes is not None:
        assert {r["code"] for r in answer["reasons"]} == codes, answer["reasons"]
    assert run.attempts_used == used + 1
    assert verify_run(run.dir).ok
