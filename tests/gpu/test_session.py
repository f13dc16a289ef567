"""A scripted agent session over stdio against the installed console script, on the H200:
compile -> validate -> time -> record seven times (the demo's candidates), the eighth refused, the
audit folder right."""

import json
import re
import shutil
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from server.verify import verify_run
from server.demo import PLAN
from tests.server_support import prepared
from tests.test_cli import MATMUL

pytestmark = pytest.mark.gpu
REJECTED = {"edge bug (k tail dropped)", "does not compile"}


def console_script() -> str:
    return shutil.which("kernel-referee") or str(Path(sys.executable).with_name("kernel-referee"))


def plan() -> list[tuple[str, list[str], dict, str]]:
    """(source, options, launch, what the referee must say) for seven attempts: `kernel-referee demo`'s plan."""
    return [(step.source, list(step.options), step.launch, "rejected" if step.label in REJECTED else "valid")
            for step in PLAN]


async def session(results: Path) -> tuple[list[dict], dict, str]:
    params = StdioServerParameters(command=console_script(), args=[
        "serve", "--task", str(MATMUL), "--results", str(results), "--iterations", "40", "--warmups", "5"])
    answers = []
    async with Client(params, cache=None) as client:  # describe_task is read until the run is prepared
        description = await prepared(client, within_s=300.0)
        assert description["budget"]["attempts_left"] == 7
        assert "holdout-97x83x61" not in {c["name"] for c in description["cases"]}
        for source, options, launch, expected in plan():
            compiled = await client.call_tool("compile_kernel", {"source": source, "options": options,
                                                                 "launch": launch})
            assert not compiled.is_error, compiled.content
            cid = compiled.structured_content["candidate"]
            if compiled.structured_content["ok"]:
                validated = await client.call_tool("validate", {"candidate_id": cid})
                assert validated.structured_content["passed"] == (expected == "valid")
                timed = await client.call_tool("time_kernel", {"candidate_id": cid})
                assert timed.is_error == (expected != "valid"), timed.content
            recorded = await client.call_tool("record_attempt", {"candidate_id": cid, "rationale": f"try {len(answers)}",
                                                                 "usage": {"model": "scripted", "calls": 3}})
            assert not recorded.is_error, recorded.content
            answers.append(recorded.structured_content)
        eighth = await client.call_tool("record_attempt", {"source": plan()[0][0], "rationale": "one more"})
        assert eighth.is_error
        summary = json.loads((await client.read_resource("referee://summary.json")).contents[0].text)
        refusal = eighth.content[0].text
    return answers, summary, refusal


def test_scripted_session_spends_the_budget_and_leaves_a_verifiable_run(tmp_path):
    answers, summary, refusal = anyio.run(session, tmp_path)
    assert [a["attempt"] for a in answers] == list(range(1, 8))
    for answer, (_, _, _, expected) in zip(answers, plan()):
        assert answer["verdict"].startswith(expected), answer
    assert answers[3]["reasons"][0]["code"] == "mismatch" and answers[3]["reasons"][0]["case"] == "odd-31x37x29"
    assert answers[4]["reasons"][0]["code"] == "compile_error"
    assert answers[6]["budget"]["attempts_left"] == 0 and answers[6]["holdout"] is not None
    assert "finished" in refusal

    run = next(tmp_path.glob("run-*"))
    assert summary["status"] == "finished" and summary["stop_reason"] == "budget exhausted"
    assert summary["holdout"]["passed"] and summary["holdout"]["cases"] == ["holdout-97x83x61"]
    assert re.fullmatch(r"\d+(\.\d+)+", summary["environment"]["driver"])  # the driver build, e.g. 580.159.04
    best = summary["best_attempt"]
    assert (run / "best.cu").read_text() == (run / "attempts" / f"{best:03d}.cu").read_text()
    history = json.loads((run / "history.json").read_text())["attempts"]
    assert [e["attempt"] for e in history] == list(range(8))
    assert history[1]["usage"] == {"model": "scripted", "calls": 3}
    if best != 0:
        assert history[best]["verdict"] == "valid-faster"
        assert summary["speedup_vs_baseline"]["ratio"] > 1
    assert verify_run(run).ok
