"""Beyond the physical limit is refused, not re-checked: the pure computation (harness/peaks.py) and the rule
through the real record_attempt with the fake executor (server/suspicion.py, server/attempt.py)."""

from __future__ import annotations

import pytest

from harness.peaks import (PHYSICAL_MARGIN, PhysicalPeak, limit_checks, physical_bound_ms, physical_peaks,
                           theoretical_peaks, violations)
from harness.stats import summarize
from harness.task import load_task
from server.attempt import record_attempt
from server.suspicion import physical_limit_checks
from tests.fake_executor import FAKE_PEAKS, H200_ENVIRONMENT, H200_PEAKS
from tests.server_support import INITIAL, MATMUL, events, kernel, new_run, read_json

SQUARE_2048_FLOPS = 2.0 * 2048 ** 3
SQUARE_2048_BYTES = 4.0 * 3 * 2048 ** 2


# -- theoretical and physical peaks ---------------------------------------------------------------

def test_an_h200_s_theoretical_peaks_come_from_its_clocks_bus_and_sms():
    peaks = theoretical_peaks(H200_ENVIRONMENT)
    assert peaks["fp32_tflops"] == pytest.approx(132 * 128 * 2 * 1.98e9 / 1e12)  # 66.9
    assert round(peaks["fp32_tflops"], 1) == 66.9
    assert peaks["memory_gbps"] == pytest.approx(3.201e9 * 2 * 6144 / 8 / 1e9)    # 4916.7
    assert peaks["tensor_bf16_tflops"] == pytest.approx(132 * 4096 * 1.98e9 / 1e12)  # 1070.5


@pytest.mark.parametrize("capability, sms, mhz, fp32, bf16", [
    ([8, 0], 108, 1410, 19.5, 312.0),       # A100: the datasheet's 19.5 and 312 TFLOP/s
    ("8.6", 84, 1800, 38.7, 154.8),         # RTX A6000
    ("sm_89", 142, 2520, 91.6, 366.4),      # L40S
    ((7, 0), 80, 1530, 15.7, None),         # V100: no bfloat16 tensor cores
    ([6, 1], 28, 1582, 11.3, None),         # GTX 1080 Ti
])
def test_the_compute_peaks_follow_the_compute_capability(capability, sms, mhz, fp32, bf16):
    peaks = theoretical_peaks({"compute_capability": capability, "sm_count": sms, "sm_clock_khz": mhz * 1000})
    assert peaks["fp32_tflops"] == pytest.approx(fp32, rel=0.01)
    assert peaks["tensor_bf16_tflops"] == (None if bf16 is None else pytest.approx(bf16, rel=0.01))
    assert peaks["memory_gbps"] is None  # no memory clock or bus given


def test_an_unknown_architecture_has_no_theoretical_compute_peak_and_the_measured_one_stands():
    environment = {**H200_ENVIRONMENT, "compute_capability": [5, 2]}
    assert theoretical_peaks(environment)["fp32_tflops"] is None
    assert theoretical_peaks({**environment, "compute_capability": "garbage"})["fp32_tflops"] is None
    peaks = physical_peaks(environment)
    assert peaks["fp32"].peak == H200_PEAKS["fp32_tflops"] and peaks["fp32"].theoretical is None
    assert peaks["memory"].theoretical == pytest.approx(4916.7, abs=0.1)  # the memory clock and bus still tell


def test_the_physical_peak_is_the_larger_of_measured_and_theoretical():
    peaks = physical_peaks(H200_ENVIRONMENT)
    assert peaks["fp32"].peak == pytest.approx(66.9, abs=0.05)          # theoretical, above cuBLAS's 51
    assert peaks["fp32"].measured == 51.0
    assert peaks["memory"].peak == pytest.approx(4916.7, abs=0.1)       # theoretical, above the copy's 4300
    faster = physical_peaks({**H200_ENVIRONMENT, "peaks": {**H200_PEAKS, "fp32_tflops": 70.0}})
    assert faster["fp32"].peak == 70.0 and faster["fp32"].describe() == "70.0 TFLOP/s peak (measured; theoretical 66.9)"
    assert physical_peaks({"peaks": FAKE_PEAKS}) == {"memory": PhysicalPeak(kind="memory", unit="GB/s", peak=4300.0,
                                                                            measured=4300.0)}


def test_without_any_peak_nothing_is_checked():
    assert physical_peaks({}) == {} and physical_peaks({"gpu": "x", "peaks": None}) == {}
    assert limit_checks({}, "square-2048", 0.001, SQUARE_2048_BYTES, SQUARE_2048_FLOPS) == []
    task = load_task(MATMUL)
    stats = {c.name: {"median_ms": 1e-6} for c in task.performance_cases}
    assert physical_limit_checks(task, {"gpu": "Fake GPU"}, stats) == []


# -- the margin and the timing's uncertainty ------------------------------------------------------

