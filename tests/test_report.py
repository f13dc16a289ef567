"""`kernel-referee report`: report.html and the heatmaps of a run folder, read back as a person would."""

from __future__ import annotations

import json
import logging
import re
import shutil
import xml.etree.ElementTree as ET
from html import escape
from io import BytesIO

import anyio
import pytest

from server import heatmap as heatmap_module
from server.verify import verify_run
from server.cli import main
from server.cost import CostInputs, cost_sheet, run_hours
from server.report import load_report
from server.report_files import write_report, write_report_files
from server.report_html import CAVEAT, fmt_ms
from tests.report_support import (FINISH_REASON, HOSTILE, HOSTILE_SOURCE_LINE, RUN_SOURCES, USAGE, Page, read_json,
                                  reported_run)
from tests.server_support import client, kernel, new_run, ok

COST_ARGS = ["--engineer-hours", "8", "--hourly-rate", "150", "--model-cost", "40", "--gpu-hour-cost", "4",
             "--invocations-per-month", "50000000", "--ms-saved-end-to-end", "0.36"]


@pytest.fixture(params=RUN_SOURCES)
def run_dir(request, tmp_path_factory):
    return reported_run(request.param, tmp_path_factory)


@pytest.fixture
def cpu_run(tmp_path_factory):
    return reported_run("cpu", tmp_path_factory)


@pytest.fixture
def cpu_copy(cpu_run, tmp_path):
    copy = tmp_path / cpu_run.name
    shutil.copytree(cpu_run, copy)
    return copy


def html_of(run_dir) -> str:
    return (run_dir / "report.html").read_text()


def sections(html: str) -> dict[int, str]:
    found = re.findall(r'<section class="attempt" id="attempt-(\d+)">(.*?)</section>', html, re.S)
    return {int(n): body for n, body in found}


# -- any run folder ---------------------------------------------------------------------------

def test_the_report_and_both_heatmaps_are_written_and_valid(run_dir):
    from PIL import Image

    assert (run_dir / "report.html").is_file()
    png = (run_dir / "heatmap.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    with Image.open(BytesIO(png)) as image:
        image.verify()
        assert image.format == "PNG" and image.size[0] > 200 and image.size[1] > 100
    root = ET.fromstring((run_dir / "heatmap.svg").read_text())
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    history = read_json(run_dir / "history.json")["attempts"]
    cases = load_report(run_dir).performance_cases
    labels = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    rejected = sum(e["verdict"] == "rejected" for e in history)
    assert labels.count("rejected") == rejected * len(cases) + 1  # and one in the legend
    assert all(case in labels for case in cases)


def test_the_facts_of_the_run(run_dir):
    html, text = html_of(run_dir), Page(html_of(run_dir)).text
    summary, lock = read_json(run_dir / "summary.json"), read_json(run_dir / "lock.json")
    for fact in (summary["task"], summary["run"], lock["files_sha256"], lock.get("referee_source_sha256", lock.get("harness_sha256")),
                 str(lock["environment"]["gpu"]), f"{summary['budget']['used']} of {summary['budget']['max_attempts']}"
                 " attempts used", f"compiles {summary['compiles']}", f"probes {summary['probes']}"):
        assert fact in text, fact
    assert escape(summary.get("stop_reason") or "—") in html
    assert f"kernel-referee replay {run_dir}" in text and f"kernel-referee verify {run_dir}" in text
    wall, busy, _ = run_hours(run_dir)
    assert f"{wall:.4f} h" in text and f"{busy:.5f} h" in text  # the cost sheet's inputs from the run itself
    assert CAVEAT in text


def test_every_attempt_with_its_verdict_reasons_and_latency(run_dir):
    html = html_of(run_dir)
    by_number = sections(html)
    history = read_json(run_dir / "history.json")["attempts"]
    assert sorted(by_number) == sorted(e["attempt"] for e in history)
    for entry in history:
        body = by_number[entry["attempt"]]
        assert f">{entry['verdict']}</span>" in body
        for reason in entry["reasons"]:
            assert f"<b>{escape(reason['code'])}</b>" in body and escape(reason["detail"]) in body
        if entry["verdict"] != "rejected":
            for case, row in (entry.get("timing") or {}).items():
                assert escape(case) in body and fmt_ms(row["stats"]["median_ms"]) in body
                assert fmt_ms(row["stats"]["ci_low_ms"]) in body and fmt_ms(row["stats"]["p90_ms"]) in body
        if entry["attempt"] > 0 and entry.get("source_file"):
            assert f"diff against attempt {entry['attempt'] - 1}" in body


def test_rejections_by_kind_and_the_holdout(run_dir):
    report = load_report(run_dir)
    summary = read_json(run_dir / "summary.json")
    assert report.rejections_by_kind == summary["rejections_by_reason"] and report.rejections_by_kind
    text = Page(html_of(run_dir)).text
    for kind, count in report.rejections_by_kind.items():
        assert f"{kind} {count}" in text
    holdout = summary["holdout"]  # every run reported here has finished, so its holdout was checked
    assert ("Holdout: passed" if holdout["passed"] else "Holdout: FAILED") in text
    assert holdout["cases"] and all(case in text for case in holdout["cases"])


def test_the_report_is_self_contained(run_dir):
    page = Page(html_of(run_dir))
    assert not page.tag_names() & {"script", "link", "iframe", "object", "embed", "img"}
    for name, attributes in page.tags:
        for attribute in ("src", "href", "xlink:href", "action", "srcset"):
            value = (attributes.get(attribute) or "").strip().lower()
            assert not value.startswith(("http:", "https:", "//", "ftp:")), (name, attribute, value)
        assert not any(a.startswith("on") for a in attributes), (name, attributes)
    assert not re.search(r"url\(\s*['\"]?(https?:)?//", html_of(run_dir), re.I)
    assert "@import" not in html_of(run_dir)


def test_writing_the_report_again_keeps_the_audit_as_it_was(run_dir, tmp_path):
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy)
    before = verify_run(copy)
    assert main(["report", str(copy)]) == 0
    assert main(["report", str(copy), *COST_ARGS]) == 0
    after = verify_run(copy)
    assert (after.ok, after.problems, after.head) == (before.ok, before.problems, before.head)
    assert (copy / "events.jsonl").read_bytes() == (run_dir / "events.jsonl").read_bytes()


