"""One timing at a time per GPU (harness/gpu_lease.py): processes contending for one (fake) GPU's lease.

Every contender is a real process: tests/lease_holder.py holds the lease as another referee would (a bench,
a run), and the waiter is this test's process, the Referee's own timing protocol with CPU stand-in workers,
or a real MCP server (tests/fake_server.py).
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from harness.gpu_lease import LEASE_DIR_ENV, GpuLease
from harness.referee import Referee
from harness.settings import CompiledKernel, TimingSettings
from harness.task import load_task
from harness.worker_side.gpu import format_uuid
from sandbox.pool import Worker
from server.replay import replay
from tests.fake_executor import FAKE_GPU_UUID, FakeExecutor
from tests.lease_holder import LeaseHolder
from tests.server_support import MATMUL, REPO, events, kernel, new_run, ok, prepared
from tests.test_replay import make_run

GPU = "GPU-0a1b2c3d-0000-4000-8000-00000000beef"



class _Waiter:
    """`lease.held()` entered on a thread, as a timing would; what the lease told it while it waited."""

    def __init__(self, lease: GpuLease, work=None):
        self.lease, self.work = lease, work or (lambda: None)
        self.told: list[str] = []
        self.lease.listener = self.told.append
        self.acquired = threading.Event()
        self.result = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with self.lease.held():
            self.acquired.set()
            self.result = self.work()

    def join(self) -> None:
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()


def test_a_second_process_waits_for_the_lease_says_whom_for_and_proceeds_after_release():
    holder = LeaseHolder(GPU, "bench")
    try:
        lease = GpuLease(GPU, "replay run-007", tell_every_s=0.2)
        assert lease.holder().pid == holder.pid and lease.holder().what == "bench"
        waiter = _Waiter(lease)
        assert not waiter.acquired.wait(1.0)  # held elsewhere: it waits
        assert re.fullmatch(rf"waiting for GPU {GPU} \(since [0-9T:+-]+\): another timing holds it, "
                            rf"pid {holder.pid} \(bench\) since [0-9T:+-]+", waiter.told[0]), waiter.told[0]
        assert len(waiter.told) >= 2  # told again while it waits
        released = time.monotonic()
        holder.release()
        assert waiter.acquired.wait(10)
        assert time.monotonic() - released < 5
        waiter.join()
    finally:
        holder.close()
    [wait] = lease.waits
    assert wait.gpu == GPU and wait.waited_s >= 0.5
    assert [(h.pid, h.what) for h in wait.holders] == [(holder.pid, "bench")]


def test_a_killed_holder_frees_the_lease_and_the_next_holder_is_named():
    holder = LeaseHolder(GPU, "serve run-003")
    try:
        waiter = _Waiter(GpuLease(GPU, "check matmul_f32", tell_every_s=0.2), work=lambda: time.sleep(1.5))
        assert not waiter.acquired.wait(0.5)
        holder.kill()  # SIGKILL: it never releases, and never rewrites its file
        assert waiter.acquired.wait(10)
        # While this process holds it, another waiter reads this process's name, not the dead holder's.
        assert GpuLease(GPU, "other").holder().model_dump(include={"pid", "what"}) == \
            {"pid": os.getpid(), "what": "check matmul_f32"}
        waiter.join()
    finally:
        holder.close()
    assert [(h.pid, h.what) for h in waiter.lease.waits[0].holders] == [(holder.pid, "serve run-003")]
    assert GpuLease(GPU, "other").holder() is None  # released: the file names nobody


def test_a_waiting_call_can_be_given_up_and_nested_holds_do_not_wait_for_themselves():
    lease = GpuLease(GPU, "serve run-001")
    with lease.held(), lease.held(), GpuLease(GPU, "bench").held():  # one process: no wait for itself
        assert lease.waits == []
    holder = LeaseHolder(GPU, "bench")
    try:
        errors = []

        def wait():
            try:
                with lease.held():
                    pass
            except Exception as exc:  # noqa: BLE001 - the test reads it
                errors.append(exc)

        told = threading.Event()
        lease.listener = lambda message: told.set()  # said once the wait is under way
        thread = threading.Thread(target=wait)
        thread.start()
        assert told.wait(10)
        lease.abort()  # as GpuExecutor.abort does when the call is cancelled
        thread.join(timeout=10)
        assert [type(e).__name__ for e in errors] == ["LeaseWaitAborted"]
    finally:
        holder.close()


def test_the_uuid_is_written_as_nvml_writes_it():
    assert format_uuid(bytes(range(16))) == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"


# -- the Referee: timing jobs hold the lease, checks do not -----------------------------------------

FAKE_GPU = (sys.executable, str(Path(__file__).with_name("fake_gpu_worker.py")))
CUBIN = b"\x7fELF" + bytes(60)  # never loaded: the fake worker emulates the kernel


class _Pool:
    def __init__(self):
        self.reference = Worker("reference", command=FAKE_GPU + ("--behaviour=honest",), confine=False,
                                startup_timeout_s=30)
        self.candidate = Worker("candidate", command=FAKE_GPU + ("--behaviour=honest",), confine=False,
                                startup_timeout_s=30)

    def close(self):
        self.reference.stop()
        self.candidate.stop()


def test_the_referee_times_under_the_lease_and_checks_without_it():
    task = load_task(MATMUL)
    pool = _Pool()
    referee = Referee(task, pool, CompiledKernel("reference", CUBIN, task.kernel_name, task.launch),
                      TimingSettings(warmups=2, iterations=20))
    referee.lease = GpuLease(GPU, "serve run-002", tell_every_s=0.2)
    small = [task.visible_cases[0]]
    candidate = CompiledKernel("candidate", CUBIN, task.kernel_name, task.launch)
    referee.check(candidate, small)  # workers started, reference outputs made
    holder = LeaseHolder(GPU, "bench")
    try:
        started = time.monotonic()
        assert referee.check(candidate, small).passed  # a correctness check takes no lease
        assert time.monotonic() - started < 20 and referee.lease.waits == []
        waiter = _Waiter(referee.lease, work=lambda: referee.time(candidate, small))
        assert not waiter.acquired.wait(1.0)
        assert any(f"pid {holder.pid} (bench)" in m for m in waiter.told)
        holder.release()
        waiter.join()
    finally:
        holder.close()
        pool.close()
    assert waiter.result.passed
    assert [(h.pid, h.what) for h in referee.lease.waits[0].holders] == [(holder.pid, "bench")]


# -- a real server: the wait is told in the call's progress and recorded in its audit record --------

def _server(results: Path) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[str(REPO / "tests" / "fake_server.py"), str(results)],
                                 cwd=str(results.parent), env={LEASE_DIR_ENV: os.environ[LEASE_DIR_ENV]})


@pytest.mark.anyio
async def test_a_server_waits_for_another_process_timing_on_its_gpu_and_records_whom_for(tmp_path):
    results = tmp_path / "results"
    told: list[tuple[float, str]] = []
    waiting = anyio.Event()

    async def progress(done, total, message):
        told.append((done, message or ""))
        if (message or "").startswith("waiting for GPU"):
            waiting.set()

    async def when_told(then):
        nonlocal waiting
        await waiting.wait()
        await anyio.sleep(0.5)
        await anyio.to_thread.run_sync(then)
        waiting = anyio.Event()

    async with Client(_server(results), cache=None, read_timeout_seconds=60) as c:
        await prepared(c)  # the run and its baseline exist
        holder, second = LeaseHolder(FAKE_GPU_UUID, "bench"), None
        try:
            started = time.monotonic()
            await ok(c, "compile_kernel", source=kernel("latency_us=50"))
            await ok(c, "validate", source=kernel("latency_us=50"))  # compiling and checking need no lease
            assert time.monotonic() - started < 10
            async with anyio.create_task_group() as group:
                group.start_soon(when_told, holder.release)
                result = await c.call_tool("record_attempt", {"source": kernel("latency_us=50"), "rationale": "r"},
                                           progress_callback=progress)
            assert not result.is_error and result.structured_content["verdict"] == "valid-faster"
            said = [m for _, m in told if m.startswith("waiting for GPU")]
            assert said and f"pid {holder.pid} (bench)" in said[0] and FAKE_GPU_UUID in said[0]
            dones = [done for done, _ in told]
            assert dones == sorted(dones) and len(set(dones)) == len(dones)  # progress only grows

            second = LeaseHolder(FAKE_GPU_UUID, "replay run-009")
            async with anyio.create_task_group() as group:
                group.start_soon(when_told, second.kill)
                result = await c.call_tool("time_kernel", {"source": kernel("latency_us=50")},
                                           progress_callback=progress)
            assert not result.is_error
        finally:
            holder.close()
            if second is not None:
                second.close()
    log = events(results / "run-001")
    [done] = [e["data"] for e in log if e["kind"] == "attempt_done"]
    [wait] = done["gpu_lease_waits"]
    assert [(h["pid"], h["what"]) for h in wait["holders"]] == [(holder.pid, "bench")]
    assert wait["waited_s"] >= 0.5 and done["gpu_seconds"] < wait["waited_s"]  # waiting is not GPU time of this run
    [timed] = [e["data"] for e in log if e["kind"] == "probe_done" and e["data"]["tool"] == "time_kernel"]
    assert [(h["pid"], h["what"]) for h in timed["gpu_lease_waits"][0]["holders"]] == [(second.pid, "replay run-009")]
    assert "gpu_lease_waits" not in [e for e in log if e["kind"] == "probe_done" and e["data"]["tool"] == "validate"][0]["data"]


def test_a_run_names_itself_on_its_gpu_lease(tmp_path):
    run = new_run(tmp_path)
    try:
        assert run.executor.gpu_lease.what == "serve run-001"
        assert json.loads((run.dir / "lock.json").read_text())["environment"]["gpu_uuid"] == FAKE_GPU_UUID
    finally:
        run.close()


class _TellingLease(GpuLease):
    """A lease that also sets `told` once it has said whom it waits for."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.told = threading.Event()

    def _tell(self, holder, since):
        super()._tell(holder, since)
        self.told.set()


def test_a_replay_waits_for_another_process_timing_and_replay_json_says_whom_for(tmp_path, capsys):
    run_dir = make_run(tmp_path, kernel("latency_us=50"))
    lease = _TellingLease(FAKE_GPU_UUID, "replay run-001")

    def make_executor(task, timing):
        executor = FakeExecutor(task)
        executor.gpu_lease = lease
        return executor

    holder = LeaseHolder(FAKE_GPU_UUID, "serve run-004")
    try:
        releaser = threading.Thread(target=lambda: (lease.told.wait(60), time.sleep(0.5), holder.release()))
        releaser.start()
        assert replay(run_dir, io.StringIO(), repeats=1, make_executor=make_executor) == 0
        releaser.join()
    finally:
        holder.close()
    [wait] = json.loads((run_dir / "replay.json").read_text())["gpu_lease_waits"]
    assert [(h["pid"], h["what"]) for h in wait["holders"]] == [(holder.pid, "serve run-004")]
    assert wait["waited_s"] >= 0.5
    assert f"waiting for GPU {FAKE_GPU_UUID}" in capsys.readouterr().err
