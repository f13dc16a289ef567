"""The guard's GPU lease with two processes: another process (tests/lease_holder.py, as a bench or a run would)
holds the fake GPU's host-wide lease; the guard waits for it before its first round, says whom it waits for,
records the wait in its JSON, and proceeds once the lease is let go. The fake executor stands in for the GPU."""

from __future__ import annotations

import io
import json
import threading
import time

from guard.run import GuardOptions, run_guard
from guard.verdict import VerdictSettings
from tests.fake_executor import FAKE_GPU_UUID, FakeExecutor
from tests.guard_fake_store import add_approval, new_store
from tests.lease_holder import LeaseHolder

QUICK = VerdictSettings(min_rounds=8, step_rounds=4, max_rounds=12)


def _told(told: list[str], start: str, seconds: float) -> str | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = next((m for m in list(told) if m.startswith(start)), None)
        if found is not None:
            return found
        time.sleep(0.05)
    return None


def test_the_guard_waits_for_the_lease_another_process_holds_names_it_and_proceeds_after_release(
        tmp_path, own_gpu_claims, monkeypatch):
    store, key = new_store(tmp_path)
    add_approval(store, key, "matmul", "matmul_f32", 50)
    told: list[str] = []
    monkeypatch.setattr("guard.run._say", told.append)
    out, report = io.StringIO(), tmp_path / "out" / "guard.json"
    options = GuardOptions(store=store, json=report, settings=QUICK,
                           make_executor=lambda approval: lambda task, timing: FakeExecutor(
                               task, lease_what=f"guard {approval.name}"))
    codes: list[int] = []
    guarding = threading.Thread(target=lambda: codes.append(run_guard(options, out)), daemon=True)
    holder = LeaseHolder(FAKE_GPU_UUID, "bench")
    try:
        guarding.start()
        waiting = _told(told, "waiting for GPU", 120)  # after its checks, at its first round
        assert waiting is not None, told
        assert f"waiting for GPU {FAKE_GPU_UUID}" in waiting and f"pid {holder.pid} (bench)" in waiting
        time.sleep(0.5)
        assert guarding.is_alive() and not any("round 2" in m for m in told)  # nothing timed while held
        holder.release()
        guarding.join(timeout=120)
        assert not guarding.is_alive()
    finally:
        holder.close()
    assert codes == [0], out.getvalue()
    [result] = json.loads(report.read_text())["results"]
    assert [v["verdict"] for v in result["verdicts"]] == ["pass", "pass"]
    [wait] = result["lease_waits"]
    assert wait["gpu"] == FAKE_GPU_UUID and wait["waited_s"] >= 0.5
    assert [(h["pid"], h["what"]) for h in wait["holders"]] == [(holder.pid, "bench")]
