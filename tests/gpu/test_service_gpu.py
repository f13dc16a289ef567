"""The demo's scripted agent plays a whole matmul_f32 run through `kernel-referee service`'s MCP endpoint on this
host's GPU (the real executor, confined): the task submitted as an archive, the seven attempts recorded, the budget
spent exactly, the verdicts the plan expects, and a run folder that `kernel-referee verify` accepts. One run, to
spend little GPU time; bench/service_gpu.py plays two together and one alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from bench.service_gpu import ServiceUnderTest, free_port, play_together, run_report, service_command
from server.demo import PLAN
from server.record_files import read_summary

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    root, port = tmp_path_factory.mktemp("service-gpu") / "service", free_port()
    lines: list[str] = []
    with ServiceUnderTest(service_command(root, port), root, port) as service:
        [entry] = anyio.run(play_together, service, ("alone",), PLAN, lines.append, 600.0)
        assert entry["error"] is None, (entry["error"], lines[-20:], service.stderr_tail())
        report = run_report(service, entry, PLAN)
    return report, {a["label"]: a for a in report["attempts"]}


def test_the_seven_attempts_are_recorded_and_the_budget_spent_exactly(played):
    report, _ = played
    assert report["state"] == "finished"
    assert [a["attempt"] for a in report["attempts"]] == list(range(8))
    assert (report["budget"]["used"], report["budget"]["left"]) == (7, 0), report["budget"]
    summary = read_summary(Path(report["run_dir"]))
    assert summary.status == "finished" and summary.stop_reason == "budget exhausted"


def test_the_verdicts_are_the_ones_the_plan_expects(played):
    _, by_label = played
    edge = by_label["edge bug (k tail dropped)"]
    assert edge["verdict"] == "rejected" and edge["reasons"][0] == "mismatch", edge
    broken = by_label["does not compile"]
    assert broken["verdict"] == "rejected" and broken["reasons"] == ["compile_error"], broken
    for label in ("naive", "tiled 32x32", "register-blocked 64x128", "register-blocked 64x64"):
        assert by_label[label]["verdict"].startswith("valid"), by_label[label]
    accepted = [a for a in by_label.values() if a["verdict"] == "valid-faster"]
    assert any(a["speedup_vs_baseline"] > 1 for a in accepted), by_label


def test_every_timed_case_has_its_spread(played):
    report, _ = played
    assert set(report["case_cv"]) == {"square-2048", "rect-2000x1500x1000"}
    assert all(0 < cv < 0.5 for cv in report["case_cv"].values()), report["case_cv"]
    assert report["queue_wait_s"] is not None and report["gpu_s"] > 0


def test_the_run_folder_verifies(played):
    report, _ = played
    assert report["verified"], report["verify_problems"]
    done = subprocess.run([sys.executable, "-m", "server.cli", "verify", report["run_dir"]], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and ": ok (" in done.stdout, done.stdout + done.stderr
