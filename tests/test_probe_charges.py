"""Every probe and every compile is paid for (issue 20, item 3): a source given to any tool pays the compile rate
limit, a probe whose candidate does not compile still costs the probe (and a resumed run counts it), repeated case
names run once, and record_attempt's usage is bounded before any slot is claimed."""

from __future__ import annotations

import pytest

from server.lifecycle import resume_run
from tests.server_support import BROKEN, client, events, executor, kernel, new_run, ok, read_json, refused



PROBES = ("run_cases", "validate", "time_kernel")


@pytest.mark.anyio
async def test_a_candidate_that_does_not_compile_costs_its_probe_and_a_resumed_run_counts_it(tmp_path):
    run = new_run(tmp_path)
    async with client(run) as c:
        for number, tool in enumerate(PROBES, start=1):
            message = await refused(c, tool, source=BROKEN + f"// try {number}\n")
            assert message.startswith("candidate c") and "does not compile" in message, message
            assert "undefined_thing" in message
            assert f"{20 - number} left in this window" in message
            assert (await ok(c, "describe_task"))["budget"]["probes_left_in_window"] == 20 - number
    logged = [e["data"] for e in events(run.dir) if e["kind"] == "probe_done"]
    assert [(d["tool"], d["compiled"], d["gpu_seconds"]) for d in logged] == [(t, False, 0.0) for t in PROBES]
    run.close()

    resumed = resume_run(run.dir, executor())
    try:
        assert resumed.budget().probes_left_in_window == 17
    finally:
        resumed.close()


@pytest.mark.anyio
async def test_a_source_given_to_any_tool_pays_the_compile_rate_limit(tmp_path):
    run = new_run(tmp_path, compiles_per_minute=3)
    async with client(run) as c:
        known = (await ok(c, "compile_kernel", source=kernel("v1")))["candidate"]
        await refused(c, "run_cases", source=BROKEN)
        await ok(c, "validate", source=kernel("v2"))
        for tool in PROBES:
            message = await refused(c, tool, source=kernel("v3"))
            assert message.startswith("compile rate limit: 3 compiles per minute; try again in "), message
        message = await refused(c, "record_attempt", source=kernel("v3"), rationale="over the limit")
        assert message.startswith("compile rate limit"), message
        budget = (await ok(c, "describe_task"))["budget"]
        assert (budget["attempts_used"], budget["probes_left_in_window"]) == (0, 18)  # refused calls cost nothing
        # A known candidate compiles nothing new: not charged.
        assert (await ok(c, "run_cases", candidate_id=known, cases=["odd-31x37x29"]))["passed"] is True
    assert sorted(p.name for p in (run.dir / "attempts").iterdir()) == ["000.cu"]
    assert len([e for e in events(run.dir) if e["kind"] == "compiled"]) == 1 + 3  # the baseline's and three charged
    run.close()


@pytest.mark.anyio
async def test_a_request_the_compile_policy_refuses_compiles_nothing_and_is_not_charged(tmp_path):
    run = new_run(tmp_path, compiles_per_minute=1)
    async with client(run) as c:
        message = await refused(c, "compile_kernel", source=kernel(), options=["-I/etc"])
        assert "-I/etc" in message
        await ok(c, "compile_kernel", source=kernel())
        assert (await refused(c, "compile_kernel", source=kernel("v2"))).startswith("compile rate limit")
    run.close()


@pytest.mark.anyio
async def test_repeated_case_names_run_and_time_each_case_once(tmp_path):
    run = new_run(tmp_path)
    async with client(run) as c:
        candidate = (await ok(c, "compile_kernel", source=kernel("latency_us=50")))["candidate"]
        checked = await ok(c, "run_cases", candidate_id=candidate,
                           cases=["square-2048", "odd-31x37x29", "square-2048", "odd-31x37x29"])
        assert [row["case"] for row in checked["cases"]] == ["square-2048", "odd-31x37x29"]
        timed = await ok(c, "time_kernel", candidate_id=candidate, cases=["square-2048"] * 64)
        assert [row["case"] for row in timed["cases"]] == ["square-2048"]
        assert [row["stats"]["n"] for row in timed["cases"]] == [50]  # one probe timing, not 64
    run.close()


TOO_MUCH_USAGE = [
    ({"note": "x" * 20_000_000}, "an extra usage value must be a string of at most 200 characters"),
    ({"model": "m" * 201}, "at most 200 characters"),
    ({"trace": {"nested": [1, None]}}, "an extra usage value must be"),
    ({"calls": 10**16}, "less than or equal to 1000000000000000"),
    ({"cost_usd": 1e300}, "less than or equal to"),
    ({f"key{i}": i for i in range(17)}, "usage has 17 extra keys; at most 16 are kept"),
    ({"bad key": 1}, "usage key 'bad key': keys are 1 to 64 letters"),
    ({f"{'k' * 60}{i:04d}": "é" * 200 for i in range(16)}, "at most 4096 are kept"),
]


@pytest.mark.anyio
async def test_usage_is_bounded_and_refused_before_a_slot_is_claimed(tmp_path):
    run = new_run(tmp_path)
    async with client(run) as c:
        for usage, words in TOO_MUCH_USAGE:
            message = await refused(c, "record_attempt", source=kernel("latency_us=50"), rationale="r", usage=usage)
            assert "usage" in message and words in message, message
            assert len(message) < 2000
        assert (await ok(c, "describe_task"))["budget"]["attempts_used"] == 0
        assert sorted(p.name for p in (run.dir / "attempts").iterdir()) == ["000.cu"]
        assert not [e for e in events(run.dir) if e["kind"] == "attempt_started" and e["data"]["attempt"] > 0]

        usage = {"model": "m", "calls": 3, "cache_read_tokens": 1200, "agent": "é" * 200, "cached": True}
        answer = await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="r", usage=usage)
        assert answer["attempt"] == 1
    assert read_json(run.dir / "history.json")["attempts"][1]["usage"] == usage
    run.close()
