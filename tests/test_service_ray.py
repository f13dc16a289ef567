"""`kernel-referee service --ray`: each run's executor a Ray actor on a local cluster of four stand-in GPUs (a custom
resource) with the fake executor: four runs served at once and a fifth queued, each in its own actor on its own
claimed GPU; an agent's attempts through the run's HTTP MCP endpoint; an abort reaching a call in flight; the call's
deadline kept on the node; a killed actor an executor error that loses no budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import pytest
from starlette.testclient import TestClient

from harness.call_limits import CallLimits, OutOfTime
from harness.gpu_lease import GpuLease, ServingClaim
from harness.results import ReasonCode
from harness.settings import CompiledKernel, TimingSettings
from harness.task import load_task
from sandbox.deadline import Deadline
from server.executor import ExecutorError
from server.lease_waits import resume_waits
from server.verify import verify_run
from service import cli as service_cli
from service.app import build_app
from service.auth import ADMIN_TOKEN_ENV
from service.settings import ServiceSettings
from tests.fake_executor import fake_gpus
from tests.fake_ray_service import FAKE_GPU, FAKE_NODE_GPUS, REPO, fleet, runtime_env
from tests.server_support import free_port, kernel
from tests.service_support import ADMIN, MATMUL, ServiceProcess, agent, described, until_prepared

ray = pytest.importorskip("ray", reason="Ray is the optional extra kernel-referee[fleet]: not installed here")

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def node_leases(tmp_path_factory):
    return tmp_path_factory.mktemp("node-leases")


@pytest.fixture(scope="module")
def cluster(node_leases):
    # Two CPUs and no dashboard: this machine is small and shared. The actors reserve no CPU (ray_executor.py).
    # Ray refuses to store objects on a disk fuller than 95%, as a shared test machine's often is: these tests
    # store only small messages.
    ray.init(num_cpus=2, resources={FAKE_GPU: FAKE_NODE_GPUS}, include_dashboard=False, log_to_driver=False,
             runtime_env=runtime_env(node_leases), _system_config={"local_fs_capacity_threshold": 0.999})
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def _auth(token: str = ADMIN) -> dict:
    return {"Authorization": f"Bearer {token}"}


def _states(client: TestClient, ids: list[str]) -> dict[str, dict]:
    return {i: client.get(f"/api/runs/{i}", headers=_auth()).json() for i in ids}


def _until(what, timeout_s: float = 120.0, period_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while True:
        value = what()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout_s} s"
        time.sleep(period_s)


def _gone(pid: int) -> bool:
    """The process has exited (a zombie not yet reaped by the raylet counts as exited)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def test_four_stand_in_gpus_serve_four_runs_at_once_each_in_its_own_actor(tmp_path, cluster, node_leases,
                                                                           own_gpu_claims):
    ray_fleet = fleet()
    slots = ray_fleet.slots()
    assert [s.uuid for s in slots] == [f"ray-{FAKE_GPU}-{i}" for i in range(1, 5)]
    settings = ServiceSettings(root=tmp_path / "service", scheduler_period_s=0.05)
    app = build_app(settings, ray_fleet.make_executor, slots, env={ADMIN_TOKEN_ENV: ADMIN})
    with TestClient(app, base_url="http://127.0.0.1:8000") as client:
        ids = []
        for _ in range(5):
            made = client.post("/api/runs", json={"task_dir": str(MATMUL)}, headers=_auth())
            assert made.status_code == 201, made.text
            ids.append(made.json()["run"]["id"])
        service = client.app.state.service

        def four_prepared():
            views = _states(client, ids)
            running = [i for i in ids if views[i]["run"]["state"] == "running"]
            ready = [i for i in running if i in service.live and service.live[i].run.preparation is not None
                     and service.live[i].run.preparation.ready]
            return views if len(ready) == 4 else None

        views = _until(four_prepared)
        assert [views[i]["run"]["state"] for i in ids] == ["running"] * 4 + ["queued"]
        assert views[ids[4]]["queue_position"] == 1
        waiting = client.portal.call(service.live_run, ids[4])
        assert waiting.run.executor.actor is None  # a queued run holds no actor, so no GPU of the cluster
        nodes = [service.live[i].run.environment["ray_node"] for i in ids[:4]]
        pids = {n["pid"] for n in nodes}
        assert len(pids) == 4 and os.getpid() not in pids  # four actors, none of them the service's process
        assert sorted(n["gpu_uuid"] for n in nodes) == sorted(g.uuid for g in fake_gpus(4))
        assert {n["serving_claim"] for n in nodes} == {"held"} and all(n["node_id"] and n["ip"] for n in nodes)
        for i in ids[:4]:  # the node's facts are recorded with the run, in its folder
            run_dir = service.live[i].run.dir
            assert f'"pid": {service.live[i].run.environment["ray_node"]["pid"]}' in (run_dir / "lock.json").read_text()
        held = {json.loads(p.read_text())["pid"] for p in node_leases.glob("*.serving.lock")}
        assert pids <= held  # each actor holds its GPU's claim on the node, in the node's own lease folder
    # The service closed its runs: their actors let their claims go and were killed.
    _until(lambda: all(_gone(pid) for pid in pids), timeout_s=30)
    for gpu in fake_gpus(4):
        assert not ServingClaim(gpu.uuid, "test", folder=node_leases).is_taken()


