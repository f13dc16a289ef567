"""Real run folders recorded on the H200 (tests/fixtures/runs/): the audit log verifies, one edited
byte anywhere it covers is found, the replay's recorded decision follows from its recorded checks
and repeats, and the cost sheet takes the run's own hours. (The report of each is tested in
test_report.py and test_report_browser.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from server.verify import verify_run
from server.cost import CostInputs, cost_sheet, run_hours
from server.decision import CheckResult, RepeatResult, decide
from server.run import RunSettings
from tests.report_support import FIXTURE_RUNS

RUNS = sorted(p.name for p in FIXTURE_RUNS.glob("*") if (p / "history.json").is_file())
# Files each recorded run has, and a byte offset inside each (from the end when negative).
EDITS = {"events.jsonl": 200, "history.json": -40, "summary.json": 30, "best.cu": 10, "lock.json": 50,
         "task/task.toml": 100, "task/oracle.py": 20, "attempts/003.cu": 5, "best-case-1.json": 15}


def test_a_real_run_is_committed():
    assert RUNS, "no run folder recorded on a GPU under tests/fixtures/runs/"


@pytest.mark.parametrize("name", RUNS)
def test_the_recorded_run_verifies_and_was_made_on_an_h200(name):
    run_dir = FIXTURE_RUNS / name
    report = verify_run(run_dir)
    assert report.ok, report.problems
    environment = json.loads((run_dir / "lock.json").read_text())["environment"]
    assert environment["gpu"] == "NVIDIA H200"
    history = json.loads((run_dir / "history.json").read_text())["attempts"]
    assert len(history) == 8 and history[0]["verdict"] == "baseline"


def _edited_copy(name: str, relative: str, offset: int, tmp_path: Path) -> Path:
    run_dir = tmp_path / name
    shutil.copytree(FIXTURE_RUNS / name, run_dir)
    path = run_dir / relative
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[offset] = ord("#") if data[offset] != ord("#") else ord("%")
    path.write_bytes(bytes(data))
    return run_dir


def _expected_file(name: str) -> str:
    return next(p for p in (FIXTURE_RUNS / name / "expected").rglob("*.npy")).relative_to(FIXTURE_RUNS / name).as_posix()


@pytest.mark.parametrize("name", RUNS)
@pytest.mark.parametrize("relative", [*EDITS, "expected"])
def test_one_edited_byte_fails_verify_naming_the_file(name, relative, tmp_path):
    offset = EDITS.get(relative, -3)  # a reference output: inside the array's data, past the .npy header
    if relative == "expected":
        relative = _expected_file(name)
    report = verify_run(_edited_copy(name, relative, offset, tmp_path))
    assert not report.ok
    assert any(relative in problem for problem in report.problems), report.problems


def _up_to_words(reason: str) -> tuple[str, frozenset[str]]:
    """A repeat's reason without the words that say what its interval means: the repeat, its numbers and the
    cases it names (then "(not beyond noise in A, B)", now "(A: within noise; B: within noise)")."""
    if not reason.startswith("repeat ") or " is " not in reason:
        return reason, frozenset()
    head, tail = reason.split(" is ", 1)
    named = tail[tail.rfind("(") + 1:-1] if tail.endswith(")") else ""
    old = named.removeprefix("not beyond noise in ")
    cases = old.split(", ") if old != named else [part.split(": ")[0] for part in named.split("; ")]
    return head, frozenset(c for c in cases if c)


@pytest.mark.parametrize("name", [n for n in RUNS if (FIXTURE_RUNS / n / "replay.json").is_file()])
def test_the_recorded_replay_decision_follows_from_its_checks_and_repeats(name):
    document = json.loads((FIXTURE_RUNS / name / "replay.json").read_text())
    checks = [CheckResult.model_validate(c) for c in document["checks"]]
    repeats = [RepeatResult.model_validate({k: v for k, v in r.items() if k in RepeatResult.model_fields})
               for r in document["repeats"]]
    environment = document["environment"]
    decision = decide(checks, repeats, environment["run"], environment["now"])
    # The same decision for the same reasons; a repeat's reason is compared up to its words for the interval,
    # which changed after the run was replayed ("is not beyond noise" is now "is within noise, where GO needs
    # faster beyond noise", see docs/decisions.md).
    assert (decision.decision, [_up_to_words(r) for r in decision.reasons]) == (
        document["decision"], [_up_to_words(r) for r in document["reasons"]])
    everything_faster = [r.model_copy(update={"speedup": r.speedup.model_copy(update={"beyond_noise": True}),
                                              "cases": {}}) for r in repeats]
    assert decide(checks, everything_faster, environment["run"], environment["now"]).decision == "GO"
    moved = {**environment["now"], "gpu": "NVIDIA H100 80GB HBM3"}
    assert any("gpu" in reason for reason in decide(checks, everything_faster, environment["run"], moved).reasons)


@pytest.mark.parametrize("name", RUNS)
def test_the_cost_sheet_uses_the_runs_own_hours(name):
    run_dir = FIXTURE_RUNS / name
    wall, busy, _ = run_hours(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0 < busy <= wall < 1 and busy == pytest.approx(summary["gpu_seconds"] / 3600)
    sheet = cost_sheet(CostInputs(engineer_hours=2, hourly_rate=150, model_cost=12, gpu_hour_cost=4,
                                  invocations_per_month=1e9, ms_saved_end_to_end=0.01), wall, busy)
    assert sheet.pilot_cost == pytest.approx(300 + 12 + 4 * wall)
    assert sheet.saved_gpu_hours_per_month == pytest.approx(0.01 * 1e9 / 3_600_000)
    assert sheet.payback_months == pytest.approx(sheet.pilot_cost / (sheet.saved_gpu_hours_per_month * 4))


@pytest.mark.parametrize("name", RUNS)
def test_a_run_made_before_the_kernel_clock_keeps_the_events_it_was_timed_with(name, tmp_path):
    run_dir = FIXTURE_RUNS / name
    assert RunSettings.of_run(run_dir).timing.clock == "events"
    fresh = tmp_path / "run"
    fresh.mkdir()
    record = json.loads((run_dir / "run.json").read_text())
    record["settings"]["timing"]["clock"] = "kernel"
    (fresh / "run.json").write_text(json.dumps(record))
    assert RunSettings.of_run(fresh).timing.clock == "kernel"
