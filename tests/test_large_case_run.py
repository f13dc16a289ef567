"""A whole run of a task whose cases all take the large-case path: inputs drawn on the device, outputs judged
there, expected outputs kept there with their sha256-trees in the run folder. The real GPU executor and
referee, over CPU stand-in GPU workers (tests/fake_gpu_worker.py) that emulate CUDA IPC with files; the
thresholds are lowered to 0 so that the small matmul task stands for a large one."""

from __future__ import annotations

import io

import pytest

from harness.settings import TimingSettings
from harness.task import load_task
from sandbox.pool import WorkerPool
from server import lifecycle
from server.attempt import finish, record_attempt
from server.executor import GpuExecutor
from server.replay import replay
from server.run import RunSettings
from server.verify import verify_run
from tests import server_support
from tests.server_support import INITIAL, client, ok, read_json
from tests.test_call_deadline import FAKE_GPU, small_matmul

LARGE = TimingSettings(warmups=2, iterations=20, device_judging_from_bytes=0, draw_inputs_from_bytes=0)


def _executor(task_dir, tmp_path):
    executor = GpuExecutor(load_task(task_dir), LARGE, confine=False)
    executor.pool = WorkerPool(FAKE_GPU + (f"--ipc-dir={tmp_path / 'ipc'}",), confine=False)
    executor.peaks_cache_dir = tmp_path / "peaks"
    return executor


@pytest.mark.anyio
async def test_a_run_of_large_cases_keeps_nothing_large_on_the_host_or_the_disk(tmp_path):
    (tmp_path / "ipc").mkdir()
    task_dir = small_matmul(tmp_path / "task")
    executor = _executor(task_dir, tmp_path)
    run = lifecycle.new_run(task_dir, tmp_path / "results", RunSettings(timing=LARGE), executor)
    try:
        assert list((run.dir / "expected").rglob("*.npy")) == []
        trees = list((run.dir / "expected").rglob("*.sha256-tree"))
        assert len(trees) == len(run.task.cases) * LARGE.rotation_sets
        async with client(run) as c:
            answer = await ok(c, "record_attempt", source=INITIAL, rationale="the baseline again")
        assert answer["verdict"] in ("valid-faster", "valid-not-faster"), answer
        referee = executor.referee
        assert referee.device_off is None
        assert referee.judged_on_device > 0 and referee.audits_on_device > 0
        assert all(not referee._inputs and referee.inputs(c, c.seed) == ({}, {}) for c in run.task.cases)
        assert referee._expected == {}  # no expected output was ever read back to the host
        assert verify_run(run.dir).ok
    finally:
        run.close()
        executor.close()
    run.folder_lock.release()
    resumed_executor = _executor(task_dir, tmp_path)
    resumed = lifecycle.resume_run(run.dir, resumed_executor)
    try:
        assert len(resumed_executor.referee._locked_trees) == len(trees)
        async with client(resumed) as c:
            answer = await ok(c, "record_attempt", source=INITIAL, rationale="once more, after a resume")
        assert answer["verdict"] in ("valid-faster", "valid-not-faster"), answer
    finally:
        resumed.close()
        resumed_executor.close()


@pytest.mark.anyio
async def test_an_attempt_records_why_cases_meant_for_the_gpu_were_judged_on_the_host(tmp_path):
    run = server_support.new_run(tmp_path)
    try:
        run.executor.device_off = "the candidate's outputs could not be shared with the judging worker (fake)"
        async with client(run) as c:
            answer = await ok(c, "record_attempt", source=INITIAL, rationale="judged on the host")
        entry = read_json(run.dir / "history.json")["attempts"][answer["attempt"]]
        assert entry["validation"]["judged_on_host_because"] == run.executor.device_off
    finally:
        run.close()


def test_a_replay_of_large_cases_keeps_the_float64_oracle_off_the_host_and_says_so(tmp_path, capsys):
    (tmp_path / "ipc").mkdir()
    task_dir = small_matmul(tmp_path / "task")
    run = lifecycle.new_run(task_dir, tmp_path / "results", RunSettings(timing=LARGE), _executor(task_dir, tmp_path))
    try:
        record_attempt(run, run.candidate(None, INITIAL), "the baseline again", None, None)
        holdout = finish(run, "done", None).holdout
        assert holdout["oracle_skipped"] == [c.name for c in run.task.holdout_cases] and "oracle_passed" not in holdout
    finally:
        run.close()
        run.executor.close()
    run.folder_lock.release()
    out = io.StringIO()
    code = replay(run.dir, out, repeats=1, confine=False, sandbox_refusal=lambda: None,
                  make_executor=lambda task, timing: _executor(task_dir, tmp_path))
    said = out.getvalue() + capsys.readouterr().err
    assert code == 1, said
    assert "the float64 oracle skips " + ", ".join(c.name for c in run.task.holdout_cases) in said
    document = read_json(run.dir / "replay.json")
    assert {c["kind"] for c in document["checks"]} >= {"replay", "holdout"}
    assert not [c for c in document["checks"] if c["against"] == "oracle"]  # nothing large went through the oracle
    assert "no holdout-oracle check was made (the holdout cases against the float64 oracle)" in document["reasons"]
