"""`kernel-referee service --ray` killed with kill -9 and started again: each running run's new actor goes back to the
node and the stand-in GPU its run began on (not to the one Ray or the claims' order would hand it first), its budget
exact and its folder verifying; one whose GPU another process took meanwhile waits, the holder named, until it is
let go; a run whose node left the cluster is failed with that cause, said once in the log.

A local cluster of two nodes (a head of two stand-in GPUs and a second node of one, both on this host), built once for
the module: Ray's start is slow here."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import httpx2
import pytest

from harness.gpu_lease import ServingClaim
from server.lock import read_lock
from server.verify import verify_run
from service.core import WAITING_RETRY_S
from tests.fake_ray_service import FAKE_GPU
from tests.server_support import free_port, kernel
from tests.service_support import agent, until_prepared
from tests.test_service_ray import RayServiceProcess, _gone, _until

ray = pytest.importorskip("ray", reason="Ray is the optional extra kernel-referee[fleet]: not installed here")
cluster_utils = pytest.importorskip("ray.cluster_utils")

pytestmark = pytest.mark.timeout(400)


@pytest.fixture(scope="module")
def nodes():
    """(the cluster, its second node): three stand-in GPUs in all, the second node's one removable."""
    # The object store refuses new objects once the disk is 95% full (Ray's default), which a shared test machine
    # often is; these tests store only small messages.
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {FAKE_GPU: 2}, "include_dashboard": False,
        "_system_config": {"local_fs_capacity_threshold": 0.999}})
    second = cluster.add_node(num_cpus=1, resources={FAKE_GPU: 1})
    try:
        yield cluster, second
    finally:
        ray.shutdown()  # this process joined to read the cluster's nodes (`_cluster_nodes`)
        cluster.shutdown()


def _three_runs_prepared(service: RayServiceProcess) -> list[dict]:
    """Three runs made and served (one per stand-in GPU), each with its device facts once prepared."""
    made = [service.create_run(max_attempts=3) for _ in range(3)]

    async def prepared() -> list[dict]:
        facts = []
        for run in made:
            async with agent(run["mcp_url"], run["agent_token"]) as client:
                facts.append((await until_prepared(client))["device"])
        return facts

    for run, device in zip(made, anyio.run(prepared)):
        run["device"] = device
    return made


async def _attempt(run: dict, marks: str) -> dict:
    async with agent(run["mcp_url"], run["agent_token"]) as client:
        answer = await client.call_tool("record_attempt", {"source": kernel(marks), "rationale": marks})
        return {"error": answer.is_error, "text": answer.content[0].text}


async def _resumed(run: dict) -> tuple[dict, dict]:
    """(the device facts, the budget) of a run served again after the restart."""
    async with agent(run["mcp_url"], run["agent_token"]) as client:
        described = await until_prepared(client)
        return described["device"], described["budget"]


def _run_dir(service: RayServiceProcess, run: dict) -> Path:
    return next((service.root / "runs" / run["run"]["id"] / "results").glob("run-*"))


def _restart(service: RayServiceProcess, runs: list[dict], between=lambda: None) -> None:
    """kill -9, then started again once the old actors are gone (their node claims dropped with them)."""
    service.kill9()
    pids = [read_lock(_run_dir(service, r))["environment"]["ray_node"]["pid"] for r in runs]
    _until(lambda: all(_gone(pid) for pid in pids), timeout_s=60)
    between()
    service.start()


def _view(service: RayServiceProcess, run: dict) -> dict:
    with service.api() as http:
        return http.get(f"/api/runs/{run['run']['id']}").json()["run"]


def _waits_then_resumes(service: RayServiceProcess, run: dict, by_hand: ServingClaim) -> tuple[dict, str]:
    """The run whose GPU `by_hand` holds: waiting with the holder named, its endpoint answering 503 meanwhile, said
    once in the log; resumed once the claim is let go. (its view while waiting, the agent's 503 answer)"""
    waiting = _until(lambda: _view(service, run)["waiting"], timeout_s=60)
    with httpx2.Client(timeout=30) as http:
        refused = http.post(run["mcp_url"], json={}, headers={"Authorization": f"Bearer {run['agent_token']}"})
    assert refused.status_code == 503, refused.text
    time.sleep(WAITING_RETRY_S + 1.0)  # tried again once at least, and many scheduler steps
    assert service.stderr().count(f"run {run['run']['id']} waits") == 1
    view = _view(service, run)
    by_hand.release()
    _until(lambda: _view(service, run)["waiting"] is None, timeout_s=WAITING_RETRY_S + 30)
    return {**view, "waiting": waiting}, refused.json()["error"]


