"""On a GPU: referee://device says what the CUDA driver says (read here, in the test's own process), and a wgmma
kernel compiled for sm_90a is judged on the bf16 task like any other kernel, through the real server."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from cuda.bindings import driver
from mcp import Client

from harness.settings import TimingSettings
from harness.task import load_task
from server.app import build_server
from server.executor import GpuExecutor
from server.lifecycle import new_run
from server.run import RunSettings
from server.verify import verify_run

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
MATMUL_BF16 = REPO / "cases" / "matmul_bf16"
WGMMA = Path(__file__).resolve().parent / "kernels" / "wgmma_bf16.cu"
WGMMA_LAUNCH = {"grid": ["ceil_div(n, 8)", "ceil_div(m, 64)", 1], "block": [128, 1, 1]}
VERDICTS = {"valid-faster", "valid-not-faster", "rejected"}
# referee://device's field -> the driver attribute it must equal.
ATTRIBUTES = {
    "sm_count": "MULTIPROCESSOR_COUNT", "warp_size": "WARP_SIZE", "l2_bytes": "L2_CACHE_SIZE",
    "registers_per_sm": "MAX_REGISTERS_PER_MULTIPROCESSOR", "registers_per_block": "MAX_REGISTERS_PER_BLOCK",
    "shared_bytes_per_sm": "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
    "shared_bytes_per_block": "MAX_SHARED_MEMORY_PER_BLOCK",
    "shared_bytes_per_block_optin": "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
    "reserved_shared_bytes_per_block": "RESERVED_SHARED_MEMORY_PER_BLOCK",
    "max_threads_per_block": "MAX_THREADS_PER_BLOCK", "max_threads_per_sm": "MAX_THREADS_PER_MULTIPROCESSOR",
    "max_blocks_per_sm": "MAX_BLOCKS_PER_MULTIPROCESSOR", "memory_bus_bits": "GLOBAL_MEMORY_BUS_WIDTH",
    "memory_clock_khz": "MEMORY_CLOCK_RATE", "sm_clock_khz": "CLOCK_RATE",
}


def _checked(result):
    error, *values = result
    assert error == driver.CUresult.CUDA_SUCCESS, error
    return values[0] if len(values) == 1 else values


def driver_says() -> dict:
    """The facts of device 0 as the CUDA driver reports them to this process (the workers' device 0 too:
    CUDA_VISIBLE_DEVICES reaches them unchanged)."""
    _checked(driver.cuInit(0))
    device = _checked(driver.cuDeviceGet(0))

    def attribute(name: str) -> int:
        return int(_checked(driver.cuDeviceGetAttribute(getattr(driver.CUdevice_attribute,
                                                                 f"CU_DEVICE_ATTRIBUTE_{name}"), device)))

    facts = {field: attribute(name) for field, name in ATTRIBUTES.items()}
    facts["compute_capability"] = [attribute("COMPUTE_CAPABILITY_MAJOR"), attribute("COMPUTE_CAPABILITY_MINOR")]
    facts["total_memory_bytes"] = int(_checked(driver.cuDeviceTotalMem(device)))
    facts["gpu"] = _checked(driver.cuDeviceGetName(256, device)).split(b"\0", 1)[0].decode(errors="replace")
    return facts


async def _session(run) -> dict:
    """describe_task, referee://device, then the wgmma kernel (on a 9.0 device) compiled both ways and recorded."""
    seen: dict = {}
    async with Client(build_server(run), cache=None) as client:
        seen["described"] = (await client.call_tool("describe_task", {})).structured_content
        seen["device"] = json.loads((await client.read_resource("referee://device")).contents[0].text)
        if seen["device"]["compute_capability"] != [9, 0]:
            return seen
        source = WGMMA.read_text()
        for key, options in (("compiled", ["-arch=sm_90a"]), ("plain", [])):
            answer = await client.call_tool("compile_kernel", {"source": source, "options": options,
                                                               "launch": WGMMA_LAUNCH})
            assert not answer.is_error, answer.content
            seen[key] = answer.structured_content
        recorded = await client.call_tool("record_attempt", {"candidate_id": seen["compiled"]["candidate"],
                                                             "rationale": "wgmma m64n8k16 on sm_90a"})
        seen["recorded_error"] = recorded.content[0].text if recorded.is_error else None
        seen["recorded"] = recorded.structured_content
        seen["after"] = (await client.call_tool("describe_task", {})).structured_content
    return seen


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> dict:
    """A run of matmul_bf16 with one attempt, served in-process to a real MCP client."""
    timing = TimingSettings(warmups=3, iterations=20)
    executor = GpuExecutor(load_task(MATMUL_BF16), timing)
    try:
        run = new_run(MATMUL_BF16, tmp_path_factory.mktemp("device") / "results",
                      RunSettings(max_attempts=1, timing=timing), executor)
        try:
            seen = anyio.run(_session, run)
        finally:
            run.close()
    finally:
        executor.close()
    seen["run_dir"] = run.dir
    return seen


def test_referee_device_matches_what_the_cuda_driver_reports(session):
    device = session["device"]
    assert device == session["described"]["device_facts"]
    for field, value in driver_says().items():
        assert device[field] == value, field
    assert device["peaks"]["memory_gbps"] > 0 and device["peaks"]["fp32_tflops"] > 0
    assert device["launch_floor"]["event_pair_ms"] > 0
    major, minor = device["compute_capability"]
    nvrtc = device["nvrtc"]
    assert nvrtc["arch"] == f"sm_{major}{minor}" and nvrtc["arch_specific_option"] == f"-arch=sm_{major}{minor}a"
    assert nvrtc["arch"] in nvrtc["supported_archs"]


def test_a_wgmma_kernel_is_judged_like_any_other(session):
    if session["device"]["compute_capability"] != [9, 0]:
        pytest.skip(f"wgmma needs sm_90a, a 9.0 device; this one is {session['device']['compute_capability']}")
    assert session["device"]["nvrtc"]["arch_specific_compiles"]
    compiled, plain = session["compiled"], session["plain"]
    assert compiled["ok"] and compiled["arch"] == "sm_90a", compiled["log"]
    assert not plain["ok"] and "-arch=sm_90a" in plain["log"]
    assert session["recorded_error"] is None
    recorded = session["recorded"]
    assert recorded["verdict"] in VERDICTS
    assert recorded["verdict"] != "rejected" or recorded["reasons"], recorded  # a rejection says why
    assert session["after"]["budget"]["attempts_used"] == 1
    history = json.loads((session["run_dir"] / "history.json").read_text())["attempts"]
    assert history[1]["options"] == ["-arch=sm_90a"] and history[1]["verdict"] == recorded["verdict"]
    report = verify_run(session["run_dir"])
    assert report.ok, report.problems
