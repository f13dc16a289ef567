"""Every command of the real command line, run as a process: one line on stderr naming the problem, the
documented exit code (README, "Exit codes"), never a traceback."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from server.cli_args import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE
from server.cli_errors import failed
from server.cost import CostError, run_hours
from tests.cli_support import REPO, one_line_error, run_cli
from tests.report_support import FIXTURE_RUNS

MATMUL = REPO / "cases" / "matmul_f32"
RUN = FIXTURE_RUNS / "h200-matmul-f32-small"
COST = ["--engineer-hours", "8", "--hourly-rate", "150", "--model-cost", "40", "--gpu-hour-cost", "4",
        "--invocations-per-month", "1000", "--ms-saved-end-to-end", "0.3"]


@pytest.fixture
def run_copy(tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(RUN, copy)
    return copy


@pytest.mark.parametrize("args, names", [
    (["check", "TASK", "--warmups", "-1"], "argument --warmups: -1 is out of range: from 0 to 10000"),
    (["check", "TASK", "--iterations", "0"], "argument --iterations: 0 is out of range: from 1 to 10000"),
    (["serve", "--task", "TASK", "--max-attempts", "-3"], "argument --max-attempts: -3 is out of range: from 1"),
    (["serve", "--task", "TASK", "--probes-per-window", "many"], "argument --probes-per-window: 'many' is not a "
                                                                  "whole number"),
    (["serve", "--task", "TASK", "--port", "70000"], "argument --port: 70000 is out of range"),
    (["demo", "--warmups", "-1"], "argument --warmups: -1 is out of range"),
    (["replay", "RUN", "--repeats", "0"], "argument --repeats: 0 is out of range: from 1 to 100"),
    (["replay", "RUN", "--attempt", "1000"], "argument --attempt: 1000 is out of range: from 0 to 999"),
    (["cost", "RUN", *COST[:-1], "-0.3"], "argument --ms-saved-end-to-end: -0.3 is not a finite number of zero"),
    (["report", "RUN", "--model-cost", "nan"], "argument --model-cost: nan is not a finite number of zero"),
    (["verify"], "the following arguments are required: run"),
])
def test_numbers_out_of_range_are_refused_as_they_are_parsed(tmp_path, args, names):
    args = [str(MATMUL) if a == "TASK" else str(RUN) if a == "RUN" else a for a in args]
    done = run_cli(*args, cwd=tmp_path)
    assert done.returncode == EXIT_USAGE and done.stdout == ""
    line = one_line_error(done)
    assert line.startswith(f"kernel-referee {args[0]}: ") and names in line, line
    assert not (tmp_path / "results").exists()


def test_a_bad_launch_is_one_line_without_pydantic_links(tmp_path):
    kernel = tmp_path / "k.cu"
    kernel.write_text((MATMUL / "initial.cu").read_text())
    done = run_cli("check", MATMUL, "--kernel", kernel, "--launch", json.dumps({"grid": [1]}), "--no-sandbox")
    assert done.returncode == EXIT_USAGE and done.stdout == ""
    line = one_line_error(done)
    assert line == "kernel-referee check: --launch is not a valid launch geometry: LaunchSpec: block: Field required"
    unparsable = run_cli("check", MATMUL, "--kernel", kernel, "--launch", "{grid", "--no-sandbox")
    assert unparsable.returncode == EXIT_USAGE
    assert one_line_error(unparsable).startswith("kernel-referee check: --launch is not JSON: ")


def test_a_launch_without_a_kernel_is_refused():
    done = run_cli("check", MATMUL, "--launch", json.dumps({"grid": [1], "block": [1]}))
    assert done.returncode == EXIT_USAGE and done.stdout == ""
    assert one_line_error(done) == ("kernel-referee check: --launch needs --kernel: the task's own reference and "
                                    "baseline use the task's launches")


def test_verify_tells_a_missing_folder_from_a_tampered_one(tmp_path, run_copy):
    missing = run_cli("verify", tmp_path / "nowhere")
    assert missing.returncode == EXIT_USAGE
    assert one_line_error(missing) == f"kernel-referee verify: {tmp_path / 'nowhere'}: no such run folder"
    assert run_cli("verify", tmp_path).returncode == EXIT_USAGE  # a folder, not a run's
    assert run_cli("verify", run_copy).returncode == 5  # intact, made before signing: a status of its own
    history = run_copy / "history.json"
    history.write_text(history.read_text().replace('"valid-not-faster"', '"valid-faster"', 1))
    tampered = run_cli("verify", run_copy)
    assert tampered.returncode == 1 and "FAILED" in tampered.stdout and tampered.stderr == ""


@pytest.mark.parametrize("summary", [[], "drop-updated"])
def test_cost_of_a_folder_whose_summary_was_changed_is_refused_in_one_line(run_copy, summary):
    path = run_copy / "summary.json"
    if summary == "drop-updated":
        document = json.loads(path.read_text())
        del document["updated"]
        summary = document
    path.write_text(json.dumps(summary))
    done = run_cli("cost", run_copy, *COST)
    assert done.returncode == EXIT_USAGE and done.stdout == ""
    line = one_line_error(done)
    assert line.startswith(f"kernel-referee cost: refused: {run_copy} does not verify (summary.json: ")
    assert line.endswith("so its hours cannot be trusted")


def test_cost_verifies_the_folder_before_it_reads_the_hours(run_copy):
    assert run_cli("cost", run_copy, *COST).returncode == 0
    history = run_copy / "history.json"
    history.write_text(history.read_text().replace('"valid-not-faster"', '"valid-faster"', 1))
    done = run_cli("cost", run_copy, *COST)
    assert done.returncode == EXIT_USAGE and "does not verify (history.json: " in one_line_error(done)
    missing = run_cli("cost", run_copy.parent / "nowhere", *COST)
    assert one_line_error(missing).endswith("nowhere: no such run folder") and missing.returncode == EXIT_USAGE


@pytest.mark.parametrize("change, names", [
    (lambda s: s.pop("updated"), "summary.json `updated` is missing"),
    (lambda s: s.update(updated="yesterday"), "summary.json `updated` is not an ISO time ('yesterday')"),
])
def test_the_hours_of_a_summary_without_its_time_are_a_cost_error(run_copy, change, names):
    path = run_copy / "summary.json"
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))
    with pytest.raises(CostError, match=names.replace("(", r"\(").replace(")", r"\)")):
        run_hours(run_copy)
    path.write_text("[]")
    with pytest.raises(CostError, match="run.json or summary.json cannot be read"):
        run_hours(run_copy)


def test_replay_and_report_refusals_go_to_stderr_in_one_line(tmp_path, run_copy):
    for command in ("replay", "report"):
        done = run_cli(command, tmp_path / "nowhere")
        assert done.returncode == EXIT_USAGE and done.stdout == ""
        assert one_line_error(done) == f"kernel-referee {command}: {tmp_path / 'nowhere'}: no such run folder"
    history = run_copy / "history.json"
    history.write_text(history.read_text().replace('"valid-not-faster"', '"valid-faster"', 1))
    done = run_cli("replay", run_copy)
    assert done.returncode == EXIT_USAGE and done.stdout == ""
    assert one_line_error(done).startswith(f"kernel-referee replay: refused: {run_copy} does not verify")


# The real demo command, its scripted agent against a real stdio server that uses the fake executor (so it
# plays on a CPU), interrupted as Ctrl-C does it. The server's preparation lasts a minute, so that the signal
# lands while the session is open (the fake executor plays the whole plan in a second or two: on a loaded
# machine the plan could end before a signal sent after its first compile arrives).
DEMO = textwrap.dedent("""
    import os, sys
    from mcp import StdioServerParameters
    from server import cli, demo
    demo.gpu_absent_reason = lambda: None
    demo.server_parameters = lambda task_dir, results, **options: StdioServerParameters(
        command=sys.executable, args=[{server!r}, str(results)], env={{**os.environ, "FAKE_SERVER_PREPARE_S": "60"}})
    sys.exit(cli.main(["demo", "--no-sandbox", "--results", sys.argv[1]]))
