"""bench/multi_gpu.py on a machine without two GPUs: it refuses on one line; its comparison, on made-up numbers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench import multi_gpu, timing
from harness.placement import GpuInfo
from tests.fake_executor import fake_gpus
from tests.server_support import REPO


def test_fewer_than_two_gpus_is_one_line_and_status_2():
    done = subprocess.run([sys.executable, str(REPO / "bench" / "multi_gpu.py")], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == multi_gpu.EXIT_TOO_FEW == 2
    assert done.stdout == "" and done.stderr.count("\n") == 1
    assert "needs two GPUs or more on one host; NVML lists 0 here" in done.stderr


def test_one_gpu_is_refused_and_two_are_not():
    assert "NVML lists 1 here" in multi_gpu.too_few_gpus([GpuInfo(0, "GPU-a")])
    assert multi_gpu.too_few_gpus([GpuInfo(0, "GPU-a"), GpuInfo(1, "GPU-b")]) is None


@pytest.mark.parametrize("loaded_ms, agree", [(1.015, True), (1.05, False), (0.95, False)])
def test_medians_agree_within_the_timings_own_noise(loaded_ms, agree):
    alone = [(1.0, 0.01), (1.002, 0.01), (0.998, 0.012)]
    loaded = [(loaded_ms, 0.01)] * 3
    judged = multi_gpu.isolation(alone, loaded)
    assert judged["noise"] == pytest.approx(0.02)
    assert judged["agree"] is agree


def test_bench_timing_on_the_gpu_asked_for_sees_only_it(monkeypatch):
    from_two = fake_gpus(2)
    monkeypatch.setattr(timing, "list_gpus", lambda: from_two)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # restored after the test
    placement = timing.on_one_gpu("1")
    try:
        assert placement.gpu == from_two[1] and os.environ["CUDA_VISIBLE_DEVICES"] == from_two[1].uuid
    finally:
        placement.release()
