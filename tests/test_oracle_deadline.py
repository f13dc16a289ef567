"""The task's oracle runs with a deadline: one that calls sys.exit() or never returns is an OracleError, and in
lint, check and serve one line, never a silent exit or a command blocked forever."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from harness import oracle as oracle_module
from harness.lint import lint_folder
from harness.oracle import OracleError, oracle_deadline_s, run_oracle
from harness.task import load_task, make_inputs
from server import check
from server.cli import main

REPO = Path(__file__).resolve().parents[1]
SAXPY = REPO / "tests" / "fixtures" / "tasks" / "saxpy"
EXITS = "import sys\n\ndef oracle(inputs, dims):\n    sys.exit(5)\n"
EXITS_ON_LOAD = "import sys\nsys.exit(7)\n"
# Busy past any deadline the tests set, then done: a thread cannot be stopped from outside, and one that spun for
# ever would hold the interpreter's lock, and slow every later test of the session, until the process ends.
HANGS = ("import time\n\ndef oracle(inputs, dims):\n    end = time.monotonic() + 5\n"
         "    while time.monotonic() < end:\n        pass\n")
SLEEPS = "import time\n\ndef oracle(inputs, dims):\n    time.sleep(60)\n"


def with_oracle(tmp_path: Path, text: str, name: str = "saxpy") -> Path:
    folder = tmp_path / name
    shutil.copytree(SAXPY, folder)
    (folder / "oracle.py").write_text(text)
    toml = folder / "task.toml"
    toml.write_text('oracle = "oracle.py"\n' + toml.read_text())
    return folder


def first_case(folder: Path):
    task = load_task(folder)
    case = task.correctness_cases[0]
    return task, case, make_inputs(task, case.dims, case.seed)


@pytest.fixture
def short_deadline(monkeypatch):
    monkeypatch.setattr(oracle_module, "ORACLE_BASE_DEADLINE_S", 0.5)
    monkeypatch.setattr(oracle_module, "ORACLE_DEADLINE_S_PER_ELEMENT", 0.0)


@pytest.mark.parametrize("text, said", [(EXITS, "called sys.exit(5) on case odd (line 4)"),
                                        (EXITS_ON_LOAD, "called sys.exit(7) on case odd (line 2)")])
def test_an_oracle_that_exits_is_an_oracle_error_naming_the_exit_and_its_line(tmp_path, text, said):
    task, case, inputs = first_case(with_oracle(tmp_path, text))
    with pytest.raises(OracleError, match=r"oracle\.py " + said.replace("(", r"\(").replace(")", r"\)")):
        run_oracle(task, case.dims, inputs, case.name)


@pytest.mark.parametrize("text", [HANGS, SLEEPS])
def test_an_oracle_past_its_deadline_is_an_error_and_is_not_started_again(tmp_path, short_deadline, text):
    task, case, inputs = first_case(with_oracle(tmp_path, text, f"hangs-{len(text)}"))
    started = time.monotonic()
    with pytest.raises(OracleError, match=r"did not return within 0\.5 s on case odd \(the oracle's deadline\)"):
        run_oracle(task, case.dims, inputs, case.name)
    assert 0.5 <= time.monotonic() - started < 5
    started = time.monotonic()
    with pytest.raises(OracleError, match="did not return within its deadline earlier in this process"):
        run_oracle(task, case.dims, inputs, case.name)
    assert time.monotonic() - started < 0.2


def test_a_sound_oracle_is_unchanged_by_the_deadline(tmp_path):
    text = "def oracle(inputs, dims):\n    return {'out': 2.5 * inputs['x'] + inputs['y']}\n"
    task, case, inputs = first_case(with_oracle(tmp_path, text))
    out = run_oracle(task, case.dims, inputs, case.name)["out"]
    assert np.array_equal(out, (2.5 * inputs["x"] + inputs["y"]).astype(np.float64))


def test_what_an_oracle_prints_goes_to_stderr_not_into_lint_s_report(tmp_path, capsys):
    text = ("print('ORACLE LOADED')\n\ndef oracle(inputs, dims):\n    print('ORACLE CALLED')\n"
            "    return {'out': 2.5 * inputs['x'] + inputs['y']}\n")
    main(["lint", str(with_oracle(tmp_path, text, "prints"))])
    said = capsys.readouterr()
    assert "ORACLE" not in said.out
    assert "ORACLE LOADED" in said.err and "ORACLE CALLED" in said.err


def test_the_deadline_grows_with_the_inputs():
    small = oracle_deadline_s({"x": np.zeros(10)})
    large = oracle_deadline_s({"x": np.zeros(1 << 20), "y": np.zeros(1 << 20)})
    assert small == pytest.approx(oracle_module.ORACLE_BASE_DEADLINE_S, abs=1e-3)
    assert large == pytest.approx(small + (1 << 21) * oracle_module.ORACLE_DEADLINE_S_PER_ELEMENT, rel=1e-6)


def test_lint_says_an_exiting_oracle_as_an_error_line_and_exits_1(tmp_path, capsys):
    folder = with_oracle(tmp_path, EXITS)
    oracle_errors = [f for f in lint_folder(folder)[1] if f.check == "oracle"]
    assert oracle_errors and all(f.severity == "error" for f in oracle_errors)
    assert "called sys.exit(5)" in oracle_errors[0].message
    assert main(["lint", str(folder)]) == 1
    assert "error: oracle: case odd: the oracle failed: " in capsys.readouterr().out


def test_lint_of_a_hanging_oracle_ends_with_an_error(tmp_path, capsys, short_deadline):
    folder = with_oracle(tmp_path, HANGS, "lint-hangs")
    started = time.monotonic()
    assert main(["lint", str(folder)]) == 1
    assert time.monotonic() - started < 30
    assert "did not return within 0.5 s" in capsys.readouterr().out


@pytest.mark.parametrize("command", [["check"], ["serve", "--task"]])
@pytest.mark.parametrize("text, said", [(EXITS, "called sys.exit(5)"), (SLEEPS, "did not return within 0.5 s")])
def test_check_and_serve_say_an_exiting_or_hanging_oracle_in_one_line_exit_2(tmp_path, capsys, monkeypatch,
                                                                             short_deadline, command, text, said):
    monkeypatch.setattr(check, "gpu_absent_reason", lambda: "no NVIDIA driver library (taken away by the test)")
    folder = with_oracle(tmp_path, text, f"{command[0]}-{len(text)}")
    assert main([*command, str(folder)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"kernel-referee {command[0]}: refused: task saxpy fails lint: "
                                               "error: oracle: case odd: the oracle failed: ")
    assert said in err[0]