def _executor_on_the_cluster():
    task = load_task(MATMUL)
    executor = fleet().make_executor(task, TimingSettings(), None)
    executor.start()
    return task, executor


def _compiled(task, executor, *marks: str) -> CompiledKernel:
    result = executor.compile(kernel(*marks), ())
    assert result.ok, result.log
    return CompiledKernel("candidate", result.cubin, result.lowered_name, task.launch)


def test_an_abort_reaches_a_call_in_flight_and_the_deadline_holds_on_the_node(cluster):
    task, executor = _executor_on_the_cluster()
    try:
        slow = _compiled(task, executor, "slow_s=60")
        answers = []
        timing = threading.Thread(target=lambda: answers.append(executor.time(slow, list(task.performance_cases))))
        started = time.monotonic()
        timing.start()
        time.sleep(2.0)  # the timing is under way in the actor
        executor.abort()
        timing.join(timeout=30)
        assert not timing.is_alive() and time.monotonic() - started < 20
        assert answers[0].cases[0].reasons[0].code is ReasonCode.WORKER_CRASHED
        spinning = _compiled(task, executor, "spin_s=30")
        started = time.monotonic()
        with pytest.raises(OutOfTime, match="ran out"), executor.within(CallLimits(Deadline(2.0))):
            executor.time(spinning, list(task.performance_cases))
        assert time.monotonic() - started < 15  # the call's deadline, made again on the node's clock
        assert executor.time(_compiled(task, executor, "latency_us=40"), list(task.performance_cases)).passed
    finally:
        executor.close()


def test_a_killed_actor_is_an_executor_error_and_stays_one(cluster):
    task, executor = _executor_on_the_cluster()
    pid = executor.start()["ray_node"]["pid"]
    try:
        with pytest.raises(ExecutorError, match="was lost"):
            executor.time(_compiled(task, executor, "die"), list(task.performance_cases))
        _until(lambda: _gone(pid), timeout_s=30)
        with pytest.raises(ExecutorError, match="was lost"):  # its expected outputs and its GPU went with it
            executor.compile(kernel("latency_us=40"), ())
    finally:
        executor.close()


class RayServiceProcess(ServiceProcess):
    def __init__(self, root, port, address: str):
        super().__init__(root, port)
        self.address = address

    def command(self) -> list[str]:
        return [sys.executable, str(REPO / "tests" / "fake_ray_service.py"), str(self.root), str(self.port),
                self.address]



