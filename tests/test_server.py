"""The MCP server over a real Run, with the fake executor standing in for the GPU (real NVRTC compiles)."""

from __future__ import annotations

import json
import stat

import pytest

from server.verify import verify_run
from tests.server_support import (BROKEN, HOLDOUT, INITIAL, VISIBLE, client, events, kernel, new_run, ok,
                                  read_json, refused)




def test_a_new_run_folder_holds_every_record(run):
    d = run.dir
    assert d.name == "run-001"
    for name in ("run.json", "lock.json", "events.jsonl", "history.json", "summary.json", "best.cu"):
        assert (d / name).is_file(), name
    assert sorted(p.name for p in (d / "task").iterdir()) == ["initial.cu", "oracle.py", "reference.cu", "task.toml"]
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o222 == 0 for p in [d / "task", *(d / "task").rglob("*")])
    for case in VISIBLE + [HOLDOUT]:
        assert sorted(p.as_posix() for p in (d / "expected" / case).rglob("*.npy")) == \
            [(d / "expected" / case / str(s) / "c.npy").as_posix() for s in range(4)]
    history = read_json(d / "history.json")["attempts"]
    assert [(e["attempt"], e["verdict"]) for e in history] == [(0, "baseline")]
    assert sorted(p.name for p in (d / "attempts").iterdir()) == ["000.cu"]
    assert (d / "attempts" / "000.cu").read_text() == INITIAL == (d / "best.cu").read_text()
    replays = [read_json(d / f"best-case-{i}.json") for i in range(3)]
    assert not (d / "best-case-3.json").exists()
    assert [(r["case"], r["attempt"], r["kernel"]) for r in replays] == [(c, 0, "best.cu") for c in VISIBLE]
    summary = read_json(d / "summary.json")
    assert (summary["status"], summary["best_attempt"], summary["budget"]) == \
        ("running", 0, {"max_attempts": 7, "used": 0, "left": 7})
    *_, head, last = events(d)  # the summary names the record before its own file_written record
    assert summary["chain_head"] == head["hash"] and last["data"]["path"] == "summary.json"
    assert read_json(d / "lock.json")["environment"]["gpu"] == "Fake GPU"
    report = verify_run(d)
    assert report.ok, report.problems


@pytest.mark.anyio
async def test_describe_task_shows_visible_cases_budget_and_baseline_never_the_holdout(run):
    async with client(run) as c:
        result = await c.call_tool("describe_task", {})
    assert not result.is_error
    answer = result.structured_content
    assert [case["name"] for case in answer["cases"]] == VISIBLE
    assert HOLDOUT not in result.content[0].text and "holdout" not in json.dumps(answer["cases"])
    assert {"m": 97, "n": 83, "k": 61} not in [case["dims"] for case in answer["cases"]]
    assert answer["budget"] == {"max_attempts": 7, "attempts_used": 0, "attempts_left": 7,
                                "probes_left_in_window": 20, "probe_gpu_seconds_left_in_window": 120.0,
                                "finished": False, "stop_reason": None}
    latencies = {case["name"]: case["baseline_median_ms"] for case in answer["cases"]}
    assert latencies["odd-31x37x29"] is None  # a correctness case is not timed
    assert latencies["square-2048"] == pytest.approx(0.1, rel=0.01)
    assert latencies["rect-2000x1500x1000"] == pytest.approx(0.1, rel=0.01)
    assert answer["baseline_score_ms"] == pytest.approx(0.1, rel=0.01)
    assert (answer["best_attempt"], answer["device"]["gpu"]) == (0, "Fake GPU")


