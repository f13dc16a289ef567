"""The audit service in a subprocess with the fake executor, driven as agents drive it: many agents on their own runs
at once through the runs' streamable HTTP MCP endpoints, and the service killed (kill -9) in the middle of an
attempt, then started again on the same folder."""

from __future__ import annotations

import http.client
import json
import time

import anyio
import pytest

from server.run import RunSettings
from server.transport import KEEP_ALIVE_S
from server.verify import verify_run
from tests.server_support import free_port, kernel
from tests.service_support import ServiceProcess, agent, described, until_prepared

AGENTS = 20
ATTEMPTS = 2  # recorded by each agent, of a budget of 3
PROBES = 3    # spent by the probing run of the kill test
PROBES_PER_WINDOW = RunSettings().probes_per_window



async def _play(created: dict, index: int, seen: dict) -> None:
    """One agent: its run's task, then ATTEMPTS attempts marked with its index, then its budget as the run says."""
    async with agent(created["mcp_url"], created["agent_token"]) as client:
        await until_prepared(client, 240.0)
        for attempt in range(ATTEMPTS):
            source = kernel(f"latency_us={40 + index % 7}", f"agent-{index}-attempt-{attempt}")
            answer = await client.call_tool("record_attempt", {"source": source, "rationale": f"agent {index}"})
            assert not answer.is_error, answer.content[0].text
            assert json.loads(answer.content[0].text)["attempt"] == attempt + 1
        seen[index] = (await described(client))["budget"]


@pytest.mark.timeout(600)
def test_twenty_agents_on_twenty_runs_at_once(tmp_path):
    service = ServiceProcess(tmp_path / "service", free_port(), gpus=AGENTS).start()
    try:
        runs = [service.create_run(max_attempts=3) for _ in range(AGENTS)]
        seen: dict[int, dict] = {}
        started = time.monotonic()

        async def everyone() -> None:
            async with anyio.create_task_group() as group:
                for index, created in enumerate(runs):
                    group.start_soon(_play, created, index, seen)

        anyio.run(everyone)
        played_s = time.monotonic() - started
    finally:
        service.stop()
    assert sorted(seen) == list(range(AGENTS))
    for index, created in enumerate(runs):
        budget = seen[index]
        assert (budget["attempts_used"], budget["attempts_left"]) == (ATTEMPTS, 3 - ATTEMPTS), budget
        run_dir = next((service.root / "runs" / created["run"]["id"] / "results").glob("run-*"))
        attempts = sorted((run_dir / "attempts").glob("[0-9][0-9][0-9].cu"))
        marks = [p.read_text().rsplit("fake: ", 1)[1].strip() for p in attempts if p.name != "000.cu"]
        assert marks == [f"agent-{index}-attempt-{a}" for a in range(ATTEMPTS)]  # its own kernels, no other's
        report = verify_run(run_dir)
        assert report.ok, report.problems
    assert played_s < 400, played_s


async def _probe(created: dict, probes: int) -> None:
    """`probes` probes (run_cases) spent on the run, no attempt."""
    async with agent(created["mcp_url"], created["agent_token"]) as client:
        await until_prepared(client, 240.0)
        for _ in range(probes):
            answer = await client.call_tool("run_cases", {"source": kernel("latency_us=45", "probed")})
            assert not answer.is_error, answer.content[0].text


async def _budget(created: dict) -> dict:
    async with agent(created["mcp_url"], created["agent_token"]) as client:
        return (await until_prepared(client, 240.0))["budget"]


@pytest.mark.timeout(600)
def test_a_service_killed_mid_attempt_resumes_every_run_with_its_budget_and_place(tmp_path):
    """Two GPUs: the first run killed mid-attempt, the second after spending probes, two more queued behind."""
    root, port = tmp_path / "service", free_port()
    service = ServiceProcess(root, port, gpus=2).start()
    try:
        first, second, third, fourth = (service.create_run(max_attempts=3) for _ in range(4))
        for running in (first, second):
            service.wait_state(running["run"]["id"], ("running",))
        anyio.run(_probe, second, PROBES)
        assert anyio.run(_budget, second)["probes_left_in_window"] == PROBES_PER_WINDOW - PROBES

        async def attempt_then_kill() -> None:
            async with agent(first["mcp_url"], first["agent_token"]) as client:
                await until_prepared(client, 240.0)
                answer = await client.call_tool("record_attempt", {"source": kernel("latency_us=40", "kept"),
                                                                   "rationale": "the first"})
                assert not answer.is_error, answer.content[0].text
                async with anyio.create_task_group() as group:
                    async def slow() -> None:
                        await client.call_tool("record_attempt", {"source": kernel("slow_s=30", "cut"),
                                                                  "rationale": "cut short"})
                    group.start_soon(slow)
                    await anyio.sleep(2.0)  # the attempt's slot is claimed and its timing under way
                    service.kill9()
                    group.cancel_scope.cancel()

        try:
            anyio.run(attempt_then_kill)
        except BaseException:  # noqa: BLE001 - the client's connection dies with the service
            pass
        assert service.proc.returncode == -9
        service.start()
        views = [service.wait_state(r["run"]["id"], ("running",)) for r in (first, second)]
        assert all(v["run"]["gpu_uuid"] is not None for v in views)
        assert views[0]["run"]["gpu_uuid"] != views[1]["run"]["gpu_uuid"]
        places = [service.wait_state(r["run"]["id"], ("queued",)) for r in (third, fourth)]
        assert [p["queue_position"] for p in places] == [1, 2]
        budget = anyio.run(_budget, first)
        # the attempt cut short counts once, as interrupted: nothing lost, nothing given back
        assert (budget["attempts_used"], budget["attempts_left"]) == (2, 1), budget
        budget = anyio.run(_budget, second)
        # the probes spent before the kill still count in their window
        assert (budget["attempts_used"], budget["probes_left_in_window"]) == (0, PROBES_PER_WINDOW - PROBES), budget
    finally:
        service.stop()
    events = (next((root / "runs" / first["run"]["id"] / "results").glob("run-*")) / "events.jsonl").read_text()
    assert "attempt_interrupted" in events
    run_dirs = sorted(root.glob("runs/*/results/run-*"))
    # every run folder verifies; the queued runs spent nothing and have none
    assert {d.parents[1].name for d in run_dirs} == {first["run"]["id"], second["run"]["id"]}
    for run_dir in run_dirs:
        report = verify_run(run_dir)
        assert report.ok, (run_dir, report.problems)


def test_an_idle_connection_outlives_the_clients_own_keep_alive(tmp_path):
    """The service keeps an idle connection open longer than clients keep theirs (server/transport.py
    KEEP_ALIVE_S): a client's next request on a connection idle for 6 s is answered, not lost to a close racing it."""
    service = ServiceProcess(tmp_path / "service", free_port()).start()
    try:
        connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=30)
        connection.request("GET", "/api/openapi.json")
        first = connection.getresponse()
        assert first.status == 200 and first.read()
        time.sleep(6.0)  # past uvicorn's default keep-alive (5 s) and httpx's own (5 s)
        connection.request("GET", "/api/openapi.json")
        again = connection.getresponse()  # on the same socket: raises RemoteDisconnected where the server closed it
        assert again.status == 200 and again.read()
        connection.close()
    finally:
        service.stop()
    assert KEEP_ALIVE_S > 6
