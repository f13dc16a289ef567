"""The environment fingerprint (guard/fingerprint.py): from a run's facts, captured on a machine without a GPU,
and the differences the guard lists beside a change."""

from __future__ import annotations

from guard.fingerprint import COMPARED, Fingerprint, capture, from_environment
from harness.nvml import BoardFacts, Nvml
from server.lock import referee_source
from tests.fake_executor import H200_ENVIRONMENT

RUN_FACTS = {**H200_ENVIRONMENT, "gpu": "NVIDIA H200", "gpu_uuid": "GPU-1", "driver": "580.95.05",
             "driver_cuda_version": "13.0", "nvrtc": "13.0", "cuda_bindings": "13.0.1",
             "board": {"max_sm_clock_mhz": 1980, "max_memory_clock_mhz": 3201, "application_sm_clock_mhz": None,
                       "power_limit_w": 700.0, "ecc_enabled": True}}
REFEREE = {"referee_version": "0.1.0", "referee_source_sha256": "a" * 64,
           "referee_source": {"harness/stats.py": "1" * 64, "server/run.py": "2" * 64}}


def test_a_fingerprint_from_a_runs_facts_holds_the_gpu_its_settings_and_the_software():
    f = from_environment(RUN_FACTS, referee=REFEREE)
    assert (f.gpu, f.gpu_uuid, f.sm_count, f.sm_clock_khz) == ("NVIDIA H200", "GPU-1", 132, 1980000)
    assert (f.max_sm_clock_mhz, f.max_memory_clock_mhz, f.power_limit_w, f.ecc_enabled) == (1980, 3201, 700.0, True)
    assert (f.driver, f.driver_cuda_version, f.nvrtc, f.cuda_bindings) == ("580.95.05", "13.0", "13.0", "13.0.1")
    assert f.referee_source_sha256 == "a" * 64 and f.referee_version == "0.1.0"
    assert Fingerprint.model_validate_json(f.model_dump_json()) == f


def test_differences_name_each_changed_field_and_ignore_what_one_side_did_not_measure():
    before = from_environment(RUN_FACTS, referee=REFEREE)
    upgraded = from_environment({**RUN_FACTS, "driver": "590.10.01", "driver_cuda_version": "13.1", "gpu_uuid": None,
                                 "board": {**RUN_FACTS["board"], "power_limit_w": 600.0}},
                                referee={**REFEREE, "referee_source": {"harness/stats.py": "3" * 64}})
    assert [str(d) for d in before.differences(upgraded)] == [
        "power_limit_w: 700.0 -> 600.0", "driver: '580.95.05' -> '590.10.01'", "driver_cuda_version: '13.0' -> '13.1'"]
    assert before.changed_modules(upgraded) == ["harness/stats.py", "server/run.py"]
    assert not before.same_hardware(upgraded)  # a lower power limit changes what a latency means
    assert before.same_hardware(from_environment({**RUN_FACTS, "driver": "590.10.01"}, referee=REFEREE))
    assert set(COMPARED) <= set(Fingerprint.model_fields)


def test_captured_without_a_gpu_the_gpus_fields_are_none_and_the_software_is_read():
    f = capture()
    assert Nvml().board() == BoardFacts()  # this machine has no NVML device
    assert (f.gpu, f.gpu_uuid, f.sm_count, f.power_limit_w, f.ecc_enabled, f.driver) == (None,) * 6
    assert f.nvrtc and f.cuda_bindings and f.referee_version
    assert f.referee_source == referee_source()
    assert not f.same_hardware(f)  # no GPU: nothing to compare milliseconds on


def test_captured_facts_of_an_executor_are_kept():
    f = capture({"gpu": "Fake GPU", "sm_count": 132, "nvrtc": "13.0"})
    assert (f.gpu, f.sm_count, f.nvrtc) == ("Fake GPU", 132, "13.0")