@pytest.mark.anyio
async def test_the_budget_runs_out_after_seven_attempts(run):
    async with client(run) as c:
        answers = [await ok(c, "record_attempt", source=kernel(f"latency_us={100 - i}"), rationale=f"try {i}")
                   for i in range(1, 8)]
        assert [a["attempt"] for a in answers] == [1, 2, 3, 4, 5, 6, 7]
        assert [a["budget"]["attempts_left"] for a in answers] == [6, 5, 4, 3, 2, 1, 0]
        assert [a["holdout"] is None for a in answers] == [True] * 6 + [False]
        last = answers[-1]
        assert last["holdout"]["passed"] is True and last["holdout"]["cases"] == [HOLDOUT]
        assert last["budget"]["finished"] is True and last["budget"]["stop_reason"] == "budget exhausted"
        summary = read_json(run.dir / "summary.json")
        assert (summary["status"], summary["stop_reason"]) == ("finished", "budget exhausted")
        assert summary["budget"] == {"max_attempts": 7, "used": 7, "left": 0}

        message = await refused(c, "record_attempt", source=kernel("latency_us=10"), rationale="one more")
        assert message.startswith("the run is finished (budget exhausted)") and "referee://summary.json" in message
        for tool in ("validate", "run_cases", "time_kernel"):
            assert (await refused(c, tool, source=kernel())).startswith("the run is finished")
        assert (await ok(c, "describe_task"))["budget"]["attempts_left"] == 0
    assert sorted(p.name for p in (run.dir / "attempts").glob("*.cu")) == [f"{n:03d}.cu" for n in range(8)]
    assert len(read_json(run.dir / "history.json")["attempts"]) == 8
    assert verify_run(run.dir).ok


@pytest.mark.anyio
async def test_verdicts(run):
    async with client(run) as c:
        faster = await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="half the time")
        assert (faster["attempt"], faster["verdict"], faster["best_attempt"]) == (1, "valid-faster", 1)
        assert faster["speedup_vs_baseline"]["ratio"] == pytest.approx(2.0, rel=0.02)
        assert faster["speedup_vs_baseline"]["beyond_noise"] is True
        # the record says how it was timed: fresh inputs, audited launches summed over the interleaved rounds
        assert all(row["inputs"] == "fresh" and row["audited_launches"] == 3 * run.settings.timing_rounds
                   for row in faster["cases"])
        row = read_json(run.dir / "history.json")["attempts"][1]["timing"]["square-2048"]
        assert (row["inputs"], row["audited_launches"]) == ("fresh", 3 * run.settings.timing_rounds)
        assert (run.dir / "best.cu").read_text() == kernel("latency_us=50")
        assert [read_json(run.dir / f"best-case-{i}.json")["attempt"] for i in range(3)] == [1, 1, 1]

        same = await ok(c, "record_attempt", source=kernel("latency_us=50", "note: same"), rationale="no change")
        assert (same["verdict"], same["best_attempt"]) == ("valid-not-faster", 1)
        slower = await ok(c, "record_attempt", source=kernel("latency_us=100"), rationale="the baseline's speed")
        assert (slower["verdict"], slower["best_attempt"], slower["reasons"]) == ("valid-not-faster", 1, [])

        wrong = await ok(c, "record_attempt", source=kernel("wrong"), rationale="wrong")
        assert wrong["verdict"] == "rejected"
        assert {r["code"] for r in wrong["reasons"]} == {"mismatch"}
        assert [r["case"] for r in wrong["reasons"]] == VISIBLE

        fresh = kernel("wrong-fresh")
        assert (await ok(c, "validate", source=fresh))["passed"] is True
        caught = await ok(c, "record_attempt", source=fresh, rationale="passes the visible inputs")
        assert caught["verdict"] == "rejected" and caught["reasons"]
        assert all(r["code"] == "mismatch" and r["detail"].startswith("fresh inputs:") for r in caught["reasons"])

        unwritten = await ok(c, "record_attempt", source=kernel("unwritten"), rationale="skips work")
        assert unwritten["verdict"] == "rejected"
        assert {r["code"] for r in unwritten["reasons"]} == {"unwritten_output"}

        broken = await ok(c, "record_attempt", source=BROKEN, rationale="does not compile")
        assert (broken["attempt"], broken["verdict"]) == (7, "rejected")
        assert broken["reasons"][0]["code"] == "compile_error" and "undefined_thing" in broken["reasons"][0]["detail"]
        assert broken["budget"]["attempts_used"] == 7
    history = read_json(run.dir / "history.json")["attempts"]
    assert [e["verdict"] for e in history] == ["baseline", "valid-faster", "valid-not-faster", "valid-not-faster",
                                               "rejected", "rejected", "rejected", "rejected"]
    summary = read_json(run.dir / "summary.json")
    assert summary["rejections_by_reason"] == {"mismatch": 2, "unwritten_output": 1, "compile_error": 1}
    assert summary["best_attempt"] == 1 and summary["holdout"]["attempt"] == 1
    assert (run.dir / "best.cu").read_text() == kernel("latency_us=50")
    assert verify_run(run.dir).ok


