"""One wording for a speedup's significance (harness.stats.significance), and where it is read: the tool
answers, the report (with the environment as readable rows) and the demo's table (tests/test_demo.py)."""

from __future__ import annotations

import json
import math

import pytest

from harness.stats import Speedup, significance
from server.models import SpeedupAnswer
from server.report_environment import environment_rows
from server.report_files import write_report
from tests.report_support import FIXTURE_RUNS, Page, reported_run
from tests.server_support import client, kernel, new_run, ok

GPU_STATE = {"sm_clock_mhz": 1980, "max_sm_clock_mhz": 1980, "memory_clock_mhz": 3201, "temperature_c": 34,
             "power_w": 118.25, "throttle": ["gpu_idle"], "processes": []}


@pytest.mark.parametrize("low, high, beyond_noise, words", [
    (0.74, 0.74, False, "slower beyond noise"),      # issue 20: shown as "within noise"
    (0.62, 0.62, None, "slower beyond noise"),
    (0.97, 0.99, False, "slower beyond noise"),
    (0.9960, 1.02, False, "within noise"),           # above 1 / 1.005: not slower beyond the noise floor
    (0.99, 1.01, False, "within noise"),
    (1.003, 1.02, False, "within noise"),            # above 1, not beyond the 0.5% floor
    (1.10, 1.20, True, "faster beyond noise"),
    (1.10, 1.20, None, "faster beyond noise"),
    (1.10, 1.20, False, "within noise"),             # an aggregate with a case within noise: not faster
    (2.0, math.inf, True, "faster beyond noise"),    # a candidate interval reaching 0 ms
    (None, 1.2, None, "within noise"),
    (math.nan, 0.5, False, "within noise"),
])
def test_the_interval_against_one_decides_the_words(low, high, beyond_noise, words):
    assert significance(low, high, beyond_noise) == words


@pytest.mark.anyio
async def test_tool_answers_carry_the_words_beside_each_speedup(tmp_path):
    run = new_run(tmp_path)  # the baseline's latency is 100 us
    try:
        async with client(run) as c:
            slower = await ok(c, "time_kernel", source=kernel("latency_us=200"))
            recorded = await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="half the time")
            tools = {t.name: t for t in (await c.list_tools()).tools}
    finally:
        run.close()
    assert slower["speedup_vs_baseline"]["significance"] == "slower beyond noise"
    assert {case["speedup_vs_baseline"]["significance"] for case in slower["cases"]} == {"slower beyond noise"}
    assert recorded["speedup_vs_baseline"]["significance"] == "faster beyond noise"
    assert recorded["verdict"] == "valid-faster"
    speedup_schema = tools["time_kernel"].output_schema["$defs"]["SpeedupAnswer"]["properties"]["significance"]
    assert speedup_schema["enum"] == ["faster beyond noise", "slower beyond noise", "within noise"]


def _attempt_row(html: str, number: int) -> str:
    section = html.split(f'id="attempt-{number}"', 1)[1].split("</section>", 1)[0]
    return Page(section).text


def test_the_report_says_slower_beyond_noise_for_an_interval_below_one(tmp_path_factory):
    run_dir = reported_run("h200-matmul-f32-small", tmp_path_factory)  # attempt 1: naive, 0.63x [0.63, 0.64]
    first = _attempt_row((run_dir / "report.html").read_text(), 1)
    assert "speedup vs baseline 0.63× [0.63–0.64], slower beyond noise" in first
    assert "within noise" not in first


def test_the_report_says_faster_beyond_noise_and_within_noise(tmp_path_factory):
    run_dir = reported_run("cpu", tmp_path_factory)
    html = (run_dir / "report.html").read_text()
    assert "speedup vs baseline 2.00×" in _attempt_row(html, 1)
    assert "faster beyond noise" in _attempt_row(html, 1).split("speedup vs parent")[0]
    assert "speedup vs parent 1.00×" in _attempt_row(html, 3)  # the same latency as the best before it
    assert "within noise" in _attempt_row(html, 3).split("speedup vs parent")[1].split("compile options")[0]


def test_the_environment_is_rows_a_person_reads_not_json(tmp_path):
    run = new_run(tmp_path, {"environment": {"gpu_state": GPU_STATE}})
    run.close()
    write_report(run.dir)
    html = (run.dir / "report.html").read_text()
    text = Page(html).text
    assert "GPU state at the start: SM clock 1,980 MHz (maximum 1,980 MHz)" in text
    assert "GPU state at the start: temperature 34 °C" in text
    assert "GPU state at the start: power 118.2 W" in text
    assert "GPU state at the start: throttle reasons gpu_idle" in text
    assert "GPU state at the start: processes on the GPU (pids) none" in text
    assert "peak memory bandwidth 4,300 GB/s" in text  # the fake's peaks
    environment = html.split("<h3>Environment</h3>", 1)[1].split("<h2", 1)[0]
    assert "sm_clock_mhz" not in environment and "memory_gbps" not in environment and "{" not in environment


def test_the_fixture_run_s_measured_peaks_are_rows():
    lock = json.loads((FIXTURE_RUNS / "h200-matmul-f32-small" / "lock.json").read_text())
    rows = dict(environment_rows(lock["environment"]))
    assert rows["peak memory bandwidth"].startswith("4,275 GB/s (device-to-device copies of 251658240, ")
    assert rows["peak float32"] == "51.3 TFLOP/s (cuBLAS GEMM, 8192³)"
    assert rows["peak bfloat16 tensor"] == "799.2 TFLOP/s"
    assert rows["peaks measured"] == "2026-12-03T09:15:40+00:00 (measured)"
    assert (rows["sandbox: confined"], rows["sandbox: landlock_abi"]) == ("true", "7")
    assert rows["peaks_notes"] == "none"
    assert environment_rows({"gpu_state": None, "peaks": None}) == [("GPU state at the start", "not read (no NVML)"),
                                                                    ("peaks", "not measured")]


def test_a_speedup_answer_made_from_a_speedup_says_what_its_interval_says():
    raw = Speedup(ratio=0.74, low=0.74, high=0.74, beyond_noise=False)
    assert SpeedupAnswer.model_validate(raw).significance == "slower beyond noise"
    claimed = {**raw.model_dump(), "significance": "faster beyond noise"}
    assert SpeedupAnswer.model_validate(claimed).significance == "slower beyond noise"
