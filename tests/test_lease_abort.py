"""Giving up a wait for a GPU's lease (harness/gpu_lease.py): an abort that lands before the wait begins ends it at
once, and a server call's abort gives up that call's waits only (server/call_gate.py resumes them before the next).

Another process holds the lease (tests/lease_holder.py); the waits are ordered by events and joined threads, and
the leases poll rarely, so only the abort itself can end a wait soon.
"""

from __future__ import annotations

import os
import threading
import time

import anyio
import pytest

from harness.call_limits import OutOfTime
from harness.gpu_lease import GpuLease, LeaseWaitAborted
from sandbox.deadline import Deadline
from tests.fake_executor import FAKE_GPU_UUID
from tests.lease_holder import LeaseHolder
from tests.server_support import client, kernel, new_run, ok

GPU = "GPU-0a1b2c3d-0000-4000-8000-00000000ab07"
RARE_POLL_S = 30.0  # longer than any deadline below: a wait that ends soon was ended by the abort
DEADLINE_S = 5.0    # what a wait that missed its abort runs to (and fails with OutOfTime)


@pytest.fixture
def holder():
    holding = LeaseHolder(GPU, "bench")
    yield holding
    holding.close()


def _lease() -> GpuLease:
    return GpuLease(GPU, "serve run-001", poll_s=RARE_POLL_S, tell_every_s=RARE_POLL_S)


def _given_up_at_once(lease: GpuLease) -> None:
    """Enter the lease's hold, which must end with the abort's error well before its deadline."""
    started = time.monotonic()
    with pytest.raises(LeaseWaitAborted, match=f"the wait for GPU {GPU} was given up"):
        with lease.held(Deadline(DEADLINE_S)):
            pytest.fail("the lease was taken while another process held it")
    assert time.monotonic() - started < DEADLINE_S / 2
    [wait] = lease.waits  # recorded, as every wait is
    assert wait.gpu == GPU and wait.waited_s < DEADLINE_S / 2


def test_an_abort_before_the_call_reaches_the_lease_ends_its_wait_at_once(holder):
    """The call was cancelled while it compiled: its abort came before it asked for the lease."""
    lease = _lease()
    lease.abort()
    _given_up_at_once(lease)


class _AbortedAsItsWaitBegins(GpuLease):
    """A lease whose abort arrives from another thread after its first try found the lease held, and before its wait
    begins (the thread that aborts has finished when the wait starts)."""

    def _wait(self, fd, deadline):
        aborting = threading.Thread(target=self.abort)
        aborting.start()
        aborting.join()
        super()._wait(fd, deadline)


def test_an_abort_between_the_first_try_and_the_wait_ends_the_wait_at_once(holder):
    lease = _AbortedAsItsWaitBegins(GPU, "serve run-001", poll_s=RARE_POLL_S, tell_every_s=RARE_POLL_S)
    _given_up_at_once(lease)


def test_an_abort_during_the_wait_ends_it_at_once(holder):
    lease = _lease()
    told = threading.Event()
    lease.listener = lambda message: told.set()  # said once the wait is under way
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            with lease.held(Deadline(DEADLINE_S)):
                pass
        except (LeaseWaitAborted, OutOfTime) as exc:
            errors.append(exc)

    waiting = threading.Thread(target=wait)
    started = time.monotonic()
    waiting.start()
    assert told.wait(DEADLINE_S)
    lease.abort()
    waiting.join(timeout=DEADLINE_S * 2)
    assert [type(e) for e in errors] == [LeaseWaitAborted]
    assert time.monotonic() - started < DEADLINE_S / 2


def test_after_resume_a_wait_waits_for_the_holder_and_takes_the_lease(holder):
    lease = GpuLease(GPU, "serve run-002", poll_s=0.01, tell_every_s=RARE_POLL_S)
    lease.abort()
    with pytest.raises(LeaseWaitAborted):
        with lease.held(Deadline(DEADLINE_S)):
            pass
    lease.resume()
    told = threading.Event()
    lease.listener = lambda message: told.set()
    releasing = threading.Thread(target=lambda: (told.wait(DEADLINE_S), holder.release()))
    releasing.start()
    with lease.held(Deadline(DEADLINE_S * 4)):
        assert lease.holder().pid == os.getpid()
    releasing.join()
    assert told.is_set() and len(lease.waits) == 2


def test_an_abort_gives_up_waiting_only_a_free_lease_and_a_hold_are_left_alone():
    lease = GpuLease("GPU-0a1b2c3d-0000-4000-8000-00000000f7ee", "serve run-003")
    lease.abort()
    with lease.held(Deadline(DEADLINE_S)):  # free: taken
        lease.abort()
        with lease.held(Deadline(DEADLINE_S)):  # this process's own hold: nothing to wait for
            assert lease.holder().pid == os.getpid()
    assert lease.waits == []


@pytest.mark.anyio
async def test_a_cancelled_calls_abort_does_not_give_up_the_next_calls_wait(tmp_path):
    run = new_run(tmp_path)
    holder = None
    try:
        async with client(run) as c:
            slow = (await ok(c, "compile_kernel", source=kernel("slow_s=60")))["candidate"]
            timed_before = run.executor.calls.count("time")
            async with anyio.create_task_group() as group:
                group.start_soon(c.call_tool, "time_kernel", {"candidate_id": slow})
                while run.executor.calls.count("time") == timed_before:  # timing, under the lease
                    await anyio.sleep(0.02)
                group.cancel_scope.cancel()
            assert run.executor.aborted == 1  # the lease's abort landed while no wait was under way

            holder = LeaseHolder(FAKE_GPU_UUID, "bench")
            said: list[str] = []

            async def progress(done, total, message):
                said.append(message or "")
                if (message or "").startswith("waiting for GPU") and holder.process.poll() is None:
                    await anyio.to_thread.run_sync(holder.release)

            result = await c.call_tool("time_kernel", {"source": kernel("latency_us=50")}, progress_callback=progress)
            assert not result.is_error, result.content[0].text
            assert any(m.startswith("waiting for GPU") for m in said)  # it waited, and was not given up
    finally:
        if holder is not None:
            holder.close()
        run.close()