def test_an_agent_records_attempts_through_the_actor_and_a_lost_actor_loses_no_budget(tmp_path, cluster):
    service = RayServiceProcess(tmp_path / "service", free_port(), cluster).start()
    try:
        created = service.create_run(max_attempts=3)

        async def play() -> tuple[dict, str, dict]:
            async with agent(created["mcp_url"], created["agent_token"]) as client:
                ready = await until_prepared(client, 120.0)
                first = await client.call_tool("record_attempt", {"source": kernel("latency_us=40"),
                                                                  "rationale": "faster"})
                assert not first.is_error, first.content[0].text
                assert json.loads(first.content[0].text)["verdict"] == "valid-faster"
                compiled = await client.call_tool("compile_kernel", {"source": kernel("latency_us=30")})
                assert not compiled.is_error, compiled.content[0].text
                kept = json.loads(compiled.content[0].text)["candidate"]  # an id known before the loss
                lost = await client.call_tool("record_attempt", {"source": kernel("die"), "rationale": "node lost"})
                assert lost.is_error
                again = await client.call_tool("record_attempt", {"candidate_id": kept, "rationale": "after the loss"})
                assert again.is_error  # refused before it claims a slot: nothing more is spent
                return ready, lost.content[0].text, (await described(client))["budget"]

        ready, lost, budget = anyio.run(play)
        # the run's slot goes to the next run: the run is failed, its error the lost executor's
        failed = service.wait_state(created["run"]["id"], ("failed",), timeout_s=30)
        assert "on the Ray cluster was lost" in failed["run"]["error"]
    finally:
        service.stop()
    node = ready["device"]["ray_node"]
    assert node["serving_claim"] == "held" and node["pid"] != service.proc.pid
    assert ready["device"]["executor_pid"] == node["pid"]  # the executor ran in the actor
    assert lost.startswith("Error executing tool record_attempt")  # a broken executor, as on one host
    # the attempt the lost node cut short counts, as interrupted: nothing lost, nothing given back
    assert (budget["attempts_used"], budget["attempts_left"]) == (2, 1), budget
    run_dir = next((service.root / "runs" / created["run"]["id"] / "results").glob("run-*"))
    assert "attempt_interrupted" in (run_dir / "events.jsonl").read_text()
    assert "ExecutorError: the run's executor on the Ray cluster was lost" in (run_dir / "history.json").read_text()
    report = verify_run(run_dir)
    assert report.ok, report.problems


def test_the_command_refuses_a_cluster_without_the_resource_asked_for(tmp_path, cluster, capsys):
    assert service_cli.main(["--root", str(tmp_path / "service"), "--ray", "auto", "--ray-resource", "no_such_gpu",
                             "--port", str(free_port()), "--no-sandbox"]) == 2
    assert "the Ray cluster has no no_such_gpu" in capsys.readouterr().err
    assert not (tmp_path / "service").exists()


def test_the_service_without_ray_does_not_load_it():
    loaded = subprocess.run([sys.executable, "-c", "import sys, service.cli, service.app; print('ray' in sys.modules)"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert loaded.stdout.strip() == "False", loaded.stderr


def test_the_gates_resume_reaches_the_lease_on_the_node(cluster, node_leases):
    """An abort leaves the node's lease giving up its waits until the next call's resume (server/lease_waits.py
    `resume_waits`, called by the gate before every call's work): forwarded, the next timing waits its turn behind
    another process's timing on that GPU instead of giving up."""
    task, executor = _executor_on_the_cluster()
    try:
        gpu_uuid = executor.start()["ray_node"]["gpu_uuid"]
        kernel_40 = _compiled(task, executor, "latency_us=40")
        executor.abort()  # nothing in flight: only the lease's waits are given up from now on
        resume_waits(executor)
        other = GpuLease(gpu_uuid, "another process's timing", folder=node_leases)
        holding, let_go = threading.Event(), threading.Event()

        def hold() -> None:
            with other.held():
                holding.set()
                let_go.wait(30)

        holder = threading.Thread(target=hold)
        holder.start()
        assert holding.wait(30)
        threading.Timer(2.0, let_go.set).start()
        started = time.monotonic()
        assert executor.time(kernel_40, list(task.performance_cases)).passed  # LeaseWaitAborted without resume
        assert time.monotonic() - started >= 1.5  # it waited for the other timing
        holder.join(30)
    finally:
        executor.close()
