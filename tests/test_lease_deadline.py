"""A wait for the GPU lease is part of the call: it ends at the call's deadline, whoever holds the lease.

The holder is a real process (tests/lease_holder.py) that keeps the lease of the fake executor's GPU for the
whole test; the server is the real MCP server over the fake executor, with a call deadline of 2 s.
"""

from __future__ import annotations

import threading
import time

import pytest

from harness.call_limits import OutOfTime
from harness.gpu_lease import GpuLease
from sandbox.deadline import Deadline
from server.records import Verdict
from tests.fake_executor import FAKE_GPU_UUID
from tests.lease_holder import LeaseHolder
from tests.server_support import client, events, kernel, new_run, ok, refused

DEADLINE_S = 2.0


@pytest.fixture
def holder():
    held = LeaseHolder(FAKE_GPU_UUID, "bench")
    yield held
    held.close()


def test_a_lease_wait_ends_at_the_deadline_naming_the_holder(holder):
    lease = GpuLease(FAKE_GPU_UUID, "serve run-001")
    started = time.monotonic()
    with pytest.raises(OutOfTime) as out:
        with lease.held(Deadline(0.5)):
            pass
    assert 0.4 < time.monotonic() - started < 3
    assert f"pid {holder.pid} (bench)" in str(out.value) and FAKE_GPU_UUID in str(out.value)
    with pytest.raises(OutOfTime):  # no time left: not even one try of the other process's hold
        with lease.held(Deadline(0)):
            pass


def test_a_thread_of_this_process_waits_for_another_within_its_deadline():
    lease = GpuLease(FAKE_GPU_UUID, "serve run-001")
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with lease.held():
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert inside.wait(10)
        with pytest.raises(OutOfTime):
            with GpuLease(FAKE_GPU_UUID, "check").held(Deadline(0.3)):
                pass
    finally:
        leave.set()
        thread.join(10)


@pytest.mark.anyio
async def test_calls_waiting_for_a_held_lease_answer_within_their_deadline(tmp_path):
    run = new_run(tmp_path, profile=True)  # its baseline is timed before the other process takes the lease
    run.call_deadline_s = DEADLINE_S
    holder = LeaseHolder(FAKE_GPU_UUID, "bench")
    try:
        async with client(run) as c:
            started = time.monotonic()
            said = await refused(c, "time_kernel", source=kernel("latency_us=50"))
            assert "stopped" in said and f"pid {holder.pid} (bench)" in said
            assert time.monotonic() - started < DEADLINE_S + 3

            started = time.monotonic()
            said = await refused(c, "profile_kernel", source=kernel("latency_us=50"))
            assert "profile_kernel stopped" in said and "waiting for GPU" in said
            assert time.monotonic() - started < DEADLINE_S + 3

            started = time.monotonic()
            answer = await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="faster")
            assert time.monotonic() - started < DEADLINE_S + 3
            assert answer["verdict"] == Verdict.REJECTED.value
            assert "timeout" in {r["code"] for r in answer["reasons"]}
    finally:
        holder.close()
        run.close()
    log = events(run.dir)
    [profiled] = [e["data"] for e in log if e["kind"] == "probe_done" and e["data"]["tool"] == "profile_kernel"]
    assert profiled["profiled"] is False
    assert [(h["pid"], h["what"]) for h in profiled["gpu_lease_waits"][0]["holders"]] == [(holder.pid, "bench")]
    assert profiled["gpu_seconds"] < 0.5  # the wait is not the run's GPU time
