"""The server's gate for a run not yet prepared that answers compiles meanwhile (server/early_compiles.py): through a
real MCP client, compile_kernel answers from NVRTC with nothing written to the run folder, every other tool is
refused with nothing spent, and once the run is prepared its compiles are its candidates and the folder verifies."""

from __future__ import annotations

import pytest

from server import lifecycle
from server.early_compiles import EarlyCompiles
from server.preparation import Preparation, prepare_behind
from server.run import RunSettings
from server.verify import verify_run
from tests.server_support import MATMUL, client, executor, kernel, ok, refused


@pytest.mark.anyio
async def test_a_run_that_waits_answers_compiles_only_and_records_them_once_prepared(tmp_path):
    results = tmp_path / "results"
    run = lifecycle.begin_new_run(MATMUL, results, RunSettings(), executor())
    waiting = Preparation(lambda _progress: None, wait_s=0.0)  # never ready: refuses at once
    waiting.early = EarlyCompiles("sm_90")
    run.preparation = waiting
    try:
        async with client(run) as c:
            broken = await ok(c, "compile_kernel", source=kernel() + "\nnot C++ at all;\n")
            assert broken["ok"] is False and "error" in broken["log"], broken
            good = await ok(c, "compile_kernel", source=kernel("latency_us=40"))
            assert good["ok"] is True and good["resources"]["registers"] > 0, good
            for tool, arguments in (("validate", {"candidate_id": good["candidate"]}),
                                    ("record_attempt", {"candidate_id": good["candidate"], "rationale": "early"})):
                why = await refused(c, tool, **arguments)
                assert why.startswith("preparing") and "Nothing was spent" in why, why
            events = run.dir / "events.jsonl"
            assert not events.exists() or events.read_text() == ""  # the log begins with the run's creation
            assert not (run.dir / "candidates").exists()
            waiting.early.close()
            prepare_behind(run, results, on_ready=waiting.early.record_into)
            assert run.preparation.wait(60) and run.preparation.ready, run.preparation.error
            assert good["candidate"] in run.candidates and broken["candidate"] in run.candidates
            checked = await ok(c, "validate", candidate_id=good["candidate"])
            assert checked["passed"], checked
            assert run.budget().attempts_used == 0
    finally:
        run.close()
    report = verify_run(run.dir)
    assert report.ok, report.problems
    assert (run.dir / "compile-logs" / f"{good['candidate']}.log").read_text()


def test_a_journal_gives_back_its_candidates_and_leaves_out_a_torn_or_foreign_line(tmp_path):
    from harness.task_model import LaunchSpec
    from server.candidates import Candidate, candidate_id
    from server.early_compiles import _append, read_journal

    launch = LaunchSpec.model_validate({"grid": ["ceil_div(n, 16)", "ceil_div(m, 16)"], "block": [16, 16]})
    made = [Candidate(candidate_id(src, opts, launch), src, opts, launch)
            for src, opts in ((kernel("latency_us=40"), ()), (kernel("latency_us=30"), ("-use_fast_math",)))]
    journal = tmp_path / "queued-compiles.jsonl"
    for candidate, log in zip(made, ("", "warning: something")):
        _append(journal, candidate, log)
    assert read_journal(journal) == [(made[0], ""), (made[1], "warning: something")]
    whole = journal.read_text()
    journal.write_text(whole + '{"source": "cut by a ki')  # a kill during the append
    assert [c.id for c, _ in read_journal(journal)] == [c.id for c in made]
    journal.write_text(whole.replace("latency_us=30", "latency_us=31") + '{"no": "candidate"}\n')
    back = read_journal(journal)
    assert back[0][0] == made[0] and back[1][0].id != made[1].id  # a line changed by hand is another candidate
    assert len(back) == 2
    assert read_journal(tmp_path / "none.jsonl") == []
    early = EarlyCompiles.reload("sm_90", journal)
    assert set(early.candidates) == {c.id for c, _ in back} and early.log(back[1][0].id) == "warning: something"
