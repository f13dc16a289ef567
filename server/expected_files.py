"""A run's expected outputs on disk: each case's, per input set and output, as a .npy file, or, for a case
judged on the device (harness/device_checks.py), as its sha256-tree alone (unless the run keeps them all:
serve --keep-expected). A resumed run and a replay load the files, or lock the trees, which the outputs
computed again must match."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from harness.settings import input_seed
from harness.task_model import Case, Task
from server.audit import write_bytes_atomic
from server.executor import Executor


def expected_path(case: Case, set_index: int, output: str) -> str:
    return f"expected/{case.name}/{set_index}/{output}.npy"


def expected_tree_path(case: Case, set_index: int, output: str) -> str:
    """Where a case judged on the device keeps its expected output's sha256-tree instead of the output."""
    return f"expected/{case.name}/{set_index}/{output}.sha256-tree"


def write_expected(folder: Path, task: Task, sets: int, executor: Executor, keep_all: bool, progress=None) -> dict:
    """Write every case's expected outputs under `folder`; by case, "files" or "sha256-tree"."""
    kinds = {}
    cases = list(task.cases)
    for index, case in enumerate(cases):
        if progress:
            progress(index, len(cases), f"reference outputs for {case.name}")
        kinds[case.name] = "files"
        for s in range(sets):
            seed = input_seed(case, s)
            trees = None if keep_all else executor.expected_trees(case, seed)
            if trees is not None:
                kinds[case.name] = "sha256-tree"
                for name, tree in trees.items():
                    _write(folder / expected_tree_path(case, s, name), (tree + "\n").encode())
                continue
            for name, array in executor.expected(case, seed).items():
                buffer = io.BytesIO()
                np.save(buffer, array, allow_pickle=False)
                _write(folder / expected_path(case, s, name), buffer.getvalue())
    return kinds


def load_expected(folder: Path, task: Task, sets: int, executor: Executor) -> None:
    """Hand the executor a run's locked expected outputs: the arrays, or the trees they must hash to."""
    for case in task.cases:
        for s in range(sets):
            seed = input_seed(case, s)
            names = [p.name for p in task.output_params]
            if all((folder / expected_tree_path(case, s, name)).is_file() for name in names):
                executor.lock_trees(case, seed, {name: (folder / expected_tree_path(case, s, name)).read_text().strip()
                                                 for name in names})
                continue
            executor.preload(case, seed, {name: np.load(folder / expected_path(case, s, name), allow_pickle=False)
                                          for name in names})


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, data)
