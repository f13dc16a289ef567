"""The run's resources as a client reads them: the audit log in pages, the report, the history without its raw
samples, and the updates a subscribed client hears."""

from __future__ import annotations

import json

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from server import resource_views
from server.app import build_server
from tests.server_support import client, kernel, ok


async def _text(c: Client, uri: str) -> str:
    return (await c.read_resource(uri)).contents[0].text


@pytest.mark.anyio
async def test_the_audit_log_reads_in_pages_that_join_into_the_file(run, monkeypatch):
    monkeypatch.setattr(resource_views, "EVENTS_PER_PAGE", 7)
    async with client(run) as c:
        await ok(c, "compile_kernel", source=kernel("a"))
        lines = (run.dir / "events.jsonl").read_text().splitlines()
        assert len(lines) > 14
        uri, pages = "referee://events.jsonl", []
        while uri is not None:
            page = json.loads(await _text(c, uri))
            pages.append(page)
            uri = page["next"]
        assert [p["from"] for p in pages] == list(range(0, len(lines), 7))
        assert all(p["total"] == len(lines) for p in pages)
        assert [record for p in pages for record in p["records"]] == lines
        assert pages[1] == json.loads(await _text(c, "referee://events.jsonl?cursor=7"))
        with pytest.raises(MCPError, match="past the log"):
            await _text(c, f"referee://events.jsonl?cursor={len(lines) + 1}")
        with pytest.raises(MCPError, match="line number"):
            await _text(c, "referee://events.jsonl?cursor=abc")


@pytest.mark.anyio
async def test_a_last_line_still_being_written_is_left_for_a_later_page(run):
    whole = (run.dir / "events.jsonl").read_text().splitlines()
    with (run.dir / "events.jsonl").open("a") as log:
        log.write('{"seq": 999, "ki')  # a record half written
    page = resource_views.events_page(run.dir, None)
    assert page["records"] == whole and page["next"] is None


@pytest.mark.anyio
async def test_the_compact_history_has_no_raw_samples_and_points_to_the_full_one(run):
    async with client(run) as c:
        await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="faster")
        full = json.loads(await _text(c, "referee://history.json"))
        compact_text = await _text(c, "referee://history-compact.json")
    assert any(row.get("samples_ms") for a in full["attempts"] for row in (a.get("timing") or {}).values())
    compact = json.loads(compact_text)
    assert compact["full"] == "referee://history.json"
    assert "samples_ms" not in compact_text and '"log"' not in compact_text
    assert [(a["attempt"], a["verdict"], a["score_ms"]) for a in compact["attempts"]] == [
        (a["attempt"], a["verdict"], a["score_ms"]) for a in full["attempts"]]
    first = compact["attempts"][1]
    assert first["validation"]["visible"]["passed"] is True
    assert set(first["validation"]["visible"]["cases"]) >= {"odd-31x37x29"}
    assert all(row["stats"]["median_ms"] > 0 for row in first["timing"].values())
    assert len(compact_text) < len((run.dir / "history.json").read_text())


@pytest.mark.anyio
async def test_the_report_is_a_resource_once_the_run_finished(run):
    async with client(run) as c:
        with pytest.raises(MCPError, match="does not exist yet"):
            await _text(c, "referee://report.html")
        await ok(c, "finish", reason="done")
    async with client(run) as c:  # the report is written after finish answered; the lifespan's end waits for it
        html = await _text(c, "referee://report.html")
        listed = {str(r.uri): r.mime_type for r in (await c.list_resources()).resources}
    assert html == (run.dir / "report.html").read_text() and html.startswith("<!DOCTYPE html>")
    assert listed["referee://report.html"] == "text/html"


@pytest.mark.anyio
async def test_a_subscribed_client_hears_when_the_history_and_the_summary_change(run):
    watched = ["referee://history.json", "referee://summary.json", "referee://history-compact.json"]
    async with Client(build_server(run), cache=None) as c:
        assert c.server_capabilities.resources.subscribe is True
        async with c.listen(resource_subscriptions=watched + ["referee://report.html"]) as subscription:
            await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="faster")
            heard = set()
            with anyio.fail_after(10):
                async for event in subscription:
                    heard.add(event.uri)
                    if heard >= set(watched):
                        break
    assert heard <= set(watched)  # the report was not written: nothing was heard of it