@pytest.mark.anyio
async def test_a_best_failing_the_holdout_is_disqualified_for_the_next_valid_attempt(run):
    async with client(run) as c:
        cheat = await ok(c, "record_attempt", source=kernel("latency_us=40", "wrong-holdout"), rationale="fast")
        assert (cheat["verdict"], cheat["best_attempt"]) == ("valid-faster", 1)
        honest = await ok(c, "record_attempt", source=kernel("latency_us=70"), rationale="honest")
        assert (honest["verdict"], honest["best_attempt"]) == ("valid-not-faster", 1)
        await ok(c, "record_attempt", source=kernel("latency_us=90"), rationale="slower still")
        done = await ok(c, "finish", reason="done")
    assert done["stop_reason"] == "agent finished: done"
    assert (done["best_attempt"], done["disqualified"]) == (2, [1])
    assert done["holdout"]["attempt"] == 2 and done["holdout"]["passed"] is True
    summary = read_json(run.dir / "summary.json")
    assert (summary["status"], summary["best_attempt"], summary["disqualified"]) == ("finished", 2, [1])
    assert summary["holdout"]["attempt"] == 2 and summary["holdout"]["cases"] == [HOLDOUT]
    assert (run.dir / "best.cu").read_text() == kernel("latency_us=70")
    assert [read_json(run.dir / f"best-case-{i}.json")["attempt"] for i in range(3)] == [2, 2, 2]
    assert [e["data"]["attempt"] for e in events(run.dir) if e["kind"] == "disqualified"] == [1]
    assert verify_run(run.dir).ok


@pytest.mark.anyio
async def test_the_baseline_is_the_best_when_every_faster_attempt_fails_the_holdout(run):
    async with client(run) as c:
        await ok(c, "record_attempt", source=kernel("latency_us=40", "wrong-holdout"), rationale="fast")
        await ok(c, "record_attempt", source=kernel("latency_us=45", "wrong-holdout", "v2"), rationale="fast")
        done = await ok(c, "finish", reason="done")
        assert (done["best_attempt"], done["disqualified"]) == (0, [1, 2])
        assert (await refused(c, "validate", source=kernel())).startswith("the run is finished (agent finished: done)")
    summary = read_json(run.dir / "summary.json")
    assert (summary["best_attempt"], summary["disqualified"], summary["holdout"]["attempt"]) == (0, [1, 2], 0)
    assert (run.dir / "best.cu").read_text() == INITIAL


@pytest.mark.anyio
async def test_time_kernel_refuses_an_invalid_candidate(run):
    async with client(run) as c:
        message = await refused(c, "time_kernel", source=kernel("wrong"))
        assert message.startswith("not timed: candidate c") and "fails validation" in message
        assert "mismatch [odd-31x37x29]" in message and "validate or run_cases" in message
        timed = await ok(c, "time_kernel", source=kernel("latency_us=50"))
        assert [row["case"] for row in timed["cases"]] == ["square-2048", "rect-2000x1500x1000"]
        assert timed["speedup_vs_baseline"]["ratio"] == pytest.approx(2.0, rel=0.02)
        assert all(row["inputs"] == "fresh" and row["audited_launches"] == 3 for row in timed["cases"])
        assert timed["budget"]["probes_left_in_window"] == 18  # the refused timing was a probe too
        assert timed["budget"]["attempts_used"] == 0


