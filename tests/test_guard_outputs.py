"""The guard's CI outputs: JUnit XML in the common schema's structure, GitHub annotations, HTML, JSON."""

from __future__ import annotations

import io
import json
import re
import xml.etree.ElementTree as ET
from datetime import datetime

from guard.outputs import annotations, print_annotations, write_json
from guard.outputs_html import render_guard_page, write_html
from guard.outputs_junit import junit_tree, write_junit
from guard.verdict import Inconclusive, Verdict
from tests.guard_verdict_support import case_verdict, report_of

HOSTILE = 'bench-<script>alert(1)</script>&"\x01\n'
SUITE_ATTRIBUTES = {"name", "tests", "failures", "errors", "time", "timestamp", "hostname"}
SUITE_CHILDREN = ("properties", "testcase", "system-out", "system-err")  # in this order (the Ant schema's sequence)


def _report():
    return report_of(
        ("demo", [case_verdict("bench-1", Verdict.PASS, 1.002),
                  case_verdict("bench-2", Verdict.REGRESSED, 1.04, environment_changes=["driver: '580.1' -> '590.2'"]),
                  case_verdict(HOSTILE, Verdict.INCONCLUSIVE, 1.015, reason=Inconclusive.OTHER_PROCESS)]),
        ("softmax", [case_verdict("big", Verdict.INCORRECT, None, approval="softmax",
                                  message="incorrect: wrong_output (1 of 1048576 elements)"),
                     case_verdict("small", Verdict.IMPROVED, 0.9, approval="softmax")]))


def _check_junit_structure(root: ET.Element) -> None:
    """What the common JUnit schema (Jenkins/Ant) expects of every element the guard writes."""
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    for suite in suites:
        assert SUITE_ATTRIBUTES <= set(suite.attrib), suite.attrib
        datetime.strptime(suite.get("timestamp"), "%Y-%m-%dT%H:%M:%S")  # ISO 8601 without a zone
        order = [SUITE_CHILDREN.index(child.tag) for child in suite]
        assert order == sorted(order) and {"properties", "system-out", "system-err"} <= {c.tag for c in suite}
        cases = suite.findall("testcase")
        assert int(suite.get("tests")) == len(cases)
        assert int(suite.get("failures")) == sum(len(c.findall("failure")) for c in cases)
        assert int(suite.get("errors")) == sum(len(c.findall("error")) for c in cases)
        for case in cases:
            assert {"classname", "name", "time"} <= set(case.attrib)
            float(case.get("time"))
            outcomes = [c for c in case if c.tag in ("failure", "error", "skipped")]
            assert len(outcomes) <= 1
            for outcome in outcomes:
                assert outcome.get("message") and outcome.get("type")
    for total in ("tests", "failures", "errors"):
        assert int(root.get(total)) == sum(int(s.get(total)) for s in suites)


def test_junit_has_one_testcase_per_approval_and_case_in_the_schema_structure(tmp_path):
    path = write_junit(_report(), tmp_path / "guard.xml")
    root = ET.parse(path).getroot()  # parses: the hostile name is escaped, its control character replaced
    _check_junit_structure(root)
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("5", "2", "1")
    cases = {(c.get("classname"), c.get("name")): c for c in root.iter("testcase")}
    assert set(cases) == {("demo", "bench-1"), ("demo", "bench-2"), ("demo", HOSTILE.replace("\x01", "\\x01")),
                          ("softmax", "big"), ("softmax", "small")}
    failure = cases["demo", "bench-2"].find("failure")
    assert failure.get("type") == "regressed"
    assert failure.get("message").startswith("bench-2: regressed, +4.0% [+3.6%, +4.4%] vs accepted")
    assert "driver: '580.1' -> '590.2'" in failure.get("message")
    assert cases["softmax", "big"].find("failure").get("type") == "incorrect"
    assert "1 of 1048576" in cases["softmax", "big"].find("failure").get("message")
    error = next(c for k, c in cases.items() if k[1].startswith("bench-<script>")).find("error")
    assert error.get("type") == "inconclusive:other_process"
    assert cases["demo", "bench-1"].find("failure") is None and "+0.2%" in cases["demo", "bench-1"].findtext("system-out")


def test_junit_of_an_all_pass_run_has_no_failures():
    root = junit_tree(report_of(("demo", [case_verdict("bench-1", Verdict.PASS)]))).getroot()
    _check_junit_structure(root)
    assert root.get("failures") == "0" and root.get("errors") == "0" and not list(root.iter("failure"))


def test_github_annotations_only_under_actions_one_per_case_that_needs_eyes():
    report, out = _report(), io.StringIO()
    assert print_annotations(report, out, environ={}) == 0 and out.getvalue() == ""
    assert print_annotations(report, out, environ={"GITHUB_ACTIONS": "true"}) == 3
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and lines == annotations(report)
    assert lines[0].startswith("::error title=guard regressed%3A demo / bench-2::bench-2: regressed, +4.0%")
    assert lines[1].startswith("::warning title=guard inconclusive%3A demo / bench-<script>")
    assert "%0A" in lines[1] and "\n" not in lines[1]  # the case name's newline cannot end the command early
    assert lines[2].startswith("::error title=guard incorrect%3A softmax / big::big: incorrect: wrong_output")


def test_the_html_page_uses_the_reports_style_and_escapes_everything(tmp_path):
    page = render_guard_page(_report(), {"demo": '<svg xmlns="http://www.w3.org/2000/svg"><circle r="4"/></svg>'})
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "\x01" not in page and "\\x01" in page
    assert "Content-Security-Policy" in page and "default-src &#x27;none&#x27;" in page and ".badge{" in page
    assert page.count('class="badge') == 5 and 'badge failed">regressed' in page
    assert '<circle r="4"/>' in page and page.count("<svg") == 1
    assert "exit status 1: 1 pass, 1 regressed, 1 improved, 1 incorrect, 1 inconclusive" in page
    assert re.search(r"driver: &#x27;580.1&#x27; -&gt; &#x27;590.2&#x27;", page)
    assert write_html(_report(), tmp_path / "g" / "guard.html").read_text().startswith("<!DOCTYPE html>")


def test_the_json_file_holds_every_verdict_with_the_exit_status(tmp_path):
    document = json.loads(write_json(_report(), tmp_path / "guard.json").read_text())
    assert document["exit_status"] == 1
    assert document["counts"] == {"pass": 1, "regressed": 1, "improved": 1, "incorrect": 1, "inconclusive": 1}
    demo = document["results"][0]
    assert [v["verdict"] for v in demo["verdicts"]] == ["pass", "regressed", "inconclusive"]
    assert demo["verdicts"][1]["change"]["low"] == 1.036 and demo["diff"][1]["since"] == "approval"
