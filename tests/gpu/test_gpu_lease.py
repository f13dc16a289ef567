"""The GPU's lease on a real device: the worker names the GPU by its UUID, and a timing waits for another
process's hold on it (harness/gpu_lease.py)."""

import re
import threading

import pytest

from harness.settings import TimingSettings
from server.executor import GpuExecutor
from tests.gpu.conftest import build
from tests.lease_holder import LeaseHolder

pytestmark = pytest.mark.gpu


def test_the_executor_names_its_gpu_by_uuid_and_times_under_its_lease(matmul_task):
    executor = GpuExecutor(matmul_task, TimingSettings(warmups=2, iterations=20), lease_what="check matmul_f32")
    try:
        facts = executor.start()
        uuid = facts["gpu_uuid"]
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", uuid), uuid
        lease = executor.gpu_lease
        assert lease.gpu == uuid and executor.referee.lease is lease
        kernel = build(matmul_task.source("initial"), matmul_task, facts["arch"],
                       launch=matmul_task.own_launch("initial"))
        case = [matmul_task.visible_cases[0]]
        assert executor.check(kernel, case).passed  # the workers and the reference outputs are ready
        told = threading.Event()
        lease.listener = lambda message: told.set()
        holder = LeaseHolder(uuid, "bench")
        try:
            assert executor.check(kernel, case).passed and lease.waits == []  # a check takes no lease
            timing = []
            thread = threading.Thread(target=lambda: timing.append(executor.time(kernel, case)))
            thread.start()
            assert told.wait(30)  # it waits for the holder, and says so
            holder.release()
            thread.join(timeout=120)
            assert timing and timing[0].passed
        finally:
            holder.close()
        [wait] = lease.waits
        assert [(h.pid, h.what) for h in wait.holders] == [(holder.pid, "bench")]
    finally:
        executor.close()
