"""A task without an oracle still runs, and wherever the holdout result is shown (summary.json, the finish
answer, the report, the demo's table, a replay) it says "no independent oracle"."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

from harness.task import load_task
from server import lifecycle
from server.attempt import finish, record_attempt
from server.demo_table import render_table
from server.records import holdout_oracle_words
from server.replay import replay
from server.report_files import write_report
from server.run import RunSettings
from tests.fake_executor import FakeExecutor
from tests.report_support import Page
from tests.server_support import HOLDOUT, MATMUL, kernel, read_json


def task_without_oracle(tmp_path: Path) -> Path:
    folder = tmp_path / "matmul-no-oracle"
    shutil.copytree(MATMUL, folder, ignore=shutil.ignore_patterns("oracle.py", "__pycache__"))
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace('oracle = "oracle.py"\n', ""))
    assert load_task(folder).oracle_file is None
    return folder


def finished_run(tmp_path: Path, folder: Path) -> Path:
    run = lifecycle.new_run(folder, tmp_path / "results", RunSettings(), FakeExecutor(load_task(folder)))
    try:
        record_attempt(run, run.candidate(None, kernel("latency_us=50")), "tiles", None, None)
        answer = finish(run, "done", None)
        assert answer.holdout["passed"] is True and answer.holdout["oracle_used"] is False
        return run.dir
    finally:
        run.close()


def test_a_run_without_an_oracle_says_so_wherever_its_holdout_is_shown(tmp_path):
    run_dir = finished_run(tmp_path, task_without_oracle(tmp_path))
    summary = read_json(run_dir / "summary.json")
    assert summary["holdout"]["oracle_used"] is False and summary["holdout"]["cases"] == [HOLDOUT]
    write_report(run_dir)
    text = Page((run_dir / "report.html").read_text()).text
    assert "Holdout: passed (no independent oracle)" in text
    assert "no independent oracle (the task declares none): checked against the reference's outputs only" in text
    footer = render_table({"cases": []}, [], summary).splitlines()
    assert any(line.startswith("holdout (hidden cases") and line.endswith("; no independent oracle") for line in footer)


def test_a_replay_without_an_oracle_says_no_independent_oracle(tmp_path):
    run_dir = finished_run(tmp_path, task_without_oracle(tmp_path))
    out = io.StringIO()
    assert replay(run_dir, out, make_executor=lambda task, timing: FakeExecutor(task), repeats=1) == 1
    said = out.getvalue()
    assert "FAIL holdout-oracle: no independent oracle: the task declares no float64 oracle" in said
    assert "holdout-oracle failed: no independent oracle" in said  # among the NO-GO's reasons


def test_a_run_with_an_oracle_records_that_it_used_it(tmp_path):
    run_dir = finished_run_with_oracle(tmp_path)
    holdout = read_json(run_dir / "summary.json")["holdout"]
    assert holdout["oracle_used"] is True and holdout["oracle_passed"] is True
    write_report(run_dir)
    assert "no independent oracle" not in Page((run_dir / "report.html").read_text()).text


def finished_run_with_oracle(tmp_path: Path) -> Path:
    folder = tmp_path / "matmul"
    shutil.copytree(MATMUL, folder, ignore=shutil.ignore_patterns("__pycache__"))
    run = lifecycle.new_run(folder, tmp_path / "results", RunSettings(), FakeExecutor(load_task(folder)))
    try:
        record_attempt(run, run.candidate(None, kernel("latency_us=50")), "tiles", None, None)
        finish(run, "done", None)
        return run.dir
    finally:
        run.close()


def test_holdout_cases_too_large_for_the_oracle_are_named_where_the_oracle_result_is_shown():
    both = {"cases": ["small", "huge"], "oracle_used": True, "passed": True, "oracle_passed": True,
            "oracle_skipped": ["huge"]}
    assert holdout_oracle_words(both) == "passed; not run on huge (too large for the host's oracle)"
    only_huge = {"cases": ["huge"], "oracle_used": True, "passed": True, "oracle_skipped": ["huge"]}
    assert holdout_oracle_words(only_huge) == "not run: every holdout case is too large for the host's oracle"
    failed_first = {"cases": ["small"], "oracle_used": True, "passed": False}
    assert holdout_oracle_words(failed_first) == "not run: the check against the reference's outputs failed first"
    assert holdout_oracle_words({"cases": ["small"], "oracle_used": True, "oracle_passed": False}) == "failed"
