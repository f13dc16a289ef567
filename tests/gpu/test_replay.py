"""`kernel-referee replay` on the GPU: a real run's best replays to GO; an attempt that is right on the
visible shapes only (tests/exploits/visible_shapes_only.cu) replays to NO-GO naming the holdout case."""

import json
import shutil
from pathlib import Path

import pytest

from harness.settings import TimingSettings
from harness.task import load_task
from server.attempt import finish, record_attempt
from server.verify import verify_run
from server.cli import main
from server.executor import GpuExecutor
from server.lifecycle import new_run
from server.run import RunSettings
from tests.test_cli import MATMUL

pytestmark = pytest.mark.gpu
VISIBLE_SHAPES_ONLY = Path(__file__).resolve().parents[1] / "exploits" / "visible_shapes_only.cu"
HOLDOUT = "holdout-97x83x61"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A finished run of matmul_f32 with the naive reference as its baseline, so that the shipped tiled kernel
    is faster beyond noise (tests/gpu/test_matmul_protocol.py shows it is): attempt 1 is that tiled kernel,
    attempt 2 visible_shapes_only.cu (valid on the visible cases, wrong on the holdout)."""
    root = tmp_path_factory.mktemp("replay")
    task_dir = root / "matmul_naive_baseline"
    shutil.copytree(MATMUL, task_dir, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (task_dir / "initial.cu").write_text((MATMUL / "reference.cu").read_text())
    timing = TimingSettings(warmups=5, iterations=40)
    executor = GpuExecutor(load_task(task_dir), timing)
    try:
        run = new_run(task_dir, root / "results", RunSettings(max_attempts=3, timing=timing), executor)
        try:
            for number, source in enumerate([(MATMUL / "initial.cu").read_text(), VISIBLE_SHAPES_ONLY.read_text()], 1):
                record_attempt(run, run.candidate(None, source), f"try {number}", None, None)
            finish(run, "done", None)
        finally:
            run.close()
    finally:
        executor.close()
    history = json.loads((run.dir / "history.json").read_text())["attempts"]
    assert [e["verdict"] for e in history] == ["baseline", "valid-faster", "valid-not-faster"], \
        [(e["verdict"], e["reasons"]) for e in history]
    assert json.loads((run.dir / "summary.json").read_text())["best_attempt"] == 1
    return run.dir


def test_the_best_of_a_real_run_replays_to_go(run_dir, capsys):
    assert main(["replay", str(run_dir), "--repeats", "2"]) == 0, capsys.readouterr().out
    document = json.loads((run_dir / "replay.json").read_text())
    assert document["decision"] == "GO", document["reasons"]
    assert document["kernel"]["attempt"] == 1 and document["kernel"]["is_best"]
    kinds = [c["kind"] for c in document["checks"]]
    assert kinds == ["replay"] * 3 + ["holdout", "holdout-oracle"] + ["fresh-oracle"] * 4
    assert all(c["passed"] for c in document["checks"])
    assert [r["speedup"]["beyond_noise"] for r in document["repeats"]] == [True, True]
    assert all(r["speedup"]["ratio"] > 1 and len(r["samples_ms"]["candidate"]["square-2048"]) == 2 * 40
               for r in document["repeats"])
    assert document["environment"]["differences"] == []
    assert document["environment"]["now"]["gpu"] == document["environment"]["run"]["gpu"]
    assert "GO" in capsys.readouterr().out
    report = verify_run(run_dir)
    assert report.ok, report.problems


def test_an_attempt_right_on_the_visible_shapes_only_replays_to_no_go_naming_the_holdout(run_dir, capsys):
    assert main(["replay", str(run_dir), "--attempt", "2", "--repeats", "1"]) == 1
    out = capsys.readouterr().out
    document = json.loads((run_dir / "replay-attempt-002.json").read_text())
    assert document["decision"] == "NO-GO" and document["kernel"]["attempt"] == 2
    failed = {c["name"] for c in document["checks"] if not c["passed"]}
    assert {f"holdout {HOLDOUT}", f"holdout-oracle {HOLDOUT}", f"fresh-oracle {HOLDOUT}"} <= failed
    assert all(c["passed"] for c in document["checks"] if c["case"] != HOLDOUT)  # right where the agent looked
    assert any(r.startswith(f"holdout {HOLDOUT} failed: mismatch") for r in document["reasons"])
    assert f"FAIL holdout {HOLDOUT}: mismatch" in out and "NO-GO" in out
    assert verify_run(run_dir).ok
