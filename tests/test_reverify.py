"""A flagged result counts only if its second timing, in a fresh worker, agrees with the first: the two medians'
intervals meet in every case, within what two honest jobs differ by (server/suspicion.py reverify,
RETIMING_TOLERANCE), through the real record_attempt with the fake executor."""

from __future__ import annotations

import re

import pytest

from harness.results import ReasonCode
from harness.stats import summarize
from server.records import StatsRecord
from server.suspicion import retiming_disagreements
from tests.server_support import client, events, kernel, new_run, ok


@pytest.mark.anyio
async def test_a_flagged_result_timed_again_much_slower_is_rejected_naming_both_medians(tmp_path):
    run = new_run(tmp_path, {"default_latency_us": 1000})  # 50 us is 20x faster: flagged, re-verified
    async with client(run) as c:
        answer = await ok(c, "record_attempt", source=kernel("latency_us=50", "retime_latency_us=80"),
                          rationale="fast the first time")
    assert answer["verdict"] == "rejected"
    assert {r["code"] for r in answer["reasons"]} == {"retiming_disagrees"}
    assert {r["case"] for r in answer["reasons"]} == {c.name for c in run.task.performance_cases}
    detail = answer["reasons"][0]["detail"]
    medians = [float(m) for m in re.findall(r"([0-9.]+) us", detail)]
    assert detail.startswith("re-verification: ") and medians == pytest.approx([80.0, 50.0], rel=0.01), detail
    entry = run.history[-1]
    assert entry.reverification["passed"] is False and run.executor.aborted == 1
    assert all(m == pytest.approx(0.080, rel=0.01) for m in entry.reverification["medians_ms"].values())
    assert [e["data"]["reverified"] for e in events(run.dir) if e["kind"] == "flagged"] == [False]
    assert answer["best_attempt"] == 0


@pytest.mark.anyio
@pytest.mark.parametrize("again_us", [50.1, 53.0])
async def test_a_flagged_result_timed_again_within_what_two_jobs_differ_by_counts(tmp_path, again_us):
    run = new_run(tmp_path, {"default_latency_us": 1000})
    async with client(run) as c:  # 0.2% and 6% slower the second time: apart, but within what two jobs differ by
        answer = await ok(c, "record_attempt", source=kernel("latency_us=50", f"retime_latency_us={again_us}"),
                          rationale="fast both times")
    assert answer["verdict"] == "valid-faster", answer["reasons"]
    assert run.history[-1].reverification["passed"] is True and answer["best_attempt"] == 1


def test_an_honest_kernel_timed_again_as_on_an_h100_agrees():
    """softmax_f32's initial kernel, re-verified on an H100 (2026-12-07): 48.13 us [47.94, 48.29], then 49.73 us
    [49.34, 50.02] in a fresh worker, 3.3% apart. A 12% move does not agree."""
    first = {"square-4096": StatsRecord(median_ms=0.04813, ci_low_ms=0.04794, ci_high_ms=0.04829, mean_ms=0.04813,
                                        n=40)}
    assert retiming_disagreements(first, {"square-4096": summarize([0.04934, 0.04973, 0.05002] * 20)}) == []
    [reason] = retiming_disagreements(first, {"square-4096": summarize([0.0537, 0.0539, 0.0541] * 20)})
    assert "more than 10% apart" in reason.detail and "53.90 us" in reason.detail and "48.13 us" in reason.detail


def test_slow_launches_that_widen_the_first_interval_buy_no_slack():
    """The medians are compared, not the intervals: a first timing whose slow launches put its interval's upper
    end 20% above its fast median does not let a re-timing 15% slower agree."""
    first = {"c": StatsRecord(median_ms=1.0, ci_low_ms=0.99, ci_high_ms=1.2, mean_ms=1.1, n=100)}
    [reason] = retiming_disagreements(first, {"c": summarize([1.149, 1.15, 1.151] * 20)})
    assert reason.code is ReasonCode.RETIMING_DISAGREES
    assert retiming_disagreements(first, {"c": summarize([1.079, 1.08, 1.081] * 20)}) == []