# -- the CPU-made run -------------------------------------------------------------------------

def test_finish_wrote_the_report_and_verify_passes(cpu_run):
    assert {p.name for p in cpu_run.iterdir()} >= {"report.html", "heatmap.png", "heatmap.svg"}
    assert verify_run(cpu_run).ok
    assert load_report(cpu_run).audit.ok and "kernel-referee verify" in Page(html_of(cpu_run)).text


def test_hostile_agent_text_is_shown_escaped_never_as_markup(cpu_run):
    html = html_of(cpu_run)
    assert "<script" not in html.lower() and "<img" not in html.lower()
    assert escape(HOSTILE) in html
    assert escape("+" + HOSTILE_SOURCE_LINE) in html  # in the diff of attempt 2
    assert escape(FINISH_REASON) in html
    assert escape(USAGE["model"]) in html
    text = Page(html).text
    assert HOSTILE in text and "</pre><script>" in text  # what a person reads is the text the agent sent
    assert "PWNED" not in (cpu_run / "heatmap.svg").read_text()  # the heatmap holds no agent text


def test_verdicts_speedups_usage_and_disqualification_of_the_cpu_run(cpu_run):
    report = load_report(cpu_run)
    assert [(a.number, a.verdict) for a in report.attempts] == [
        (0, "baseline"), (1, "valid-faster"), (2, "rejected"), (3, "valid-not-faster"), (4, "rejected"),
        (5, "rejected"), (6, "valid-faster")]
    assert report.rejections_by_kind == {"mismatch": 1, "compile_error": 1, "unwritten_output": 1}
    assert (report.best_attempt, report.disqualified) == (1, [6])
    assert report.usage_totals == {"input_tokens": 13000, "output_tokens": 3400, "cost_usd": 0.25}
    first = report.attempts[1]
    assert first.speedup_vs_baseline.ratio == pytest.approx(2.0, rel=0.02)
    assert [c.relative_to_baseline for c in first.cases] == [pytest.approx(0.5, rel=0.02)] * 2
    text = Page(html_of(cpu_run)).text
    assert "input_tokens 13000" in text and "not given by the client" not in text
    assert "(disqualified at the holdout)" in text and "6 DQ" in (cpu_run / "heatmap.svg").read_text()
    assert "1 best" in (cpu_run / "heatmap.svg").read_text()
    body = sections(html_of(cpu_run))[6]
    assert "1.25×" in body  # vs its parent, attempt 1, measured beside it
    assert "speedup vs parent" in body and ">DQ</span>" in body


