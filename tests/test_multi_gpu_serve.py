"""Runs on a host of several (fake) GPUs: `serve --gpu N|UUID`, placement on a free GPU by real server processes
(tests/fake_server.py with $FAKE_SERVER_GPUS), and a run that never moves to another GPU."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import server.replay
from harness.gpu_lease import LEASE_DIR_ENV
from server.cli import main
from server.lifecycle import resume_run
from server.replay import replay
from server.run import RunError
from tests.fake_executor import FAKE_GPU_UUID, FakeExecutor, fake_gpus
from tests.lease_holder import LeaseHolder
from tests.server_support import REPO, events, executor, kernel, new_run
from tests.test_replay import make_run

FAKE_SERVER = str(REPO / "tests" / "fake_server.py")
TWO = fake_gpus(2)


def _start(results: Path, gpus: int, gpu: str | None = None) -> subprocess.Popen:
    """A fake server over stdio that serves until its stdin closes."""
    env = {LEASE_DIR_ENV: os.environ[LEASE_DIR_ENV], "FAKE_SERVER_GPUS": str(gpus), "PATH": os.environ["PATH"]}
    if gpu is not None:
        env["FAKE_SERVER_GPU"] = gpu
    return subprocess.Popen([sys.executable, FAKE_SERVER, str(results)], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)


def _locked_gpu(run_dir: Path, server: subprocess.Popen) -> tuple[int, str]:
    """(gpu_index, gpu_uuid) of a run's lock, once its server has written it."""
    deadline = time.monotonic() + 90
    while not (run_dir / "history.json").exists():
        assert server.poll() is None, server.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    environment = json.loads((run_dir / "lock.json").read_text())["environment"]
    return environment["gpu_index"], environment["gpu_uuid"]


def _stop(server: subprocess.Popen) -> str:
    server.stdin.close()
    server.wait(timeout=60)
    return server.stderr.read()


def _serve_once(results: Path, gpus: int, gpu: str) -> subprocess.CompletedProcess:
    server = _start(results, gpus, gpu)
    err = _stop(server)
    return subprocess.CompletedProcess(server.args, server.returncode, "", err)


def test_two_servers_on_a_two_gpu_host_take_different_gpus(tmp_path):
    results = tmp_path / "results"
    first = _start(results, 2)
    try:
        assert _locked_gpu(results / "run-001", first) == (0, TWO[0].uuid)
        second = _start(results, 2)
        try:
            assert _locked_gpu(results / "run-002", second) == (1, TWO[1].uuid)
        finally:
            assert f"on GPU 1 ({TWO[1].uuid})" in _stop(second)
    finally:
        _stop(first)
    created = [e for e in events(results / "run-002") if e["kind"] == "run_created"][0]["data"]
    assert (created["gpu_index"], created["gpu_uuid"]) == (1, TWO[1].uuid)
    assert main(["verify", str(results / "run-002")]) == 0


@pytest.mark.parametrize("choice", ["1", TWO[1].uuid])
def test_gpu_by_index_or_uuid(tmp_path, choice):
    results = tmp_path / "results"
    server = _start(results, 2, choice)
    try:
        assert _locked_gpu(results / "run-001", server) == (1, TWO[1].uuid)
    finally:
        _stop(server)


@pytest.mark.parametrize("choice", ["2", "GPU-00000000-0000-0000-0000-000000000000", "second"])
def test_an_unknown_gpu_is_refused_in_one_line_and_makes_no_run(tmp_path, choice):
    results = tmp_path / "results"
    done = _serve_once(results, 2, choice)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("kernel-referee: ")
    assert not results.exists() or not list(results.glob("run-*"))


def test_a_resumed_run_goes_back_on_its_gpu_and_never_moves(tmp_path):
    results = tmp_path / "results"
    server = _start(results, 2, "1")
    try:
        _locked_gpu(results / "run-001", server)
    finally:
        _stop(server)
    run_dir = results / "run-001"
    again = _start(run_dir, 2)  # no --gpu: back on GPU 1, its own
    assert "on GPU 1" in _stop(again) and again.returncode == 0
    moved = _serve_once(run_dir, 2, "0")
    assert moved.returncode == 2
    assert f"run-001 began on another GPU: gpu_uuid: {TWO[1].uuid} -> {TWO[0].uuid}" in moved.stderr
    kinds = [e["kind"] for e in events(run_dir)]
    assert kinds.count("run_resumed") == 1  # the refused resume wrote nothing
    assert main(["verify", str(run_dir)]) == 0


def test_a_resume_on_another_uuid_is_refused_and_an_old_lock_is_not(tmp_path):
    run = new_run(tmp_path)
    run.close()
    with pytest.raises(RunError, match=f"began on another GPU: gpu_uuid: {FAKE_GPU_UUID} -> GPU-other"):
        resume_run(run.dir, executor(gpu_uuid="GPU-other"))
    lock = json.loads((run.dir / "lock.json").read_text())
    assert lock["environment"]["gpu_index"] == 0
    resume_run(run.dir, executor()).close()
    resume_run(run.dir, executor(gpu_uuid=None)).close()  # a GPU whose UUID cannot be read here: not refused
    for key in ("gpu_uuid", "gpu_index"):  # as a run locked before the GPU was named by UUID
        del lock["environment"][key]
    (run.dir / "lock.json").chmod(0o644)
    (run.dir / "lock.json").write_text(json.dumps(lock))
    resumed = resume_run(run.dir, executor(gpu_uuid="GPU-other"))
    resumed.close()
    assert [e["data"]["environment_changes"] for e in events(run.dir) if e["kind"] == "run_resumed"][-1] == []


def _replayed_on(monkeypatch, run_dir: Path, gpu: str | None) -> list:
    """`replay` as on a two-GPU host (its GpuExecutor a fake placed where the real one would be): where it went."""
    placed = []

    def on_gpu(task, timing, gpu=None, **options):
        placed.append(gpu)
        return FakeExecutor(task, placed=gpu)

    monkeypatch.setattr(server.replay, "gpu_absent_reason", lambda: None)
    monkeypatch.setattr(server.replay, "list_gpus", lambda: TWO)
    monkeypatch.setattr(server.replay, "GpuExecutor", on_gpu)
    assert replay(run_dir, io.StringIO(), repeats=1, gpu=gpu) == 0
    return placed


def test_replay_goes_on_the_runs_own_gpu_unless_told(monkeypatch, tmp_path):
    run_dir = make_run(tmp_path, kernel("latency_us=50"))  # began on fake GPU 0
    other = LeaseHolder(TWO[0].uuid, "serve run-009", serving=True)  # a serving run holds GPU 0
    try:
        assert _replayed_on(monkeypatch, run_dir, None) == [TWO[0]]  # its own, shared: not the free GPU 1
        assert _replayed_on(monkeypatch, run_dir, "1") == [TWO[1]]
    finally:
        other.close()


@pytest.mark.parametrize("command", ["check", "replay"])
def test_a_malformed_gpu_is_refused_by_check_and_replay_in_one_line(tmp_path, capsys, command):
    target = str(REPO / "cases" / "matmul_f32") if command == "check" else str(make_run(tmp_path))
    assert main([command, target, "--gpu", "the-big-one"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "neither a GPU index" in err
