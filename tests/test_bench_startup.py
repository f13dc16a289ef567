"""bench/startup.py on the CPU: the KernelBench-size GEMM task it makes loads and passes lint, with one N^3
performance case and matmul_f32's correctness and holdout cases; without a GPU it says so and exits 2."""

from __future__ import annotations

import sys

from harness.lint import lint_task
from harness.lint_findings import errors
from harness.task import load_task
from tests.server_support import REPO

sys.path.insert(0, str(REPO / "bench"))
import startup  # noqa: E402


def test_the_gemm_task_has_one_square_performance_case_and_passes_lint(tmp_path):
    task = load_task(startup.gemm_task(tmp_path / "gemm", 4096))
    original = load_task(startup.MATMUL)
    assert [(c.name, c.dims) for c in task.performance_cases] == [("square-4096", {"m": 4096, "n": 4096, "k": 4096})]
    assert [c.name for c in task.correctness_cases] == [c.name for c in original.correctness_cases]
    assert [c.name for c in task.holdout_cases] == [c.name for c in original.holdout_cases]
    assert errors(lint_task(task, figures=None, host_memory=None)) == []


def test_without_a_gpu_it_says_so_and_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(startup, "gpu_absent_reason", lambda: "no NVIDIA driver library here")
    monkeypatch.setattr(sys, "argv", ["startup.py", "--gemm", "4096"])
    assert startup.main() == 2
    assert capsys.readouterr().out == "no GPU to measure on: no NVIDIA driver library here\n"


def test_the_parts_of_a_start_are_timed_each_in_a_fresh_interpreter():
    parts = startup.start_parts()
    assert list(parts) == ["interpreter", "imports", "gpu_probe", "nvml_list"]
    assert all(0 < seconds < 60 for seconds in parts.values())
    # importing the command line's modules costs more than importing nothing (a part that did not run reads ~0)
    assert parts["imports"] > 0.05
