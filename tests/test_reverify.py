"""A flagged result counts only if its second timing, in a fresh worker, agrees with the first: the two medians'
intervals overlap in every case, within the noise floor (server/suspicion.py reverify), through the real
record_attempt with the fake executor."""

from __future__ import annotations

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
    assert detail.startswith("re-verification: ") and "80.0" in detail and "50.0" in detail, detail
    entry = run.history[-1]
    assert entry.reverification["passed"] is False and run.executor.aborted == 1
    assert all(m == pytest.approx(0.080, rel=0.01) for m in entry.reverification["medians_ms"].values())
    assert [e["data"]["reverified"] for e in events(run.dir) if e["kind"] == "flagged"] == [False]
    assert answer["best_attempt"] == 0


@pytest.mark.anyio
async def test_a_flagged_result_timed_again_within_the_noise_floor_counts(tmp_path):
    run = new_run(tmp_path, {"default_latency_us": 1000})
    async with client(run) as c:  # 0.2% slower the second time: apart, but within what two jobs differ by
        answer = await ok(c, "record_attempt", source=kernel("latency_us=50", "retime_latency_us=50.1"),
                          rationale="fast both times")
    assert answer["verdict"] == "valid-faster", answer["reasons"]
    assert run.history[-1].reverification["passed"] is True and answer["best_attempt"] == 1


def record(samples) -> StatsRecord:
    return StatsRecord.model_validate(summarize(samples).model_dump())


def test_every_case_must_be_timed_again_and_agree():
    first = {"a": record([1.0, 1.001, 0.999] * 20), "b": record([2.0, 2.002, 1.998] * 20)}
    again = {"a": summarize([1.0, 1.001, 0.999] * 20), "b": summarize([1.5, 1.5015, 1.4985] * 20)}
    [reason] = retiming_disagreements(first, again)
    assert reason.code is ReasonCode.RETIMING_DISAGREES and reason.case == "b"
    assert "at a median of 1500.00 us" in reason.detail and "against 2000.00 us" in reason.detail
    [missing] = retiming_disagreements(first, {"a": again["a"]})
    assert missing.case == "b" and "was not timed again" in missing.detail
    assert retiming_disagreements(first, {"a": again["a"], "b": summarize([2.0, 2.002, 1.998] * 20)}) == []
