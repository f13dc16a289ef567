"""approve where the executor that measures the accepted ratio fails (its start, a worker mid-round): a refusal on
one line with exit 1, as any refusal, never a traceback; --force falls back to the run's ratio, recorded."""

from __future__ import annotations

import io
import shutil

import pytest

from guard.cli import main
from guard.store import approval_dir, load_store
from sandbox.pool import WorkerCrashed
from server.executor import ExecutorError
from server.replay import replay
from tests.approval_support import NAME, fake, good_run, new_store
from tests.fake_executor import FakeExecutor


class StartFails(FakeExecutor):
    def start(self) -> dict:
        raise ExecutorError("the GPU worker could not start: CUDA_ERROR_NO_DEVICE")


class WorkerDies(FakeExecutor):
    def time(self, kernel, cases):
        raise WorkerCrashed("the GPU worker died (signal 9)")


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """A finished run with its GO replay recorded: approve goes straight to the accepted ratio's rounds."""
    run_dir = good_run(tmp_path_factory.mktemp("run"))
    assert replay(run_dir, io.StringIO(), repeats=1, make_executor=fake) == 0
    return run_dir


def _on_this_gpu(monkeypatch, executor: type[FakeExecutor]) -> None:
    """The command's own path to the rounds (no injected executor): this machine's GPU, here the failing fake."""
    monkeypatch.setattr("guard.approve.gpu_absent_reason", lambda: None)
    monkeypatch.setattr("guard.approve.sandbox_refusal", lambda confine: None)
    monkeypatch.setattr("guard.approve.local_executor",
                        lambda name, confine, gpu: lambda task, timing: executor(task, gpu="Fake GPU"))


@pytest.mark.parametrize("executor, said", [(StartFails, "ExecutorError: the GPU worker could not start"),
                                            (WorkerDies, "WorkerCrashed: the GPU worker died (signal 9)")])
def test_an_executor_that_fails_is_a_one_line_refusal_with_exit_1(replayed, tmp_path, monkeypatch, capsys,
                                                                   executor, said):
    run_dir = shutil.copytree(replayed, tmp_path / "run-001")
    store, key = new_store(tmp_path)
    _on_this_gpu(monkeypatch, executor)
    args = ["approve", str(run_dir), "--store", str(store), "--name", NAME, "--key", str(key), "--ratio-rounds", "8"]
    assert main(args) == 1
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("kernel-referee approve: refused: the accepted ratio could not be measured, its "
                               "executor failed: ") and said in lines[0] and "--from-run" in lines[0]
    assert not approval_dir(store, NAME).exists()
    # --force: the run's own ratio, the failure recorded as what was overridden
    assert main(args + ["--force"]) == 0, capsys.readouterr().err
    approval = load_store(store)[0].approval
    assert approval.ratio_measurement.source == "run" and said in approval.provenance.forced_over[0]
