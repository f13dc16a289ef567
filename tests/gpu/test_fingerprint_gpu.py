"""The environment fingerprint captured on a real GPU: NVML's board readings are there."""

from __future__ import annotations

import pytest

from guard.fingerprint import capture
from harness.gpus import list_gpus

pytestmark = pytest.mark.gpu


def test_a_fingerprint_captured_on_a_gpu_names_the_board_and_its_settings():
    gpu = list_gpus()[0]
    f = capture(gpu_uuid=gpu.uuid)
    assert f.gpu and "NVIDIA" in f.gpu and f.gpu_uuid == gpu.uuid
    assert f.max_sm_clock_mhz and f.max_sm_clock_mhz > 500 and f.max_memory_clock_mhz
    assert f.power_limit_w and f.power_limit_w > 100 and f.ecc_enabled in (True, False)
    assert f.driver and f.driver.count(".") >= 1 and f.driver_cuda_version and f.driver_cuda_version[0].isdigit()
    assert f.nvrtc and f.cuda_bindings and f.referee_source_sha256
    assert f.same_hardware(capture(gpu_uuid=gpu.uuid)) and f.differences(capture(gpu_uuid=gpu.uuid)) == []
