"""A tool refuses what it does not take: an argument it has no name for (a misspelt `case` would otherwise run every
case, a misspelt `option` compile without the option) and a launch whose per_case names no visible case. Each
refusal names what is known, and spends nothing: no probe, no compile, no record in the audit log."""

from __future__ import annotations

import pytest

from tests.server_support import HOLDOUT, VISIBLE, client, events, kernel, new_run, ok, refused

pytestmark = pytest.mark.anyio
GEOMETRY = {"grid": ["ceil_div(n, 16)", "ceil_div(m, 16)"], "block": [16, 16]}


@pytest.fixture
def run(tmp_path):
    run = new_run(tmp_path, compiles_per_minute=3, probes_per_window=5)
    yield run
    run.close()


async def _budget(c) -> dict:
    return (await ok(c, "describe_task"))["budget"]


async def test_every_input_schema_refuses_other_properties(run):
    async with client(run) as c:
        tools = (await c.list_tools()).tools
    assert len(tools) >= 7
    assert {tool.name: tool.input_schema.get("additionalProperties") for tool in tools} == \
        {tool.name: False for tool in tools}


@pytest.mark.parametrize("tool, arguments, says", [
    ("run_cases", {"candidate_id": "KNOWN", "case": [VISIBLE[0]]},
     "unknown argument 'case': run_cases takes candidate_id, source, launch, cases"),
    ("compile_kernel", {"source": kernel(), "option": ["--use_fast_math"]},
     "unknown argument 'option': compile_kernel takes source, options, launch"),
    ("time_kernel", {"candidate_id": "KNOWN", "case": VISIBLE[1], "repeats": 9},
     "unknown argument 'case', 'repeats': time_kernel takes candidate_id, source, launch, cases"),
    ("record_attempt", {"candidate_id": "KNOWN", "rationale": "faster", "reason": "x"},
     "unknown argument 'reason': record_attempt takes rationale, candidate_id, source, launch, usage"),
    ("finish", {"reason": "done", "rationale": "x"}, "unknown argument 'rationale': finish takes reason"),
    ("describe_task", {"verbose": True}, "unknown argument 'verbose': describe_task takes no arguments"),
])
async def test_an_unknown_argument_is_refused_naming_the_known_ones_and_spends_nothing(run, tool, arguments, says):
    async with client(run) as c:
        known = (await ok(c, "compile_kernel", source=kernel()))["candidate"]
        before, records = await _budget(c), len(events(run.dir))
        arguments = {k: (known if v == "KNOWN" else v) for k, v in arguments.items()}
        message = await refused(c, tool, **arguments)
        assert says in message, message
        assert await _budget(c) == before
    added = events(run.dir)[records:]  # the describe_task call only: no record of the refused call, nothing charged
    assert [e["data"].get("tool") for e in added] == ["describe_task"], added
    assert [entry.attempt for entry in run.history] == [0]


async def test_the_compile_rate_is_not_charged_by_a_refused_compile(run):
    async with client(run) as c:
        for _ in range(5):  # more than the 3 compiles a minute this run allows
            assert "unknown argument 'option'" in await refused(c, "compile_kernel", source=kernel(), option=["-G"])
        await ok(c, "compile_kernel", source=kernel("latency_us=40"))


@pytest.mark.parametrize("key", ["nope", HOLDOUT])
async def test_a_launch_whose_per_case_names_no_visible_case_is_refused(run, key):
    launch = {**GEOMETRY, "per_case": {key: {"grid": [1], "block": [1]}}}
    async with client(run) as c:
        before = await _budget(c)
        message = await refused(c, "compile_kernel", source=kernel(), launch=launch)
        assert f"per_case.{key}: there is no case named {key!r} (cases: {', '.join(VISIBLE)})" in message, message
        known = (await ok(c, "compile_kernel", source=kernel()))["candidate"]
        assert "there is no case named" in await refused(c, "run_cases", candidate_id=known, launch=launch)
        assert await _budget(c) == before
        named = {**GEOMETRY, "per_case": {VISIBLE[0]: GEOMETRY}}
        await ok(c, "compile_kernel", source=kernel(), launch=named)