@pytest.mark.anyio
async def test_resources_and_prompt(run):
    async with client(run) as c:
        summary = json.loads((await c.read_resource("referee://summary.json")).contents[0].text)
        assert summary == read_json(run.dir / "summary.json") and summary["best_attempt"] == 0
        history = json.loads((await c.read_resource("referee://history.json")).contents[0].text)
        assert [e["attempt"] for e in history["attempts"]] == [0]
        assert (await c.read_resource("referee://best.cu")).contents[0].text == INITIAL

        manifest = (await c.read_resource("referee://task")).contents[0].text
        assert json.loads(manifest)["name"] == "matmul_f32" and "square-2048" in manifest and HOLDOUT not in manifest

        compiled = await ok(c, "compile_kernel", source=BROKEN)
        assert compiled["ok"] is False and compiled["log_resource"] == f"referee://compile-logs/{compiled['candidate']}"
        log = (await c.read_resource(compiled["log_resource"])).contents[0].text
        assert "undefined_thing" in log
        assert log == (run.dir / "compile-logs" / f"{compiled['candidate']}.log").read_text()

        first = await ok(c, "compile_kernel", source=kernel("v1"))
        relaunched = await ok(c, "compile_kernel", source=kernel("v1"), launch={"grid": [4, 4], "block": [16, 16]})
        assert relaunched["candidate"] != first["candidate"] and relaunched["cache_hit"] is True
        assert (await c.read_resource(relaunched["log_resource"])).contents[0].text == \
            (await c.read_resource(first["log_resource"])).contents[0].text

        for uri in ("referee://compile-logs/not-an-id", "referee://compile-logs/c0123456789abcde"):
            with pytest.raises(Exception, match="candidate ids look like|does not exist"):
                await c.read_resource(uri)

        prompts = await c.list_prompts()
        assert [p.name for p in prompts.prompts] == ["optimize_kernel"]
        prompt = await c.get_prompt("optimize_kernel")
        assert "describe_task" in prompt.messages[0].content.text and "record_attempt" in prompt.messages[0].content.text
        tools = await c.list_tools()
        assert sorted(t.name for t in tools.tools) == ["compile_kernel", "describe_task", "finish", "profile_kernel",
                                                       "record_attempt", "run_cases", "time_kernel", "validate"]


@pytest.mark.anyio
async def test_a_result_too_good_to_be_true_is_flagged_and_reverified(tmp_path):
    # A 1 ms baseline: 50 us is 20x faster, yet physically possible (beyond the limit is refused instead:
    # tests/test_physical_limit.py).
    run = new_run(tmp_path, {"default_latency_us": 1000})
    async with client(run) as c:
        answer = await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="fast")
    assert answer["verdict"] == "valid-faster"
    entry = run.history[-1]
    assert entry.flags and "more than 10x" in entry.flags[0]
    assert entry.reverification["passed"] is True
    assert set(entry.reverification["seeds"]) == {c.name for c in run.task.visible_cases}
    assert run.executor.aborted == 1  # timed again in a fresh worker
    assert [e["data"]["reverified"] for e in events(run.dir) if e["kind"] == "flagged"] == [True]


@pytest.mark.anyio
async def test_a_flagged_result_that_fails_reverification_is_rejected(tmp_path):
    run = new_run(tmp_path, {"default_latency_us": 1000})
    source = kernel("latency_us=50", "unwritten-on-retime")
    async with client(run) as c:
        answer = await ok(c, "record_attempt", source=source, rationale="fast")
    assert answer["verdict"] == "rejected"
    assert answer["reasons"][0]["detail"].startswith("re-verification:")
