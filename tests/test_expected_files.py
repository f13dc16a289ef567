"""Expected outputs of cases judged on the device stay there: the run folder keeps their sha256-trees, a
resumed run locks them, and outputs computed again that hash otherwise are refused; serve --keep-expected
writes them all as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.settings import ReferenceFailed, input_seed
from harness.task import load_task
from harness.worker_side.buffers import tree_sha256
from server.audit import LOG_NAME
from server.expected_files import load_expected
from server.lifecycle import new_run, resume_run
from server.records import EventKind
from server.run import RunSettings
from tests.fake_executor import FakeExecutor

MATMUL = Path(__file__).resolve().parents[1] / "cases" / "matmul_f32"
# matmul_f32's performance cases have 16 MB and 12 MB of output; its correctness cases far less.
LARGE = 10 << 20


def _files(run_dir: Path, pattern: str) -> list[Path]:
    return sorted((run_dir / "expected").rglob(pattern))


def test_large_cases_keep_sha256_trees_and_small_ones_their_files(tmp_path):
    task = load_task(MATMUL)
    executor = FakeExecutor(task, trees_from_bytes=LARGE)
    run = new_run(MATMUL, tmp_path / "results", RunSettings(), executor)
    try:
        sets = run.settings.timing.rotation_sets
        large = [c for c in task.cases if c.role == "performance"]
        trees = _files(run.dir, "*.sha256-tree")
        assert {p.parts[-3] for p in trees} == {c.name for c in large} and len(trees) == sets * len(large)
        assert {p.parts[-3] for p in _files(run.dir, "*.npy")} == {c.name for c in task.cases} - {c.name for c in large}
        case = large[0]
        expected = executor.expected(case, input_seed(case, 1))["c"]
        assert (run.dir / "expected" / case.name / "1" / "c.sha256-tree").read_text() == tree_sha256(expected) + "\n"
        log = [json.loads(line) for line in (run.dir / LOG_NAME).read_text().splitlines()]
        written = [r for r in log if r["kind"] == str(EventKind.EXPECTED_OUTPUTS_WRITTEN)]
        assert written[0]["data"]["sha256_tree_only"] == sorted(c.name for c in large)
    finally:
        run.close()


def test_keep_expected_writes_every_case_as_files(tmp_path):
    task = load_task(MATMUL)
    run = new_run(MATMUL, tmp_path / "results", RunSettings(keep_expected=True),
                  FakeExecutor(task, trees_from_bytes=LARGE))
    try:
        assert _files(run.dir, "*.sha256-tree") == []
        assert {p.parts[-3] for p in _files(run.dir, "*.npy")} == {c.name for c in task.cases}
    finally:
        run.close()


def test_a_resumed_run_locks_the_trees_and_refuses_outputs_that_hash_otherwise(tmp_path):
    task = load_task(MATMUL)
    run = new_run(MATMUL, tmp_path / "results", RunSettings(), FakeExecutor(task, trees_from_bytes=LARGE))
    run_dir = run.dir
    run.close()
    run.folder_lock.release()
    executor = FakeExecutor(task, trees_from_bytes=LARGE)
    resumed = resume_run(run_dir, executor)
    try:
        case = next(c for c in task.cases if c.role == "performance")
        assert set(executor.locked_trees) == {(c.name, input_seed(c, s)) for c in task.cases if c.role == "performance"
                                              for s in range(resumed.settings.timing.rotation_sets)}
        assert executor.expected_trees(case, case.seed) == executor.locked_trees[(case.name, case.seed)]
        executor.preload(case, case.seed, {"c": executor.expected(case, case.seed)["c"] + 1})
        with pytest.raises(ReferenceFailed, match="not the ones the run locked"):
            executor.expected_trees(case, case.seed)
    finally:
        resumed.close()


def test_load_expected_hands_over_files_and_trees(tmp_path):
    task = load_task(MATMUL)
    run = new_run(MATMUL, tmp_path / "results", RunSettings(), FakeExecutor(task, trees_from_bytes=LARGE))
    try:
        fresh = FakeExecutor(task)
        load_expected(run.dir, task, run.settings.timing.rotation_sets, fresh)
        small = {(c.name, input_seed(c, s)) for c in task.cases if c.role != "performance"
                 for s in range(run.settings.timing.rotation_sets)}
        assert set(fresh.preloaded) == small and set(fresh.locked_trees).isdisjoint(small)
    finally:
        run.close()
