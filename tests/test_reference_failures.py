"""A task whose reference (or oracle) fails reaches a person as one line naming the case and the reason, never a
traceback: at the command line (check, serve, replay) and as a tool error in a tool call."""

from __future__ import annotations

import io
import logging

import pytest

from harness.oracle import OracleError
from harness.settings import ReferenceFailed
from harness.task import load_task
from server import lifecycle
from server import serve as serve_module
from server.cli import main
from server.cli_args import EXIT_USAGE
from server.cli_errors import failed
from server.executor import ExecutorError
from server.replay import replay
from server.run import RunSettings
from server.verify import verify_run
from tests.fake_executor import FakeExecutor
from tests.server_support import MATMUL, client, kernel, new_run, ok, read_json, refused
from tests.test_replay import make_run

TIMEOUT = "timeout: still running after 10 s; the worker was killed"


class ReferenceFailsOnFreshInputs(FakeExecutor):
    """The reference fails on the secret inputs of an attempt and on the inputs timing audits."""

    def check(self, kernel, cases, seeds=None, against_oracle=False):
        if seeds:
            raise ReferenceFailed(cases[0].name, TIMEOUT)
        return super().check(kernel, cases, seeds, against_oracle)

    def time(self, kernel, cases):
        raise ReferenceFailed(cases[0].name, "timeout on the inputs of audited launches: still running after 10 s")


class ReferenceFailsAtOnce(FakeExecutor):
    def expected(self, case, seed):
        raise ReferenceFailed(case.name, TIMEOUT)



def test_a_failing_reference_or_oracle_is_one_line_and_the_usage_exit_code(capsys):
    assert failed("kernel-referee check", ReferenceFailed("kb-4096x393216", TIMEOUT)) == EXIT_USAGE
    assert capsys.readouterr().err == ("kernel-referee check: the task's reference kernel failed on case "
                                       f"kb-4096x393216: {TIMEOUT}\n")
    assert failed("kernel-referee check", OracleError("oracle.py failed on case odd: KeyError: 'x' (line 3)")) \
        == EXIT_USAGE
    assert capsys.readouterr().err == "kernel-referee check: oracle.py failed on case odd: KeyError: 'x' (line 3)\n"
    assert failed("kernel-referee serve", ExecutorError("the task's reference does not compile:\nerror: x\n")) \
        == EXIT_USAGE
    assert capsys.readouterr().err == "kernel-referee serve: the task's reference does not compile: error: x\n"


def test_a_reason_over_several_lines_is_said_on_one():
    assert str(ReferenceFailed("odd", "out_of_bounds_write:\n  3 bytes")) == \
        "the task's reference kernel failed on case odd: out_of_bounds_write: 3 bytes"


@pytest.mark.anyio
async def test_in_a_tool_call_it_is_a_tool_error_naming_the_case_and_the_attempt_stays_counted(tmp_path):
    run = new_run(tmp_path)
    run.executor.__class__ = ReferenceFailsOnFreshInputs  # the baseline was judged; the reference breaks now
    async with client(run) as c:
        said = await refused(c, "record_attempt", source=kernel("latency_us=50"), rationale="r")
        assert said.startswith(f"the task's reference kernel failed on case odd-31x37x29: {TIMEOUT}. The task's "
                               "own code failed, not the kernel you sent")
        said = await refused(c, "time_kernel", source=kernel("latency_us=50"))
        assert said.startswith("the task's reference kernel failed on case square-2048: timeout on the inputs")
        budget = (await ok(c, "describe_task"))["budget"]
        assert budget["attempts_used"] == 1
    assert [(e["attempt"], e["verdict"]) for e in read_json(run.dir / "history.json")["attempts"]] == \
        [(0, "baseline"), (1, "rejected")]
    run.close()
    assert verify_run(run.dir).ok


def test_serve_says_it_in_one_line_and_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(serve_module, "gpu_absent_reason", lambda: None)
    monkeypatch.setattr(serve_module, "GpuExecutor", lambda task, timing, **options: ReferenceFailsAtOnce(task))
    # A client that stays while the run is prepared behind the server: serving ends once the preparation has.
    monkeypatch.setattr(serve_module, "build_server", lambda run, **options: run)
    monkeypatch.setattr(serve_module.transport, "run", lambda run, *args, **options: run.preparation.wait(60))
    code = main(["serve", "--task", str(MATMUL), "--results", str(tmp_path / "results"), "--no-sandbox"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and "Traceback" not in err
    assert err.splitlines()[-1] == ("kernel-referee: the run could not be prepared: the task's reference kernel "
                                    f"failed on case odd-31x37x29: {TIMEOUT}")
    assert not list((tmp_path / "results").glob("run-*"))


def test_replay_is_no_go_naming_the_case_without_a_traceback(tmp_path, caplog):
    run_dir = make_run(tmp_path, kernel("latency_us=50"))
    with caplog.at_level(logging.WARNING, logger="server.replay"):
        code = replay(run_dir, io.StringIO(), make_executor=lambda task, timing: ReferenceFailsOnFreshInputs(task))
    assert code == 1
    document = read_json(run_dir / "replay.json")
    assert document["decision"] == "NO-GO"
    assert any("the task's reference kernel failed on case" in reason for reason in document["reasons"])
    (record,) = [r for r in caplog.records if r.getMessage().startswith("the replay could not complete")]
    assert not record.exc_info and "the task's reference kernel failed on case" in record.getMessage()


@pytest.mark.anyio
async def test_a_reference_failing_on_the_holdout_is_logged_in_one_line(tmp_path, caplog):
    run = new_run(tmp_path)

    def broken(kernel, cases, seeds=None, against_oracle=False):
        if cases and cases[0].role == "holdout":
            raise ReferenceFailed(cases[0].name, TIMEOUT)
        return original(kernel, cases, seeds, against_oracle)

    async with client(run) as c:
        original, run.executor.check = run.executor.check, broken
        with caplog.at_level(logging.WARNING, logger="server.holdout"):
            finished = await ok(c, "finish", reason="done")
    assert not finished["holdout"]["passed"]
    records = [r for r in caplog.records if r.name == "server.holdout"]
    assert records and not any(r.exc_info for r in records)
    assert "the task's reference kernel failed on case holdout-97x83x61" in records[0].getMessage()
    run.close()


class ReferenceFailsWhenTimed(FakeExecutor):
    def time(self, kernel, cases):
        raise ReferenceFailed(cases[0].name, "timeout on the inputs of audited launches: still running after 10 s")


@pytest.mark.parametrize("failing", [ReferenceFailsAtOnce, ReferenceFailsWhenTimed],
                         ids=["expected-outputs", "baseline"])
def test_a_new_run_that_fails_before_its_baseline_leaves_no_folder(tmp_path, failing):
    results = tmp_path / "results"
    with pytest.raises(ReferenceFailed):
        lifecycle.new_run(MATMUL, results, RunSettings(), failing(load_task(MATMUL)))
    assert list(results.iterdir()) == []  # no half-made run-001 for a person or a resume to trip over
    run = new_run(tmp_path)  # the next run takes the number
    try:
        assert run.dir == results / "run-001" and verify_run(run.dir).ok
    finally:
        run.close()
