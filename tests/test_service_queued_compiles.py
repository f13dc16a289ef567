"""A run queued for a GPU in the audit service (a subprocess with the fake executor, one GPU held by the first run):
its agent compiles with the real NVRTC while it waits, its GPU tools are refused with its queue place and nothing
spent, and once it has its GPU the candidates compiled meanwhile are the run's, its budget exact, its folder
verified."""

from __future__ import annotations

import json

import anyio
import pytest

from server.verify import verify_run
from tests.server_support import free_port, kernel
from tests.service_support import ServiceProcess, agent, described, until_prepared

BROKEN = kernel("broken") + "\n__global__ void matmul_f32(int oops) { undeclared_name = 1; }\n"


async def _answer(client, tool: str, **arguments) -> tuple[bool, dict | str]:
    result = await client.call_tool(tool, arguments)
    return result.is_error, (result.content[0].text if result.is_error else json.loads(result.content[0].text))


async def _while_queued(created: dict) -> dict:
    """The queued run's agent: two compiles answered, the GPU tools refused; what it saw."""
    async with agent(created["mcp_url"], created["agent_token"]) as client:
        before = await described(client)
        assert before["preparation"]["state"] == "queued", before["preparation"]
        failed, broken = await _answer(client, "compile_kernel", source=BROKEN)
        assert not failed, broken
        assert broken["ok"] is False and "undeclared_name" in broken["log"], broken
        failed, good = await _answer(client, "compile_kernel", source=kernel("latency_us=40", "queued"))
        assert not failed, good
        assert good["ok"] is True and good["arch"] == "sm_90" and good["resources"]["registers"] > 0, good
        log = await client.read_resource(good["log_resource"])
        assert log.contents[0].text is not None
        refusals = {}
        for tool, arguments in (("record_attempt", {"candidate_id": good["candidate"], "rationale": "too early"}),
                                ("time_kernel", {"candidate_id": good["candidate"]}),
                                ("run_cases", {"candidate_id": good["candidate"]})):
            failed, refusals[tool] = await _answer(client, tool, **arguments)
            assert failed, refusals[tool]
            assert "queued for a GPU: position 1 of 1" in refusals[tool] and "nothing was spent" in refusals[tool]
        after = await described(client)
        assert after["budget"] == before["budget"], (before["budget"], after["budget"])  # nothing spent
        return {"good": good, "budget": before["budget"]}


async def _finish(created: dict) -> None:
    async with agent(created["mcp_url"], created["agent_token"]) as client:
        await until_prepared(client)
        failed, answer = await _answer(client, "finish", reason="makes way for the queued run")
        assert not failed, answer


async def _once_admitted(created: dict, good: dict) -> dict:
    """The same compile answers the same from the cache; the id compiled while queued serves the GPU tools."""
    async with agent(created["mcp_url"], created["agent_token"]) as client:
        await until_prepared(client)
        failed, again = await _answer(client, "compile_kernel", source=kernel("latency_us=40", "queued"))
        assert not failed, again
        assert again["cache_hit"] is True, again
        same = ("candidate", "ok", "arch", "log", "resources", "mix", "rejected")
        assert {k: again[k] for k in same} == {k: good[k] for k in same}
        failed, checked = await _answer(client, "run_cases", candidate_id=good["candidate"])
        assert not failed and checked["passed"], checked
        failed, attempt = await _answer(client, "record_attempt", candidate_id=good["candidate"], rationale="ok")
        assert not failed and attempt["attempt"] == 1, attempt
        return (await described(client))["budget"]


@pytest.mark.timeout(300)
def test_a_queued_run_compiles_while_it_waits_and_spends_nothing(tmp_path):
    root = tmp_path / "service"
    service = ServiceProcess(root, free_port(), gpus=1).start()
    try:
        first, second = service.create_run(max_attempts=3), service.create_run(max_attempts=3)
        service.wait_state(first["run"]["id"], ("running",))
        assert service.wait_state(second["run"]["id"], ("queued",))["queue_position"] == 1
        seen = anyio.run(_while_queued, second)
        assert not list((root / "runs" / second["run"]["id"] / "results").glob("run-*"))  # no run folder yet
        anyio.run(_finish, first)
        service.wait_state(second["run"]["id"], ("running",))
        budget = anyio.run(_once_admitted, second, seen["good"])
    finally:
        service.stop()
    assert seen["budget"]["attempts_used"] == 0
    assert (budget["attempts_used"], budget["attempts_left"]) == (1, 2), budget
    assert budget["probes_left_in_window"] == seen["budget"]["probes_left_in_window"], budget  # the probe, then reset
    run_dir = next((root / "runs" / second["run"]["id"] / "results").glob("run-*"))
    report = verify_run(run_dir)
    assert report.ok, report.problems
    cid = seen["good"]["candidate"]
    assert (run_dir / "candidates" / f"{cid}.json").is_file() and (run_dir / "compile-logs" / f"{cid}.log").is_file()
    kinds = [json.loads(line)["kind"] for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert kinds[0] == "run_created"


async def _compile_queued(created: dict) -> dict:
    async with agent(created["mcp_url"], created["agent_token"]) as client:
        assert (await described(client))["preparation"]["state"] == "queued"
        failed, good = await _answer(client, "compile_kernel", source=kernel("latency_us=40", "kept"))
        assert not failed and good["ok"] is True, good
        return good


async def _log_while_queued(created: dict, uri: str) -> str:
    async with agent(created["mcp_url"], created["agent_token"]) as client:
        assert (await described(client))["preparation"]["state"] == "queued"
        return (await client.read_resource(uri)).contents[0].text


async def _uses_without_compiling(created: dict, cid: str) -> dict:
    """The candidate compiled before the kill serves the GPU tools by its id, with no compile_kernel since."""
    async with agent(created["mcp_url"], created["agent_token"]) as client:
        await until_prepared(client)
        failed, attempt = await _answer(client, "record_attempt", candidate_id=cid, rationale="compiled while queued")
        assert not failed and attempt["attempt"] == 1, attempt
        return (await described(client))["budget"]


@pytest.mark.timeout(300)
def test_a_compile_answered_while_queued_outlives_a_kill_of_the_service(tmp_path):
    root = tmp_path / "service"
    port = free_port()
    service = ServiceProcess(root, port, gpus=1).start()
    try:
        first, second = service.create_run(max_attempts=3), service.create_run(max_attempts=3)
        service.wait_state(first["run"]["id"], ("running",))
        service.wait_state(second["run"]["id"], ("queued",))
        good = anyio.run(_compile_queued, second)
        journal = root / "runs" / second["run"]["id"] / "queued-compiles.jsonl"
        assert journal.is_file()
        service.kill9()
        service = ServiceProcess(root, port, gpus=1).start()
        service.wait_state(second["run"]["id"], ("queued",))
        log = anyio.run(_log_while_queued, second, good["log_resource"])  # its compile log, before any compile
        assert log is not None and good["log"] in log, (log, good["log"])
        anyio.run(_finish, first)
        service.wait_state(second["run"]["id"], ("running",))
        budget = anyio.run(_uses_without_compiling, second, good["candidate"])
    finally:
        service.stop()
    assert (budget["attempts_used"], budget["attempts_left"]) == (1, 2), budget
    assert not journal.exists()  # the run folder holds the candidate now
    run_dir = next((root / "runs" / second["run"]["id"] / "results").glob("run-*"))
    assert verify_run(run_dir).ok
    assert (run_dir / "candidates" / f"{good['candidate']}.json").is_file()