PEAK_100 = {"fp32": PhysicalPeak(kind="fp32", unit="TFLOP/s", peak=100.0, measured=100.0)}  # 1e12 flops: 10 ms


def one(median_ms: float):
    [check] = limit_checks(PEAK_100, "c", median_ms, None, 1e12, "fp32")
    return check


def test_beyond_only_when_the_median_beats_the_bound_by_more_than_the_margin():
    assert PHYSICAL_MARGIN == 0.10
    assert physical_bound_ms(PEAK_100["fp32"], 1e12) == pytest.approx(10.0)
    assert not one(9.5).beyond                        # faster than the peak, but within the margin
    assert not one(9.1).beyond                        # 9.1 x 1.1 = 10.01: just inside
    assert one(9.0).beyond                            # 9.0 x 1.1 = 9.9: just beyond
    assert one(5.0).beyond


def test_slow_launches_do_not_move_the_limit():
    """A median beyond the limit stays beyond whatever the upper end of its interval: the launches above
    the median (a kernel's padded ones) never widen the limit's test."""
    fast, slow = [5.0] * 52, [10.5] * 48  # 52 fast launches of a 10 ms bound, 48 padded past it
    stats = summarize(fast + slow)
    assert stats.median_ms == 5.0 and stats.ci_high_ms == 10.5  # the interval's upper rank is a slow launch
    task = load_task(MATMUL)
    [case] = [c for c in task.performance_cases if c.name == "square-2048"]
    flops = task.flops(case.dims)
    peak = {"fp32": PhysicalPeak(kind="fp32", unit="TFLOP/s", peak=flops / 10.0 / 1e9, measured=None)}
    [check] = limit_checks(peak, case.name, stats.median_ms, None, flops, "fp32")
    assert check.beyond
    checks = physical_limit_checks(task, {"peaks": {"fp32_tflops": flops / 10.0 / 1e9}},
                                   {case.name: stats.model_dump()})
    assert [(c.case, c.beyond) for c in checks] == [(case.name, True)]


def test_a_check_of_another_compute_class_or_without_work_is_not_made():
    assert limit_checks(PEAK_100, "c", 1.0, None, 1e12, "tensor_bf16") == []
    assert limit_checks(PEAK_100, "c", 1.0, 1e9, None, "fp32") == []  # no memory peak, no flops


def test_the_detail_names_the_case_the_achieved_figure_and_the_peak():
    peaks = physical_peaks(H200_ENVIRONMENT)
    checks = limit_checks(peaks, "square-2048", 0.107, SQUARE_2048_BYTES, SQUARE_2048_FLOPS, "fp32")
    assert [(c.kind, c.beyond) for c in checks] == [("memory", False), ("fp32", True)]
    [worst] = violations(checks)
    assert worst.detail() == ("square-2048: 160.6 TFLOP/s of fp32 at the median 0.107 ms, beyond the device's "
                              "66.9 TFLOP/s peak (theoretical; measured 51.0) by more than the 10% margin")
    memory = limit_checks(peaks, "square-2048", 0.008, SQUARE_2048_BYTES, None, "fp32")
    assert memory[0].beyond and memory[0].detail().startswith(
        "square-2048: 6291.5 GB/s of memory traffic at the median 0.008 ms, beyond the device's 4916.7 GB/s peak "
        "(theoretical; measured 4300.0)")


def test_the_l2_s_size_is_deducted_from_the_bytes_as_writes_may_stay_in_it():
    peaks, l2 = physical_peaks(H200_ENVIRONMENT), H200_ENVIRONMENT["l2_bytes"]
    softmax = 8.0 * 4096 * 4096  # 134.2 MB: 6711 GB/s at 20 us counting them all, beyond 4916.7 + 10%
    [honest] = limit_checks(peaks, "square-4096", 0.020, softmax, None, cache_bytes=l2)
    assert honest.work == softmax - l2 and honest.achieved == pytest.approx(3565.1, abs=0.1) and not honest.beyond
    [skipped] = limit_checks(peaks, "square-4096", 0.010, softmax, None, cache_bytes=l2)
    assert skipped.beyond and skipped.detail().startswith(
        "square-4096: 7130.3 GB/s of memory traffic (its 134.2 MB less the 62.9 MB of L2 its writes may stay in) "
        "at the median 0.01 ms, beyond the device's 4916.7 GB/s peak")
    assert limit_checks(peaks, "square-2048", 0.001, SQUARE_2048_BYTES, None, cache_bytes=l2) == []  # fits
    task = load_task(MATMUL)
    stats = {c.name: {"median_ms": 0.107} for c in task.performance_cases}
    assert {c.kind for c in physical_limit_checks(task, H200_ENVIRONMENT, stats)} == {"fp32"}  # all within the L2