""")


def test_ctrl_c_in_demo_is_one_line_and_exit_130(tmp_path):
    code = DEMO.format(server=str(REPO / "tests" / "fake_server.py"))
    demo = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "results")], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        seen = ""
        while "is being prepared" not in seen:  # interrupted in the middle of the session, waiting for its run
            line = demo.stdout.readline()
            assert line, demo.stderr.read()
            seen += line
        demo.send_signal(signal.SIGINT)
        out, err = demo.communicate(timeout=60)
    finally:
        demo.kill()
    assert demo.returncode == EXIT_INTERRUPTED
    # The server's own log passes through on stderr before it; the demo adds exactly one line.
    assert err.endswith("kernel-referee demo: interrupted\n")
    assert err.count("kernel-referee demo:") == 1
    assert "Traceback" not in out + err


def test_an_error_inside_the_referee_is_one_line_naming_it(capsys):
    try:
        raise RuntimeError("the pool is gone\nsecond line")
    except RuntimeError as exc:
        assert failed("kernel-referee check", exc) == EXIT_INTERNAL
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("kernel-referee check: internal error (a bug in kernel-referee): RuntimeError: the pool "
                          "is gone; second line (at tests/test_cli_exit_codes.py:")
    with pytest.raises(SystemExit):
        failed("kernel-referee check", SystemExit(2))
    assert failed("kernel-referee demo", BaseExceptionGroup("g", [KeyboardInterrupt()])) == EXIT_INTERRUPTED



def test_ctrl_c_ends_the_demo_even_where_a_call_takes_a_cancellation_for_its_own():
    """asyncio's Ctrl-C cancels the main task once; a call that swallows that cancellation would let the demo play
    on. The demo's scope is cancelled for good: every later await is cancelled too, and KeyboardInterrupt follows."""
    import os

    import anyio

    from server.demo import interruptible

    swallowed: list[int] = []

    async def plays_on() -> str:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(3):
            try:
                await anyio.sleep(5)
            except anyio.get_cancelled_exc_class():
                swallowed.append(1)  # taken for its own, as a timeout's scope or a stream's cleanup may
        return "played on"

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        anyio.run(interruptible, plays_on)
    assert len(swallowed) == 3 and time.monotonic() - started < 4.5  # every sleep cancelled, none slept out
    assert anyio.run(interruptible, _answer) == 42  # not interrupted: its answer, the signal's handler restored
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


async def _answer() -> int:
    return 42
