"""`kernel-referee check` on a machine without a GPU: the compiles, then the task's oracle on its correctness cases
(on the CPU), summarized; exit 3 because no kernel ran. An oracle that fails, and a case too large for this
machine's memory, are one line and exit 2."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from harness.device import gpu_absent_reason
from server.cli import main

REPO = Path(__file__).resolve().parents[1]
SAXPY = REPO / "tests" / "fixtures" / "tasks" / "saxpy"
SOFTMAX = REPO / "cases" / "softmax_f32"
no_gpu = pytest.mark.skipif(gpu_absent_reason() is None, reason="this machine has a GPU")

ORACLE = "def oracle(inputs, dims):\n    return {'out': 2.5 * inputs['x'] + inputs['y']}\n"


def saxpy_with(tmp_path: Path, oracle: str | None = ORACLE, odd_dims: str = "n = 1001, r = 1") -> Path:
    """The saxpy fixture with rows (`r`) in its shapes, so that a case can be made as large as wanted, and an
    oracle."""
    folder = tmp_path / "saxpy"
    shutil.copytree(SAXPY, folder)
    text = (folder / "task.toml").read_text().replace('shape = ["n"]', 'shape = ["n", "r"]')
    text = text.replace("dims = { n = 1001 }", f"dims = {{ {odd_dims} }}")
    text = text.replace("dims = { n = 16777216 }", "dims = { n = 16777216, r = 1 }")
    text = text.replace("dims = { n = 123457 }", "dims = { n = 123457, r = 1 }")
    if oracle is not None:
        text = 'oracle = "oracle.py"\n' + text
        (folder / "oracle.py").write_text(oracle)
    (folder / "task.toml").write_text(text)
    return folder


@no_gpu
def test_the_oracle_runs_on_the_correctness_cases_and_is_summarized(tmp_path, capsys):
    report = tmp_path / "out.json"
    assert main(["check", str(SOFTMAX), "--json", str(report)]) == 3
    out = capsys.readouterr().out
    assert "oracle (oracle.py) on the correctness cases, on the CPU:" in out
    assert "  odd-37x1001: y 37x1001 float64 (the output is float32), all finite, min " in out
    assert "narrow-300x7: y 300x7 " in out and "wide-3x5003: y 3x5003 " in out
    assert "running, checking and timing need an NVIDIA GPU" in out
    (summary,) = json.loads(report.read_text())["oracle"]["odd-37x1001"]
    assert summary["shape"] == [37, 1001] and summary["nan"] == summary["inf"] == 0
    assert 0 < summary["low"] < summary["high"] < 1  # softmax probabilities


@no_gpu
def test_nan_and_inf_in_the_oracle_are_counted(tmp_path, capsys):
    oracle = ("import numpy as np\n"
              "def oracle(inputs, dims):\n"
              "    out = (2.5 * inputs['x'] + inputs['y']).astype(np.float32)\n"
              "    out[0, 0], out[1, 0], out[2, 0] = np.nan, np.inf, -np.inf\n"
              "    return {'out': out}\n")
    assert main(["check", str(saxpy_with(tmp_path, oracle))]) == 3
    assert "  odd: out 1001x1 float32 (the output is float32), 1 NaN, 2 Inf, min " in capsys.readouterr().out


@no_gpu
def test_a_task_without_an_oracle_says_so(tmp_path, capsys):
    assert main(["check", str(saxpy_with(tmp_path, oracle=None))]) == 3
    assert "oracle: the task declares none (task.toml `oracle`)" in capsys.readouterr().out


@no_gpu
def test_an_oracle_that_fails_is_one_line_naming_its_file_the_case_and_the_line(tmp_path, capsys):
    oracle = "def oracle(inputs, dims):\n    x = inputs['x']\n    return {'out': x * dims['alpha']}\n"
    folder = saxpy_with(tmp_path, oracle)
    assert main(["check", str(folder)]) == 2
    err = capsys.readouterr().err
    # The lint that check runs first runs the oracle on the correctness cases: its line names the case, the
    # oracle's file, the error and its line.
    assert err.count("\n") == 1 and err.startswith("kernel-referee check: refused: task saxpy fails lint: ")
    assert f"case odd: the oracle failed: {folder.resolve() / 'oracle.py'} failed: KeyError: 'alpha' (line 3)" in err


@no_gpu
def test_an_oracle_of_the_wrong_shape_is_one_line(tmp_path, capsys):
    oracle = "def oracle(inputs, dims):\n    return {'out': inputs['x'][:10]}\n"
    assert main(["check", str(saxpy_with(tmp_path, oracle))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "case odd: the oracle failed: " in err
    assert "oracle.py: 'out' has shape (10, 1)" in err and "expected (1001, 1)" in err


@no_gpu
def test_a_case_too_large_for_this_machine_is_refused_without_allocating_it(tmp_path, capsys):
    folder = saxpy_with(tmp_path, odd_dims="n = 1048576, r = 1048576")  # 4 TiB per array
    started = time.monotonic()
    assert main(["check", str(folder)]) == 2
    assert time.monotonic() - started < 30
    captured = capsys.readouterr()
    # nothing compiled, nothing made: only the lint's warnings (its oracle leaves such a case to `lint`)
    assert all(line.startswith("lint warning: ") for line in captured.out.splitlines())
    line = captured.err.removesuffix("\n")
    assert "\n" not in line
    # x and y (8 TiB) twice, 3 x 2^40 elements in float64 (24 TiB), out (4 TiB): 44 TiB
    assert line.startswith(f"kernel-referee check: case odd needs {(2 * 8 + 24 + 4) * 1024:.1f} GiB of host memory for the oracle (its inputs, "
                           "a copy, every array in float64); this machine has ")
    assert line.endswith(" GiB available")
