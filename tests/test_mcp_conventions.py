"""MCP conventions (issue 20, item 6), seen through the SDK's client: titles, descriptions on every input field,
clean tool descriptions, annotations, serverInfo.version, argument completion of candidate ids, and log messages
once the client asked for them."""

from __future__ import annotations

import warnings
from importlib import metadata

import pytest
from mcp import Client
from mcp.types import PromptReference, ResourceTemplateReference

from server.app import build_server
from tests.server_support import BROKEN, client, kernel, ok

TOOLS = ("compile_kernel", "describe_task", "finish", "profile_kernel", "record_attempt", "run_cases", "time_kernel",
         "validate")
# The client's own calls of the deprecated logging capability warn; the server's must not.
DEPRECATED_LOGGING = "ignore:The logging capability is deprecated:mcp.shared.exceptions.MCPDeprecationWarning"




def _properties(schema: dict, where: str):
    """(path, property schema) of every object property in a JSON schema, its $defs included."""
    for name, prop in schema.get("properties", {}).items():
        yield f"{where}.{name}", prop
    for name, definition in schema.get("$defs", {}).items():
        yield from _properties(definition, f"{where}.$defs.{name}")


@pytest.mark.anyio
async def test_every_tool_has_a_title_a_clean_description_and_a_description_on_every_input(run):
    async with client(run) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
    assert sorted(tools) == list(TOOLS)
    titles = [tool.title for tool in tools.values()]
    assert all(titles) and len(set(titles)) == len(titles), titles
    for tool in tools.values():
        assert tool.description and "\n" not in tool.description and "  " not in tool.description, tool.description
        assert "`candidate`" not in tool.description
        for path, prop in _properties(tool.input_schema, tool.name):
            text = prop.get("description")
            assert text and text.strip() == text, path
            assert "`candidate`" not in text, path
            assert not any(line != line.lstrip() for line in text.splitlines()), path
        for name, definition in tool.input_schema.get("$defs", {}).items():
            assert not any(line != line.lstrip() for line in definition.get("description", "").splitlines()), name
    assert "candidate_id" in tools["run_cases"].input_schema["properties"]["source"]["description"]
    assert "`candidate_id`" in tools["compile_kernel"].description


@pytest.mark.anyio
async def test_record_attempt_is_marked_destructive_and_says_what_spends_it(run):
    async with client(run) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
    hints = {name: tool.annotations.destructive_hint for name, tool in tools.items()}
    assert hints["record_attempt"] is True and hints["finish"] is True
    assert {name for name, hint in hints.items() if hint} == {"record_attempt", "finish"}
    text = tools["record_attempt"].description
    assert "irreversibly" in text and "ends the run" in text
    assert "a cancelled call or a source that does not compile still spends it" in text


@pytest.mark.anyio
async def test_every_tool_is_annotated_with_what_it_does(run):
    # A tool charged on every call (the compile rate limit, the probe window) is not idempotent: a second call is
    # not the same as one.
    async with client(run) as c:
        hints = {t.name: (t.annotations.read_only_hint, t.annotations.destructive_hint, t.annotations.idempotent_hint,
                          t.annotations.open_world_hint) for t in (await c.list_tools()).tools}
    charged, spends = (False, False, False, False), (False, True, False, False)
    assert hints == {"describe_task": (True, None, None, False), "compile_kernel": charged, "run_cases": charged,
                     "validate": charged, "time_kernel": charged, "profile_kernel": charged,
                     "record_attempt": spends, "finish": spends}


@pytest.mark.anyio
async def test_server_info_carries_the_package_version(run):
    async with client(run) as c:
        assert c.server_info.name == "kernel-referee"
        assert c.server_info.version == metadata.version("kernel-referee") != ""


@pytest.mark.anyio
async def test_candidate_ids_complete_in_the_compile_log_template(run):
    template = ResourceTemplateReference(uri="referee://compile-logs/{candidate}")
    async with client(run) as c:
        ids = {(await ok(c, "compile_kernel", source=source))["candidate"] for source in (kernel("a"), BROKEN)}
        baseline = run.history[0].candidate
        every = (await c.complete(template, {"name": "candidate", "value": ""})).completion
        assert every.values == sorted(ids | {baseline}) and every.total == 3 and not every.has_more
        one = sorted(ids)[0]
        narrowed = (await c.complete(template, {"name": "candidate", "value": one[:12]})).completion
        assert narrowed.values == [one]
        assert (await c.complete(template, {"name": "candidate", "value": "x"})).completion.values == []
        other = PromptReference(name="optimize_kernel")
        assert (await c.complete(other, {"name": "candidate", "value": "c"})).completion.values == []
        log = (await c.read_resource(f"referee://compile-logs/{one}")).contents[0].text
        assert log == (run.dir / "compile-logs" / f"{one}.log").read_text()


async def _timed_with_log(run, **client_options) -> list:
    received = []

    async def on_log(params):
        received.append(params)

    async with Client(build_server(run), cache=None, logging_callback=on_log, **client_options) as c:
        await ok(c, "time_kernel", source=kernel("latency_us=50"))
    return received


@pytest.mark.anyio
@pytest.mark.filterwarnings(DEPRECATED_LOGGING)
async def test_progress_lines_are_sent_as_log_messages_once_the_client_sets_a_level(run):
    assert await _timed_with_log(run, mode="legacy") == []  # not asked for: nothing sent

    received = []

    async def on_log(params):
        received.append(params)

    async with Client(build_server(run), cache=None, mode="legacy", logging_callback=on_log) as c:
        await c.set_logging_level("info")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            await ok(c, "time_kernel", source=kernel("latency_us=50"))
        assert not [w for w in caught if "/server/" in w.filename]  # no deprecation warning on the server's stderr
        assert [(m.level, m.logger, m.data) for m in received] == [
            ("info", "kernel-referee", "validating on the visible cases"),
            ("info", "kernel-referee", "timing beside the best and the baseline"),
            ("info", "kernel-referee", "timed")]
        await c.set_logging_level("warning")  # above the progress lines' level: they stop
        await ok(c, "time_kernel", source=kernel("latency_us=40"))
        assert len(received) == 3


@pytest.mark.anyio
@pytest.mark.filterwarnings(DEPRECATED_LOGGING)
async def test_a_2026_client_gets_log_messages_by_its_request_level(run):
    assert await _timed_with_log(run) == []  # no level in the request's _meta
    received = await _timed_with_log(run, log_level="info")
    assert [m.data for m in received] == ["validating on the visible cases", "timing beside the best and the baseline",
                                          "timed"]