def test_running_runs_resume_on_the_node_and_gpu_they_began_on_after_kill_9(tmp_path, nodes):
    cluster, _ = nodes
    service = RayServiceProcess(tmp_path / "service", free_port(), cluster.address).start()
    try:
        runs = _three_runs_prepared(service)
        uuids = [r["device"]["ray_node"]["gpu_uuid"] for r in runs]
        assert len(set(uuids)) == 3  # one stand-in GPU each
        # The run on the node's first GPU is lost: the two left began on GPUs a placement in claim order
        # (the first free one) would not give them back, whichever of them is resumed first.
        first = min(runs, key=lambda r: r["device"]["gpu_index"])
        assert anyio.run(_attempt, first, "die")["error"]
        service.wait_state(first["run"]["id"], ("failed",), timeout_s=60)
        left = [r for r in runs if r is not first]
        answer = anyio.run(_attempt, left[0], "latency_us=40")  # one run mid-way: an attempt recorded
        assert not answer["error"] and json.loads(answer["text"])["verdict"] == "valid-faster", answer
        # The second run's GPU taken by another process on its node meanwhile (a `serve` started by hand, say)
        by_hand = ServingClaim(left[1]["device"]["ray_node"]["gpu_uuid"], "serve by hand",
                               folder=tmp_path / "service-node-leases")
        _restart(service, left, between=lambda: _until(by_hand.try_take, timeout_s=30))
        resumed = [anyio.run(_resumed, left[0])]
        waited, refused = _waits_then_resumes(service, left[1], by_hand)
        resumed.append(anyio.run(_resumed, left[1]))
        with service.api() as http:
            views = [http.get(f"/api/runs/{r['run']['id']}").json()["run"] for r in left]
    finally:
        service.stop()
    for run, (device, budget), view in zip(left, resumed, views):
        began = run["device"]["ray_node"]
        assert device["ray_node"]["gpu_uuid"] == began["gpu_uuid"] and device["gpu_uuid"] == began["gpu_uuid"]
        assert device["ray_node"]["node_id"] == began["node_id"]
        assert device["ray_node"]["pid"] != began["pid"] and device["ray_node"]["serving_claim"] == "held"
        assert view["state"] == "running" and view["waiting"] is None
    assert [(b["attempts_used"], b["attempts_left"]) for _, b in resumed] == [(1, 2), (0, 3)]
    assert waited["state"] == "running" and "held by another process" in waited["waiting"], waited
    assert "serve by hand" in waited["waiting"] and "serve by hand" in refused
    for run in runs:
        report = verify_run(_run_dir(service, run))
        assert report.ok, report.problems


def test_a_run_whose_node_left_the_cluster_is_failed_with_that_cause_said_once(tmp_path, nodes):
    cluster, second = nodes
    service = RayServiceProcess(tmp_path / "service", free_port(), cluster.address).start()
    try:
        runs = _three_runs_prepared(service)
        second_id = second.node_id
        away = [r for r in runs if r["device"]["ray_node"]["node_id"] == second_id]
        assert len(away) == 1  # the second node's one stand-in GPU serves one of the three
        service.kill9()
        cluster.remove_node(second)
        _until(lambda: not any(n["NodeID"] == second_id and n["Alive"] for n in _cluster_nodes(cluster)), 60)
        service.start()
        failed = service.wait_state(away[0]["run"]["id"], ("failed",), timeout_s=60)
        time.sleep(3.0)  # thirty scheduler steps and more
        stderr = service.stderr()
    finally:
        service.stop()
    error = failed["run"]["error"]
    assert "is no longer in the Ray cluster" in error and second_id[:12] in error, error
    assert stderr.count(f"run {away[0]['run']['id']} failed") == 1, stderr[-3000:]
    assert "the service's scheduler step failed" not in stderr
    report = verify_run(_run_dir(service, away[0]))  # nothing written to its folder: it verifies as it was left
    assert report.ok, report.problems


def _cluster_nodes(cluster) -> list[dict]:
    if not ray.is_initialized():
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    return ray.nodes()