def test_the_full_cost_sheet_when_the_cost_options_are_given(cpu_copy, capsys):
    assert main(["report", str(cpu_copy), *COST_ARGS]) == 0
    assert "report.html" in capsys.readouterr().out
    wall, busy, saved = run_hours(cpu_copy)
    inputs = CostInputs(engineer_hours=8, hourly_rate=150, model_cost=40, gpu_hour_cost=4,
                        invocations_per_month=50_000_000, ms_saved_end_to_end=0.36)
    sheet = cost_sheet(inputs, wall, busy, saved)
    text = Page(html_of(cpu_copy)).text
    assert f"pilot cost {sheet.pilot_cost:.2f}" in text and f"payback {sheet.payback_months:.2f} months" in text
    assert "saved GPU hours per month 5.0000" in text and CAVEAT in text


def test_some_cost_options_without_the_others_are_refused(cpu_copy, capsys):
    assert main(["report", str(cpu_copy), "--engineer-hours", "8"]) == 2
    assert "needs all six cost options" in capsys.readouterr().err


def test_a_folder_that_is_no_run_is_a_clear_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "not a run folder" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing")]) == 2


@pytest.mark.parametrize("replay, shown", [
    ({"decision": "GO", "reasons": ["every case matched", "<i>x</i>"]}, ["GO", "every case matched", "<i>x</i>"]),
    ({"decision": "NO-GO", "reasons": ["square-256: 3 mismatches"], "extra": 1}, ["NO-GO", "square-256: 3 mismatches"]),
    ({"decision": "MAYBE"}, ["unreadable", "not GO or NO-GO"]),
    ([1, 2], ["unreadable", "not a JSON object"]),
    ("{not json", ["unreadable", "replay.json: unreadable"]),
])
def test_the_replay_decision_is_read_defensively(cpu_copy, replay, shown):
    path = cpu_copy / "replay.json"
    path.write_text(replay if isinstance(replay, str) else json.dumps(replay))
    assert main(["report", str(cpu_copy)]) == 0
    text = Page(html_of(cpu_copy)).text
    assert all(s in text for s in shown), shown
    assert "<i>" not in html_of(cpu_copy)
    assert verify_run(cpu_copy).ok  # an unknown file does not break verify


def test_an_unfinished_run_is_reported_too(tmp_path):
    run = new_run(tmp_path)
    run.close()
    write_report(run.dir)
    text = Page(html_of(run.dir)).text
    assert "Holdout: not checked yet" in text and "status running" in text and "No replay.json yet" in text
    assert verify_run(run.dir).ok


def test_a_report_that_fails_is_logged_and_the_run_still_finishes(tmp_path, monkeypatch, caplog):
    def broken(_):
        raise RuntimeError("no PNG today")

    monkeypatch.setattr(heatmap_module, "heatmap_png", broken)
    run = new_run(tmp_path)

    async def drive():
        async with client(run) as c:
            await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="faster")
            return await ok(c, "finish", reason="done")

    with caplog.at_level(logging.WARNING, logger="server.report_files"):
        done = anyio.run(drive, backend="asyncio")
    run.close()
    assert done["best_attempt"] == 1
    assert read_json(run.dir / "summary.json")["status"] == "finished"
    assert "could not be written" in caplog.text and "no PNG today" in caplog.text
    assert verify_run(run.dir).ok
    write_report_files(tmp_path / "nowhere")  # never raises


def test_control_characters_in_a_rationale_are_written_as_visible_escapes(tmp_path):
    run = new_run(tmp_path)

    async def drive():
        async with client(run) as c:
            await ok(c, "record_attempt", source=kernel("latency_us=50"), rationale="tiles\x00 of 32\x1b[31m red\x7f")
            await ok(c, "finish", reason="done\x00")

    anyio.run(drive, backend="asyncio")
    run.close()
    data = (run.dir / "report.html").read_bytes()
    assert not [byte for byte in data if byte < 0x20 and byte not in b"\t\n\r"], "a raw control byte in the page"
    assert b"\x7f" not in data
    text = data.decode()
    assert "tiles\\x00 of 32\\x1b[31m red\\x7f" in text and "done\\x00" in text


def test_a_lone_surrogate_is_written_as_an_escape_and_the_page_still_encodes():
    from server.report_html import e
    assert e("a\ud800b\x85") == "a\\ud800b\\x85"
    assert e("tab\tline\nreturn\r<&>") == "tab\tline\nreturn\r&lt;&amp;&gt;"