def test_violations_keep_the_worst_limit_of_each_case():
    peaks = physical_peaks(H200_ENVIRONMENT)
    checks = (limit_checks(peaks, "a", 0.001, SQUARE_2048_BYTES, SQUARE_2048_FLOPS, "fp32")
              + limit_checks(peaks, "b", 1.0, SQUARE_2048_BYTES, SQUARE_2048_FLOPS, "fp32"))
    assert [(c.case, c.kind) for c in violations(checks)] == [("a", "fp32")]  # 17 PFLOP/s is the worse of the two


# -- through record_attempt -----------------------------------------------------------------------

def h200_run(tmp_path, baseline_us: float):
    """A run on an H200-like fake: its facts, its measured peaks, and a baseline of `baseline_us` per case."""
    return new_run(tmp_path, {"environment": H200_ENVIRONMENT, "default_latency_us": baseline_us})


def attempt(run, source: str):
    return record_attempt(run, run.candidate(None, source), "try", None, None)


def test_an_attempt_timed_impossibly_fast_is_refused_not_reverified(tmp_path):
    run = h200_run(tmp_path, 5000)  # square-2048 at 5 ms: 3.4 TFLOP/s
    try:
        answer = attempt(run, kernel("latency_us=107"))  # 160 TFLOP/s of fp32 on square-2048
        assert answer.verdict == "rejected" and answer.best_attempt == 0
        [reason] = answer.reasons
        assert (reason.code.value, reason.case) == ("beyond_physical_limit", "square-2048")
        assert reason.detail.startswith("square-2048: 160.") and "TFLOP/s of fp32 at the median 0.107 ms" in reason.detail
        assert "66.9 TFLOP/s peak (theoretical; measured 51.0)" in reason.detail and "10% margin" in reason.detail
        assert answer.budget.attempts_used == 1 and answer.budget.attempts_left == run.settings.max_attempts - 1
        entry = run.history[-1]
        assert "flags" not in entry and "reverification" not in entry and run.executor.aborted == 0
        record = entry.physical_limit
        assert record["margin"] == PHYSICAL_MARGIN
        assert record["peaks"]["fp32"]["peak"] == pytest.approx(66.9, abs=0.05)
        beyond = [(c["case"], c["kind"]) for c in record["cases"] if c["beyond"]]
        assert beyond == [("square-2048", "fp32")]  # rect-2000x1500x1000 at 56 TFLOP/s is within the margin
        square = next(c for c in record["cases"] if (c["case"], c["kind"]) == ("square-2048", "fp32"))
        assert square["achieved"] == pytest.approx(160.5, abs=1.0) and square["unit"] == "TFLOP/s"
        history = read_json(run.dir / "history.json")["attempts"]
        assert history[1]["verdict"] == "rejected" and history[1]["physical_limit"] == record
        assert read_json(run.dir / "summary.json")["best_attempt"] == 0
        assert (run.dir / "best.cu").read_text() == INITIAL
        assert [e["data"] for e in events(run.dir) if e["kind"] == "beyond_physical_limit"] == [
            {"attempt": 1, "cases": ["square-2048"]}]
    finally:
        run.close()


def test_an_attempt_ten_times_faster_but_physically_possible_is_flagged_and_reverified(tmp_path):
    run = h200_run(tmp_path, 5000)
    try:
        answer = attempt(run, kernel("latency_us=400"))  # 12.5x the baseline; 42.9 TFLOP/s on square-2048
        assert answer.verdict == "valid-faster" and answer.best_attempt == 1
        entry = run.history[-1]
        assert entry.flags and "more than 10x" in entry.flags[0]
        assert entry.reverification["passed"] is True and run.executor.aborted == 1
        assert not any(c["beyond"] for c in entry.physical_limit["cases"])
        assert [e["data"]["reverified"] for e in events(run.dir) if e["kind"] == "flagged"] == [True]
    finally:
        run.close()


def test_a_result_below_the_measured_memory_roofline_but_within_the_margin_stays_a_flag(tmp_path):
    run = new_run(tmp_path)  # the fake's measured memory peak alone: 4300 GB/s, square-2048 in 11.7 us
    try:
        answer = attempt(run, kernel("latency_us=11"))  # 9.1x the baseline: only the roofline flag
        assert answer.verdict == "valid-faster"
        entry = run.history[-1]
        assert [f.split(":")[0] for f in entry.flags] == ["square-2048"]
        assert "below the memory roofline" in entry.flags[0]
        assert entry.reverification["passed"] is True
        assert [(c["case"], c["kind"]) for c in entry.physical_limit["cases"]] == [
            (case.name, "memory") for case in run.task.performance_cases]
        assert not any(c["beyond"] for c in entry.physical_limit["cases"])
    finally:
        run.close()


def test_the_baseline_is_exempt(tmp_path):
    run = h200_run(tmp_path, 100)  # the fake's usual baseline: 172 TFLOP/s on square-2048, impossible
    try:
        assert run.history[0].verdict == "baseline" and not run.history[0].has("physical_limit")
        answer = attempt(run, kernel("latency_us=50"))
        assert answer.verdict == "rejected" and answer.reasons[0].code.value == "beyond_physical_limit"
    finally:
        run.close()
