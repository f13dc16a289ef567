"""The replay's GO/NO-GO rule on hand-made inputs: each failure kind is a NO-GO that names its thing."""

from __future__ import annotations

import pytest

from harness.stats import Speedup
from server.decision import (ENVIRONMENT_FIELDS, REQUIRED_CHECKS, CheckResult, RepeatResult, decide,
                             environment_differences, other_environment_differences)

ENV = {"gpu": "NVIDIA H200", "compute_capability": [9, 0], "driver_cuda_version": "13.0", "nvrtc": "13.0.88",
       "cuda_bindings": "13.3.1", "sm_clock_khz": 1980000, "event_overhead_ms": 0.002,
       "sandbox": {"confined": True, "landlock_abi": 7}}
FAST = Speedup(ratio=2.0, low=1.9, high=2.1, beyond_noise=True)
NOISY = Speedup(ratio=1.01, low=0.97, high=1.05, beyond_noise=False)


def check(kind: str, case: str = "square-256", passed: bool = True, reasons=()) -> CheckResult:
    return CheckResult(name=f"{kind} {case}", kind=kind, case=case, passed=passed, reasons=list(reasons))


def good_checks() -> list[CheckResult]:
    return [check("replay", "odd-31x37x29"), check("replay"), check("holdout", "holdout-97x83x61"),
            check("holdout-oracle", "holdout-97x83x61"), check("fresh-oracle"),
            check("fresh-oracle", "holdout-97x83x61")]


def repeat(n: int, overall: Speedup = FAST, **cases: Speedup) -> RepeatResult:
    return RepeatResult(repeat=n, speedup=overall, cases=cases or {"square-256": FAST, "rect-384x256x320": FAST})


def good_repeats() -> list[RepeatResult]:
    return [repeat(1), repeat(2), repeat(3)]


def test_all_good_is_go():
    decision = decide(good_checks(), good_repeats(), ENV, dict(ENV))
    assert decision.decision == "GO"
    assert decision.reasons[0] == "all 6 independent checks passed"
    assert "all 3 repeats" in decision.reasons[1] and "2x [1.9, 2.1]" in decision.reasons[1]
    assert all(name in decision.reasons[2] for name in ENVIRONMENT_FIELDS)


def test_a_failed_holdout_check_is_no_go_naming_the_case_and_why():
    checks = good_checks()
    checks[2] = check("holdout", "holdout-97x83x61", passed=False, reasons=["mismatch: c: 12 of 8051 elements"])
    decision = decide(checks, good_repeats(), ENV, ENV)
    assert decision.decision == "NO-GO"
    assert decision.reasons == ["holdout holdout-97x83x61 failed: mismatch: c: 12 of 8051 elements"]


@pytest.mark.parametrize("kind", ["replay", "holdout-oracle", "fresh-oracle", "compile", "referee"])
def test_any_failed_check_is_no_go_naming_it(kind):
    checks = good_checks() + [check(kind, "rect-384x256x320", passed=False, reasons=["it broke"])]
    decision = decide(checks, good_repeats(), ENV, ENV)
    assert decision.decision == "NO-GO"
    assert decision.reasons == [f"{kind} rect-384x256x320 failed: it broke"]


def test_a_failed_check_without_reasons_still_says_so():
    checks = good_checks() + [check("replay", "odd-31x37x29", passed=False)]
    assert decide(checks, good_repeats(), ENV, ENV).reasons == ["replay odd-31x37x29 failed: no reason given"]


@pytest.mark.parametrize("kind", list(REQUIRED_CHECKS))
def test_a_missing_kind_of_check_is_no_go(kind):
    checks = [c for c in good_checks() if c.kind != kind]
    decision = decide(checks, good_repeats(), ENV, ENV)
    assert decision.decision == "NO-GO"
    assert decision.reasons == [f"no {kind} check was made ({REQUIRED_CHECKS[kind]})"]


def test_no_checks_and_no_repeats_name_everything_missing():
    decision = decide([], [], ENV, ENV)
    assert decision.decision == "NO-GO"
    assert len(decision.reasons) == len(REQUIRED_CHECKS) + 1 and decision.reasons[-1] == "no timing repeat was made"


