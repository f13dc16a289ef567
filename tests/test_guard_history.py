"""The guard's history: records appended and read back, the compact diff, the trend picture."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from guard.history import HistoryError, append, compact_diff, read, record_of
from guard.store import history_path
from guard.trend import trend_of, trend_svg, write_trend
from guard.verdict import Inconclusive, Verdict
from tests.guard_verdict_support import H100, H100_NEW_DRIVER, case_verdict

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_every_run_appends_one_typed_line_read_back_in_order(tmp_path):
    first = record_of("demo", [case_verdict("bench-1", Verdict.PASS, 1.002)], H100, accepted=True,
                      time="2026-12-01T00:00:00+00:00")
    second = record_of("demo", [case_verdict("bench-1", Verdict.REGRESSED, 1.04)], H100, exit_status=1)
    append(tmp_path, first)
    path = append(tmp_path, second)
    assert path == history_path(tmp_path, "demo")
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["cases"][0]["verdict"] == "regressed"
    back = read(tmp_path, "demo")
    assert back == [first, second]
    assert back[0].accepted and not back[1].accepted and back[1].exit_status == 1
    assert back[1].case("bench-1").change.estimate == pytest.approx(1.04)
    assert read(tmp_path, "other") == []


def test_a_line_that_is_not_a_record_is_reported_with_its_place(tmp_path):
    append(tmp_path, record_of("demo", [case_verdict("bench-1", Verdict.PASS)], H100))
    with open(history_path(tmp_path, "demo"), "a") as out:
        out.write('{"time": "x"}\n')
    with pytest.raises(HistoryError, match="demo.jsonl:2"):
        read(tmp_path, "demo")


def test_the_compact_diff_names_the_change_since_the_last_accepted_run():
    earlier = [record_of("demo", [case_verdict("bench-1", Verdict.PASS, 1.0)], H100, accepted=True,
                         time="2026-11-20T00:00:00+00:00"),
               record_of("demo", [case_verdict("bench-1", Verdict.PASS, 1.0)], H100, accepted=True,
                         time="2026-12-01T00:00:00+00:00"),
               record_of("demo", [case_verdict("bench-1", Verdict.PASS, 1.01)], H100, time="2026-12-02T00:00:00+00:00")]
    now = [case_verdict("bench-1", Verdict.REGRESSED, 1.031, environment_changes=["driver: '580.1' -> '590.2'"]),
           case_verdict("bench-2", Verdict.INCORRECT, None, message="incorrect: wrong_output (case 3)")]
    bench1, bench2 = compact_diff("demo", now, earlier)
    assert bench1.since == "2026-12-01T00:00:00+00:00" and bench1.previous.estimate == pytest.approx(1.01)
    assert bench1.text == ("bench-1: regressed, +3.1% [+2.7%, +3.5%] vs accepted (threshold 1.5%) since "
                           "2026-12-01T00:00:00+00:00; previous run +1.0%; environment: driver: '580.1' -> '590.2'")
    assert bench2.text == "bench-2: incorrect: wrong_output (case 3)" and bench2.previous is None
    assert compact_diff("demo", now[:1], [])[0].since == "approval"


def _history() -> list:
    cases = lambda change, verdict=Verdict.PASS: [case_verdict("bench-<1>", verdict, change),  # noqa: E731
                                                  case_verdict("bench-2", Verdict.PASS, 1.0)]
    return [record_of("demo", cases(1.0), H100, accepted=True), record_of("demo", cases(1.004), H100),
            record_of("demo", cases(1.03, Verdict.REGRESSED), H100_NEW_DRIVER),
            record_of("demo", [case_verdict("bench-<1>", Verdict.INCONCLUSIVE, None,
                                            reason=Inconclusive.OTHER_PROCESS)], H100_NEW_DRIVER)]


def test_the_trend_marks_environment_changes_and_accepted_runs():
    trend = trend_of("demo", _history())
    assert trend.cases == ["bench-<1>", "bench-2"]
    assert trend.environment_marks == [(2, "driver")] and trend.accepted_runs == [0]
    regressed = next(p for p in trend.points if p.run == 2 and p.case == "bench-<1>")
    assert regressed.percent == pytest.approx(3.0) and regressed.verdict == "regressed"


def test_the_trend_svg_is_well_formed_escaped_and_draws_every_point():
    svg = trend_svg(trend_of("demo", _history()))
    root = ET.fromstring(svg)  # well-formed XML: the case name's < and > are escaped
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f"{ns}circle")) == 6  # three runs of bench-<1> and three of bench-2 with intervals
    dashed = [line for line in root.findall(f"{ns}line") if line.get("stroke-dasharray")]
    assert len(dashed) == 1
    texts = "".join(t.text or "" for t in root.iter(f"{ns}text"))
    assert "driver" in texts and "accepted" in texts and "bench-<1>" in texts


def test_write_trend_writes_an_svg_and_a_png(tmp_path):
    files = write_trend(tmp_path / "out", "demo", _history())
    assert files.svg.read_text() == files.svg_text and files.svg.name == "trend-demo.svg"
    assert files.png.read_bytes().startswith(PNG_MAGIC) and files.png.stat().st_size > 2000
