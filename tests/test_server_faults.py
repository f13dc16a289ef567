"""The server under faults: probe limits, tampering, resumption, a killed server, bad input, verify, no GPU."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from harness.device import gpu_absent_reason
from server.verify import verify_run
from server.cli import main
from server.lifecycle import resume_run
from server.run import RunError
from tests.cli_support import run_cli
from tests.server_support import (HOLDOUT, MATMUL, REPO, client, events, executor, kernel, new_run, ok,
                                  read_json, refused)

PROBES = ("validate", "run_cases", "time_kernel")
LIMIT = "probe limit reached for this attempt window (3 probes or 120 GPU seconds). Record an attempt with " \
        "record_attempt ("



@pytest.mark.anyio
async def test_probes_are_limited_per_window_and_the_count_survives_a_resume(tmp_path):
    run = new_run(tmp_path, probes_per_window=3)
    async with client(run) as c:
        for tool in PROBES:
            await ok(c, tool, source=kernel())
        for tool in PROBES:
            assert (await refused(c, tool, source=kernel())).startswith(LIMIT + "7 left) to open a new window")
        answer = await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="faster")
        assert answer["budget"]["probes_left_in_window"] == 3
        assert (await ok(c, "validate", source=kernel()))["budget"]["probes_left_in_window"] == 2
    run.close()

    run = resume_run(run.dir, executor())
    assert run.budget().probes_left_in_window == 2 and run.probes_total == 4
    async with client(run) as c:
        assert (await ok(c, "run_cases", source=kernel(), cases=["square-2048"]))["budget"]["probes_left_in_window"] == 1
        await ok(c, "time_kernel", source=kernel())
        assert (await refused(c, "validate", source=kernel())).startswith(LIMIT + "6 left)")
        assert (await ok(c, "describe_task"))["budget"]["probes_left_in_window"] == 0
    run.close()


@pytest.mark.anyio
@pytest.mark.parametrize("locked", ["task/initial.cu", "expected/square-2048/0/c.npy"])
async def test_a_changed_locked_file_refuses_every_call_and_the_resume(tmp_path, locked):
    run = new_run(tmp_path)
    path = run.dir / locked
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[-2] ^= 1
    path.write_bytes(bytes(data))
    async with client(run) as c:
        for tool, arguments in [("describe_task", {}), ("validate", {"source": kernel()}),
                                ("record_attempt", {"source": kernel(), "rationale": "r"})]:
            message = await refused(c, tool, **arguments)
            assert message.startswith(f"refused: the run's locked files changed ({locked} changed)")
    tampers = [e["data"] for e in events(run.dir) if e["kind"] == "tamper"]
    assert [t["tool"] for t in tampers] == ["describe_task", "validate", "record_attempt"]
    assert tampers[0]["problems"] == [f"{locked} changed"]
    assert run.attempts_used == 0
    run.close()
    with pytest.raises(RunError, match=f"was tampered with: {locked} changed"):
        resume_run(run.dir, executor())


@pytest.mark.anyio
async def test_a_resumed_run_continues_its_budget_and_history(tmp_path):
    run = new_run(tmp_path)
    async with client(run) as c:
        await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="one")
        await ok(c, "record_attempt", source=kernel("wrong"), rationale="two")
    run.close()

    with pytest.raises(RunError, match="began on another GPU: gpu: Fake GPU -> Other GPU"):
        resume_run(run.dir, executor(gpu="Other GPU"))
    run = resume_run(run.dir, executor())
    assert (run.attempts_used, run.budget().attempts_left) == (2, 5)
    assert [(e.attempt, e.verdict) for e in run.history] == [(0, "baseline"), (1, "valid-faster"),
                                                                   (2, "rejected")]
    async with client(run) as c:
        assert (await ok(c, "describe_task"))["best_attempt"] == 1
        answer = await ok(c, "record_attempt", source=kernel("latency_us=30"), rationale="three")
        assert (answer["attempt"], answer["verdict"], answer["best_attempt"]) == (3, "valid-faster", 3)
        assert answer["budget"]["attempts_left"] == 4
    run.close()
    kinds = [e["kind"] for e in events(run.dir)]
    assert kinds.count("run_resumed") == 1 and kinds.count("attempt_interrupted") == 0
    assert verify_run(run.dir).ok


def test_verify_names_the_first_broken_record(tmp_path, capsys):
    run = new_run(tmp_path)
    run.close()
    assert main(["verify", str(run.dir)]) == 0
    assert capsys.readouterr().out.startswith(f"{run.dir}: ok (")

    saved = tmp_path / "events.saved"  # outside the run folder: a file added there fails verify
    shutil.copy(run.dir / "events.jsonl", saved)
    lines = (run.dir / "events.jsonl").read_bytes().split(b"\n")
    at = lines[4].index(b'"kind":"') + 8
    lines[4] = lines[4][:at] + bytes([lines[4][at] ^ 0x20]) + lines[4][at + 1:]  # one letter's case flipped
    (run.dir / "events.jsonl").write_bytes(b"\n".join(lines))
    assert main(["verify", str(run.dir)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{run.dir}: FAILED (first broken record: events.jsonl line 5)")
    assert "events.jsonl line 5: hash does not match its contents (record edited)" in out

    shutil.copy(saved, run.dir / "events.jsonl")
    assert main(["verify", str(run.dir)]) == 0
    history = run.dir / "history.json"
    history.write_bytes(history.read_bytes().replace(b'"baseline"', b'"baselinE"', 1))
    assert main(["verify", str(run.dir)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-2:] == [f"{run.dir}: FAILED", f"  history.json: sha256 differs from the last recorded write "
                        f"(events.jsonl line {_last_write(run.dir, 'history.json')})"]


def _leaves(error: BaseException):
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error


def _last_write(run_dir, name: str) -> int:
    return max(n for n, e in enumerate(events(run_dir), start=1) if e["data"].get("path") == name)


@pytest.mark.anyio
async def test_a_server_killed_mid_attempt_counts_the_attempt_once(tmp_path):
    results = tmp_path / "results"
    params = StdioServerParameters(command=sys.executable, args=[str(REPO / "tests" / "fake_server.py"), str(results)],
                                   cwd=str(tmp_path))
    with pytest.raises(BaseExceptionGroup) as caught:
        async with Client(params, cache=None, read_timeout_seconds=60) as c:
            first = await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="faster")
            assert (first["attempt"], first["verdict"]) == (1, "valid-faster")
            await c.call_tool("record_attempt", {"source": kernel("die"), "rationale": "dies while timed"})
    errors = list(_leaves(caught.value))
    assert [(type(e), str(e)) for e in errors] == [(MCPError, "Connection closed")], errors

    run_dir = results / "run-001"
    assert sorted(p.name for p in (run_dir / "attempts").iterdir()) == ["000.cu", "001.cu", "002.cu"]
    run = resume_run(run_dir, executor())
    assert run.attempts_used == 2
    interrupted = run.history[-1]
    assert (interrupted.attempt, interrupted.verdict) == (2, "rejected")
    assert interrupted.reasons[0].code == "worker_crashed"
    assert "interrupted" in interrupted.reasons[0].detail
    assert read_json(run_dir / "summary.json")["budget"] == {"max_attempts": 7, "used": 2, "left": 5}
    report = verify_run(run_dir)
    assert report.ok, report.problems
    async with client(run) as c:
        third = await ok(c, "record_attempt", source=kernel("latency_us=40"), rationale="after the restart")
        assert (third["attempt"], third["budget"]["attempts_used"]) == (3, 3)
    run.close()
    assert [e["data"]["attempt"] for e in events(run_dir) if e["kind"] == "attempt_interrupted"] == [2]
    assert [e["attempt"] for e in read_json(run_dir / "history.json")["attempts"]] == [0, 1, 2, 3]
    assert verify_run(run_dir).ok


BAD_LAUNCHES = [
    ({"grid": [0, 1], "block": [16, 16]}, "invalid launch geometry: grid[0]: '0' is 0 for case 'odd-31x37x29'; "
                                          "must be >= 1"),
    ({"grid": ["ceil_div(q, 16)", "m"], "block": [16, 16]},
     "invalid launch geometry: grid[0]: unknown name 'q' (known: m, n, k) in 'ceil_div(q, 16)'"),
    ({"grid": [1, 1, 1, 1], "block": [16, 16]}, "launch.grid\n  List should have at most 3 items"),
]


@pytest.mark.anyio
async def test_bad_tool_input_is_refused_without_spending_anything(tmp_path):
    run = new_run(tmp_path)
    async with client(run) as c:
        message = await refused(c, "validate", candidate_id="c0123456789abcde")
        assert message.startswith("unknown candidate id 'c0123456789abcde'")
        assert (await refused(c, "run_cases")).startswith("give exactly one of `candidate_id` (an id from")
        candidate = (await ok(c, "compile_kernel", source=kernel()))["candidate"]
        assert (await refused(c, "record_attempt", candidate_id=candidate, source=kernel(), rationale="r")) \
            .startswith("give exactly one of `candidate_id` (an id from compile_kernel)")
        for launch, words in BAD_LAUNCHES:
            for tool in ("validate", "compile_kernel"):
                assert words in await refused(c, tool, source=kernel(), launch=launch)
        for cases in (["nope"], [HOLDOUT]):
            assert (await refused(c, "run_cases", candidate_id=candidate, cases=cases)).startswith(
                f"unknown case(s) {cases}; the visible cases are")
        assert (await refused(c, "time_kernel", candidate_id=candidate, cases=["odd-31x37x29"])).startswith(
            "unknown case(s) ['odd-31x37x29']; the performance cases are")
        assert (await refused(c, "compile_kernel", source=kernel(), options=["-rdc=true"])).startswith(
            "option '-rdc=true' is refused: relocatable device code")
        assert "rationale\n  String should have at most 4000 characters" in await refused(
            c, "record_attempt", candidate_id=candidate, rationale="x" * 4001)
        assert await refused(c, "record_attempt", source=kernel() + "\0", rationale="r") == \
            "the source contains a NUL byte; remove it"
        assert (await refused(c, "record_attempt", source="é" * 150_000, rationale="r")).startswith(
            "the source is 300000 bytes; at most 262144")
        budget = (await ok(c, "describe_task"))["budget"]
    assert (budget["attempts_used"], budget["probes_left_in_window"]) == (0, 20)
    assert run.attempts_used == 0 and [e.attempt for e in run.history] == [0]
    assert sorted(p.name for p in (run.dir / "attempts").iterdir()) == ["000.cu"]
    run.close()
    assert verify_run(run.dir).ok


@pytest.mark.skipif(gpu_absent_reason() is None, reason="this machine has a GPU")
def test_serve_without_a_gpu_exits_3_and_says_why(tmp_path):
    done = run_cli("serve", "--task", MATMUL, cwd=tmp_path, timeout=60)
    assert (done.returncode, done.stdout) == (3, "")
    assert done.stderr.startswith("kernel-referee serve needs an NVIDIA GPU: ")
    assert not (tmp_path / "results").exists()


@pytest.mark.anyio
async def test_an_error_inside_an_attempt_records_the_attempt_as_rejected(tmp_path, monkeypatch):
    run = new_run(tmp_path)

    def broken(*args):
        raise RuntimeError("the worker pool is gone")

    async with client(run) as c:
        monkeypatch.setattr(run.executor, "time", broken)
        result = await c.call_tool("record_attempt", {"source": kernel(), "rationale": "r"})
        assert result.is_error and result.content[0].text == "Error executing tool record_attempt"
        monkeypatch.undo()
        assert [(e["attempt"], e["verdict"]) for e in read_json(run.dir / "history.json")["attempts"]] == \
            [(0, "baseline"), (1, "rejected")]
        reason = run.history[1].reasons[0]
        assert reason.code == "worker_crashed" and "the worker pool is gone" in reason.detail
        assert read_json(run.dir / "summary.json")["budget"]["used"] == 1
        again = await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="again")
        assert (again["attempt"], again["verdict"], again["budget"]["attempts_used"]) == (2, "valid-faster", 2)
    run.close()
    assert verify_run(run.dir).ok
    run = resume_run(run.dir, executor())
    assert [e.attempt for e in run.history] == [0, 1, 2] and run.attempts_used == 2
    run.close()


def test_serve_with_the_same_task_finds_the_unfinished_run_to_resume(tmp_path):
    from server.serve import latest_unfinished_run

    results = tmp_path / "results"
    assert latest_unfinished_run(results, MATMUL) is None
    first = new_run(tmp_path)
    first.close()
    assert latest_unfinished_run(results, MATMUL) == first.dir
    other_task = tmp_path / "other"
    shutil.copytree(MATMUL, other_task)
    (other_task / "initial.cu").write_text((other_task / "initial.cu").read_text() + "\n// changed\n")
    assert latest_unfinished_run(results, other_task) is None
    summary = json.loads((first.dir / "summary.json").read_text())
    (first.dir / "summary.json").write_text(json.dumps({**summary, "status": "finished"}))
    assert latest_unfinished_run(results, MATMUL) is None


@pytest.mark.anyio
async def test_deleting_an_attempt_file_gives_no_attempt_back(tmp_path):
    run = new_run(tmp_path, max_attempts=3)
    async with client(run) as c:
        await ok(c, "record_attempt", source=kernel("latency_us=90"), rationale="one")
        await ok(c, "record_attempt", source=kernel("latency_us=80"), rationale="two")
        (run.dir / "attempts" / "002.cu").unlink()
        assert (await ok(c, "describe_task"))["budget"]["attempts_left"] == 1
        third = await ok(c, "record_attempt", source=kernel("latency_us=70"), rationale="three")
        assert third["attempt"] == 3 and third["budget"]["attempts_left"] == 0
    assert [e.attempt for e in run.history] == [0, 1, 2, 3]
    assert run.summary.status == "finished"
    assert any("attempts/002.cu" in p and "missing" in p for p in verify_run(run.dir).problems)


@pytest.mark.anyio
async def test_a_holdout_check_that_breaks_disqualifies_instead_of_crashing(tmp_path):
    run = new_run(tmp_path)
    async with client(run) as c:
        await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="fast")

        def broken(kernel, cases, seeds=None, against_oracle=False):
            if cases and cases[0].role == "holdout" and kernel.label != run.history[0].candidate:
                raise OverflowError("value too large to convert to int")
            return original(kernel, cases, seeds, against_oracle)

        original, run.executor.check = run.executor.check, broken
        finished = await ok(c, "finish", reason="done")
    assert finished["disqualified"] == [1] and finished["best_attempt"] == 0
    assert run.summary.status == "finished" and run.summary.holdout["passed"]
    assert verify_run(run.dir).ok


@pytest.mark.anyio
async def test_a_disqualified_best_is_never_replaced_by_an_attempt_slower_than_the_baseline(tmp_path):
    run = new_run(tmp_path)
    async with client(run) as c:
        await ok(c, "record_attempt", source=kernel("latency_us=50", "wrong-holdout"), rationale="fast, wrong")
        slow = await ok(c, "record_attempt", source=kernel("latency_us=300"), rationale="slow")
        assert slow["verdict"] == "valid-not-faster"
        finished = await ok(c, "finish", reason="done")
    assert finished["disqualified"] == [1] and finished["best_attempt"] == 0


@pytest.mark.anyio
async def test_refused_calls_register_no_candidate(tmp_path):
    run = new_run(tmp_path, probes_per_window=1)
    async with client(run) as c:
        await ok(c, "validate", source=kernel())
        before = sorted(p.name for p in (run.dir / "candidates").iterdir())
        for n in range(5):
            await refused(c, "validate", source=kernel(f"v{n}"))
        assert sorted(p.name for p in (run.dir / "candidates").iterdir()) == before