def test_a_repeat_within_noise_is_no_go_naming_the_repeat_and_the_case():
    repeats = good_repeats()
    repeats[1] = repeat(2, Speedup(ratio=1.4, low=0.99, high=1.8, beyond_noise=False),
                        **{"square-256": FAST, "rect-384x256x320": NOISY})
    decision = decide(good_checks(), repeats, ENV, ENV)
    assert decision.decision == "NO-GO"
    assert decision.reasons == ["repeat 2: speedup over the baseline 1.4x [0.99, 1.8] is within noise, where GO "
                                "needs faster beyond noise (rect-384x256x320: within noise)"]


def test_a_slower_best_is_no_go():
    slower = Speedup(ratio=0.5, low=0.45, high=0.55, beyond_noise=False)
    decision = decide(good_checks(), [repeat(1, slower, only=slower)], ENV, ENV)
    assert decision.reasons == ["repeat 1: speedup over the baseline 0.5x [0.45, 0.55] is slower beyond noise, "
                                "where GO needs faster beyond noise (only: slower beyond noise)"]


def test_a_repeat_whose_timing_failed_is_no_go_with_its_reason():
    failed = RepeatResult(repeat=3, reasons=["the candidate failed its timing: unwritten_output [square-256]: 3"])
    decision = decide(good_checks(), good_repeats()[:2] + [failed], ENV, ENV)
    assert decision.reasons == ["repeat 3: no speedup measured: the candidate failed its timing: "
                                "unwritten_output [square-256]: 3"]


@pytest.mark.parametrize("field, value", [("gpu", "NVIDIA H100 80GB HBM3"), ("compute_capability", [8, 0]),
                                          ("driver_cuda_version", "12.8"), ("nvrtc", "13.5.1"),
                                          ("cuda_bindings", "13.5.0")])
def test_each_environment_field_that_differs_is_named(field, value):
    now = {**ENV, field: value}
    decision = decide(good_checks(), good_repeats(), ENV, now)
    assert decision.decision == "NO-GO"
    assert decision.reasons == [f"environment differs from the run's: {field}: run {ENV[field]!r}, now {value!r}"]


def test_several_environment_differences_are_named_field_by_field():
    now = {**ENV, "gpu": "other", "nvrtc": "13.5"}
    decision = decide(good_checks(), good_repeats(), ENV, now)
    assert [r.split(":")[1].strip() for r in decision.reasons] == ["gpu", "nvrtc"]


def test_a_missing_environment_fact_is_a_difference():
    now = {k: v for k, v in ENV.items() if k != "cuda_bindings"}
    assert [str(d) for d in environment_differences(ENV, now)] == ["cuda_bindings: run '13.3.1', now None"]


def test_clock_sandbox_and_event_overhead_do_not_decide():
    now = {**ENV, "sm_clock_khz": 1755000, "sandbox": {"confined": False, "landlock_abi": 7},
           "event_overhead_ms": 0.003, "compute_capability": (9, 0)}  # a tuple equals lock.json's list
    assert decide(good_checks(), good_repeats(), ENV, now).decision == "GO"
    assert [d.field for d in other_environment_differences(ENV, now)] == ["sandbox", "sm_clock_khz"]


def test_another_driver_build_of_the_same_cuda_version_is_reported_not_decisive():
    run, now = {**ENV, "driver": "580.159.04"}, {**ENV, "driver": "580.95.05"}
    assert decide(good_checks(), good_repeats(), run, now).decision == "GO"
    assert [str(d) for d in other_environment_differences(run, now)] == ["driver: run '580.159.04', now '580.95.05'"]


def test_peaks_read_from_the_cache_are_no_difference_but_other_peaks_are():
    measured = {"memory_gbps": 4250.1, "fp32_tflops": 51.2, "source": "measured", "measured_at": "2026-12-03T09:05"}
    cached = {**measured, "source": "cache"}
    assert other_environment_differences({**ENV, "peaks": measured}, {**ENV, "peaks": cached}) == []
    slower = {**cached, "memory_gbps": 3900.0}
    assert [d.field for d in other_environment_differences({**ENV, "peaks": measured}, {**ENV, "peaks": slower})] \
        == ["peaks"]


def test_every_failure_at_once_names_each_of_them():
    checks = good_checks()
    checks[0] = check("replay", "odd-31x37x29", passed=False, reasons=["race"])
    repeats = [repeat(1), repeat(2, NOISY, **{"square-256": NOISY})]
    decision = decide(checks, repeats, ENV, {**ENV, "gpu": "other"})
    assert decision.decision == "NO-GO"
    assert [r.split(" ")[0] for r in decision.reasons] == ["replay", "repeat", "environment"]
