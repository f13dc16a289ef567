"""referee://device and describe_task's device_facts, over a real Run with the fake executor; and how a run's
environment becomes those facts."""

from __future__ import annotations

import json

import pytest

from server.device_facts import device_facts
from server.executor import DEVICE_LIMITS
from tests.fake_executor import H200_ENVIRONMENT, H200_LIMITS
from tests.server_support import client, ok, read_json, refused
from tests.test_arch_specific import MATMUL_WGMMA




@pytest.mark.anyio
async def test_referee_device_is_describe_tasks_device_facts_from_the_runs_environment(run):
    async with client(run) as c:
        described = await ok(c, "describe_task")
        resource = json.loads((await c.read_resource("referee://device")).contents[0].text)
        listed = {str(r.uri) for r in (await c.list_resources()).resources}
    assert "referee://device" in listed
    facts = described["device_facts"]
    assert resource == facts
    environment = read_json(run.dir / "lock.json")["environment"]
    assert (facts["gpu"], facts["compute_capability"]) == (environment["gpu"], environment["compute_capability"])
    assert facts["warp_size"] == H200_LIMITS["warp_size"] == environment["limits"]["warp_size"]
    assert facts["shared_bytes_per_block_optin"] == environment["limits"]["max_shared_per_block_optin"]
    assert facts["registers_per_sm"] == environment["limits"]["registers_per_sm"]
    assert facts["peaks"]["memory_gbps"] == environment["peaks"]["memory_gbps"]
    assert facts["launch_floor"] == {"kernel_clock_ms": environment["kernel_floor_ms"],
                                     "event_pair_ms": environment["event_overhead_ms"]}
    assert facts["nvrtc"] == environment["nvrtc_features"]
    assert facts["nvrtc"]["arch_specific_option"] == "-arch=sm_90a" and facts["nvrtc"]["arch_specific_compiles"]


def test_every_limit_and_peak_the_environment_holds_is_a_fact():
    environment = {**H200_ENVIRONMENT, "gpu": "NVIDIA H200", "limits": H200_LIMITS, "total_memory_bytes": 150 << 30,
                   "peaks": {**H200_ENVIRONMENT["peaks"], "tensor_fp16_tflops": 900.0, "notes": ["a"]},
                   "peaks_notes": ["b"], "driver_cuda_version": "13.0"}
    facts = device_facts(environment)
    assert facts.peaks.tensor_tflops == {"bf16": 830.0, "fp16": 900.0}
    assert (facts.peaks.fp32_tflops, facts.peaks.notes) == (51.0, ["a", "b"])
    assert (facts.sm_count, facts.l2_bytes, facts.memory_bus_bits) == (132, 60 * 2**20, 6144)
    assert (facts.memory_clock_khz, facts.sm_clock_khz, facts.total_memory_bytes) == (3201000, 1980000, 150 << 30)
    renamed = {"max_shared_per_block_optin": "shared_bytes_per_block_optin"}
    assert all(getattr(facts, renamed.get(key, key)) == H200_LIMITS[key] for key in DEVICE_LIMITS)
    assert None not in facts.model_dump(exclude={"nvrtc", "launch_floor"}).values()


def test_a_run_started_before_the_facts_existed_has_none_and_odd_values_are_dropped():
    old = device_facts({"gpu": "NVIDIA H200", "compute_capability": [9, 0], "sm_count": 132})
    assert (old.gpu, old.compute_capability, old.sm_count) == ("NVIDIA H200", [9, 0], 132)
    assert (old.warp_size, old.peaks, old.nvrtc, old.launch_floor.kernel_clock_ms) == (None, None, None, None)
    odd = device_facts({"compute_capability": "garbage", "sm_count": True, "limits": "x", "kernel_floor_ms": -1,
                        "peaks": {"memory_gbps": "fast", "tensor_bf16_tflops": None}, "nvrtc_features": {"v": 1}})
    assert (odd.compute_capability, odd.sm_count, odd.warp_size, odd.launch_floor.kernel_clock_ms) == (None,) * 4
    assert (odd.peaks.memory_gbps, odd.peaks.tensor_tflops, odd.nvrtc) == (None, {}, None)
    unmeasured = device_facts({"peaks": None, "peaks_notes": ["device peaks could not be measured: x"]})
    assert unmeasured.peaks.memory_gbps is None and unmeasured.peaks.notes == ["device peaks could not be measured: x"]


@pytest.mark.anyio
async def test_a_candidate_asks_for_sm_90a_and_keeps_it_another_arch_is_refused_and_costs_nothing(run):
    async with client(run) as c:
        compiled = await ok(c, "compile_kernel", source=MATMUL_WGMMA, options=["-arch=sm_90a"])
        assert compiled["ok"] and compiled["arch"] == "sm_90a", compiled["log"]
        plain = await ok(c, "compile_kernel", source=MATMUL_WGMMA)
        assert not plain["ok"] and plain["arch"] == "sm_90" and "-arch=sm_90a" in plain["log"]
        before = (await ok(c, "describe_task"))["budget"], sorted((run.dir / "candidates").iterdir())
        message = await refused(c, "compile_kernel", source=MATMUL_WGMMA, options=["-arch=sm_80"])
        assert message == ("option '-arch=sm_80' is refused: the referee compiles for this device (sm_90); the only "
                           "architecture a candidate may ask for is its architecture-specific target, -arch=sm_90a")
        assert ((await ok(c, "describe_task"))["budget"], sorted((run.dir / "candidates").iterdir())) == before
        recorded = await ok(c, "record_attempt", candidate_id=compiled["candidate"], rationale="wgmma")
        assert recorded["verdict"].startswith("valid"), recorded["reasons"]
    assert read_json(run.dir / f"candidates/{compiled['candidate']}.json")["options"] == ["-arch=sm_90a"]
    assert read_json(run.dir / "history.json")["attempts"][1]["options"] == ["-arch=sm_90a"]
