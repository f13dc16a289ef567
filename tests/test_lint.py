"""`kernel-referee lint` on the CPU: every shipped task passes; each kind of degenerate task is refused with
a one-line reason; `serve` and `check` refuse a task with lint errors before anything runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from harness.lint import CHEAP_ORACLE_ELEMENTS, lint_before_run, lint_folder, lint_task
from harness.lint_outputs import round_to_tf32
from harness.footprint import host_shortfalls
from harness.settings import TimingSettings
from harness.task import load_task
from server import check
from server.cli import main

REPO = Path(__file__).resolve().parents[1]
SAXPY = REPO / "tests" / "fixtures" / "tasks" / "saxpy"
MATMUL = REPO / "cases" / "matmul_f32"
SHIPPED = sorted(p.name for p in (REPO / "cases").iterdir() if (p / "task.toml").is_file())
SAXPY_ORACLE = ("import numpy as np\n\n\ndef oracle(inputs, dims):\n"
                "    return {'out': 2.5 * inputs['x'].astype(np.float64) + inputs['y'].astype(np.float64)}\n")
Y_NORMAL = '[inputs.y]\nkind = "normal"\nstd = 1.0'
X_UNIFORM = '[inputs.x]\nkind = "uniform"\nlow = -1.0\nhigh = 1.0'


def make_task(tmp_path: Path, name: str, base: Path = SAXPY, oracle: str | None = SAXPY_ORACLE,
              **replace: str) -> Path:
    """A copy of `base` with `oracle` as its oracle and each `old=new` replacement made in task.toml (keys
    are looked up in REPLACE, so the tests read as what they change)."""
    folder = tmp_path / name
    shutil.copytree(base, folder)
    text = (folder / "task.toml").read_text()
    for key, new in replace.items():
        old = REPLACE[key]
        assert old in text, old
        text = text.replace(old, new)
    if oracle is not None:
        (folder / "oracle.py").write_text(oracle)
        if "oracle = " not in text:
            text = 'oracle = "oracle.py"\n' + text
    (folder / "task.toml").write_text(text)
    return folder


REPLACE = {"y": Y_NORMAL, "x": X_UNIFORM, "tolerance": "rtol = 1e-6\natol = 1e-6",
           "large": "dims = { n = 16777216 }", "odd": "dims = { n = 1001 }"}


def findings(folder: Path, **options) -> list:
    return lint_folder(folder, **options)[1]


def checks_of(found) -> set[tuple[str, str]]:
    return {(f.severity, f.check) for f in found}


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_task_passes_lint(name, capsys):
    assert main(["lint", str(REPO / "cases" / name)]) == 0
    out = capsys.readouterr().out
    assert "lint passed" in out and "\nerror:" not in out


def test_a_sound_task_has_no_finding_and_the_control_is_not_degenerate(tmp_path, capsys):
    folder = make_task(tmp_path, "saxpy-ok")
    assert findings(folder) == []
    assert main(["lint", str(folder)]) == 0
    assert capsys.readouterr().out == f"{folder}: lint passed (no findings)\n"


DEGENERATE = {
    # inputs so small that the outputs are within atol of zero
    "zero-output": dict(x=X_UNIFORM.replace("-1.0", "-1e-9").replace("high = 1.0", "high = 1e-9"),
                        y='[inputs.y]\nkind = "uniform"\nlow = -1e-9\nhigh = 1e-9'),
    # every output 2.5 * 1 + 1 within a part in ten million
    "constant-output": dict(x='[inputs.x]\nkind = "uniform"\nlow = 1.0\nhigh = 1.0000001',
                            y='[inputs.y]\nkind = "uniform"\nlow = 1.0\nhigh = 1.0000001'),
    # 2.5 * x is below atol: out is y
    "equals-input": dict(x='[inputs.x]\nkind = "uniform"\nlow = -1e-9\nhigh = 1e-9'),
    # a tolerance a hundredth wide: x and y rounded to TF32 or float16 pass it
    "loose-tolerance": dict(tolerance="rtol = 1e-2\natol = 1e-2"),
}


@pytest.mark.parametrize("check", sorted(DEGENERATE))
def test_each_degenerate_task_is_refused_with_a_one_line_reason(tmp_path, capsys, check):
    folder = make_task(tmp_path, check, **DEGENERATE[check])
    assert main(["lint", str(folder)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{folder}: lint refused: ")
    refused = [line for line in out if line.startswith(f"error: {check}: ")]
    assert refused, out
    found = findings(folder)
    assert ("error", check) in checks_of(found)
    assert all("\n" not in f.message for f in found)


def test_an_output_that_ignores_the_inputs_is_refused_as_seed_insensitive(tmp_path):
    folder = make_task(tmp_path, "iota", oracle="import numpy as np\n\n\ndef oracle(inputs, dims):\n"
                                               "    return {'out': np.arange(dims['n'], dtype=np.float64)}\n")
    found = findings(folder)
    assert checks_of(found) == {("error", "seed-insensitive")}
    assert found[0].message.startswith("stand-in 'out for inputs drawn from another seed' passes the correctness "
                                       "case odd (tolerance.out rtol 1e-06, atol 1e-06; no atol would refuse it)")
    assert found[0].message.endswith("the output does not depend on the inputs' values")


def test_the_zero_check_comes_first_and_names_the_case_and_tolerance(tmp_path):
    found = findings(make_task(tmp_path, "zero", **DEGENERATE["zero-output"]))
    zero = next(f for f in found if f.check == "zero-output")
    assert zero.message.startswith("stand-in 'an all-zero out' passes the correctness case odd (tolerance.out rtol "
                                   "1e-06, atol 1e-06; an atol under ")
    assert "constant-output" not in {f.check for f in found}


def test_a_loose_tolerance_names_the_lower_precision_that_passes(tmp_path):
    found = findings(make_task(tmp_path, "loose", **DEGENERATE["loose-tolerance"]))
    loose = next(f for f in found if f.check == "loose-tolerance")
    assert "tolerance.out (rtol 0.01, atol 0.01) passes a TF32 or float16 version" in loose.message
    assert "an atol under " in loose.message and "(the rtol kept) would refuse it" in loose.message


def test_the_shipped_matmul_tolerance_made_a_hundred_times_looser_is_refused(tmp_path):
    folder = make_task(tmp_path, "matmul-loose", base=MATMUL, oracle=None)
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace("rtol = 1e-4\natol = 1e-3", "rtol = 1e-2\natol = 1e-1"))
    assert ("error", "loose-tolerance") in checks_of(findings(folder))


def test_a_case_too_small_to_time_is_a_warning_naming_the_recorded_figures(tmp_path, capsys):
    folder = make_task(tmp_path, "small", large="dims = { n = 4096 }")
    assert main(["lint", str(folder)]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("warning: too-small: "))
    assert "case large:" in line and "recorded H200" in line and "10x the launch floor of 2.3 us" in line


def test_a_case_too_large_for_any_gpu_is_named_and_never_reaches_the_host(tmp_path, capsys):
    """Terabyte arrays: drawn on the device and judged there (harness/drawn_inputs.py, harness/device_checks.py),
    they cost the host nothing; the device's memory is what they exceed."""
    folder = make_task(tmp_path, "huge", base=MATMUL, oracle=None)
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace("dims = { m = 2048, n = 2048, k = 2048 }",
                                             "dims = { m = 524288, n = 2097152, k = 1048576 }"))
    main(["lint", str(folder)])
    out = capsys.readouterr().out.splitlines()
    assert not any("host memory" in line for line in out)
    assert any(line.startswith("warning: too-large: case square-2048 needs") and "recorded H200" in line
               and "GiB of device memory" in line for line in out)


def test_host_memory_is_judged_with_the_footprint_of_a_run(tmp_path):
    task = load_task(SAXPY)
    settings = TimingSettings()
    problems = host_shortfalls(task, settings, 1, serving=True)
    assert problems
    assert [f.message for f in lint_task(task, host_memory=1) if f.check == "too-large"] == problems
    per_set = sum(12 * case.dims["n"] for case in task.cases)
    assert ("error", "too-large") in checks_of(lint_task(task, host_memory=per_set))
    assert ("error", "too-large") not in checks_of(lint_task(task, host_memory=2**40))
    assert ("error", "too-large") not in checks_of(lint_task(task, host_memory=None))


def test_without_an_oracle_lint_says_which_checks_could_not_run(capsys):
    assert main(["lint", str(SAXPY)]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("warning: no-oracle: "))
    assert "zero, constant, equal to an input, seed-insensitive outputs and the TF32/float16 tolerance" in line
    assert "could not be checked" in line


def test_an_oracle_that_fails_is_an_error(tmp_path):
    folder = make_task(tmp_path, "broken-oracle", oracle="def oracle(inputs, dims):\n    raise KeyError('w')\n")
    found = findings(folder)
    assert ("error", "oracle") in checks_of(found)
    message = next(f.message for f in found if f.check == "oracle")
    assert message.startswith("case odd: the oracle failed: ") and "oracle.py failed: KeyError: 'w' (line 2)" in message


def test_a_task_without_a_holdout_gets_a_warning(tmp_path):
    folder = make_task(tmp_path, "no-holdout")
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace('role = "holdout"', 'role = "correctness"'))
    assert checks_of(findings(folder)) == {("warning", "no-holdout")}


def test_the_lint_before_a_run_leaves_large_correctness_cases_to_lint(tmp_path):
    folder = make_task(tmp_path, "big-odd", odd="dims = { n = 2000001 }")
    task = load_task(folder)
    assert 3 * 2000001 > CHEAP_ORACLE_ELEMENTS
    assert checks_of(lint_before_run(task, TimingSettings())) == {("warning", "oracle-skipped")}
    assert lint_task(task) == []


def test_tf32_rounding_keeps_ten_bits_ties_to_even():
    ulp = 2.0**-10
    values = np.array([1 + ulp, 1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp / 4 + ulp, -(1 + 3 * ulp / 2), np.inf, np.nan],
                      dtype=np.float32)
    got = round_to_tf32(values)
    assert got[:5].tolist() == [1 + ulp, 1.0, 1 + 2 * ulp, 1 + ulp, -(1 + 2 * ulp)]
    assert np.isinf(got[5]) and np.isnan(got[6]) and got.dtype == np.float32


@pytest.mark.parametrize("command", [["check"], ["serve", "--task"]])
def test_serve_and_check_refuse_a_degenerate_task_first_in_one_line(tmp_path, capsys, command):
    folder = make_task(tmp_path, "zero", **DEGENERATE["zero-output"])
    assert main([*command, str(folder)]) == 2
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert len(err) == 1 and "Traceback" not in captured.err
    assert err[0].startswith(f"kernel-referee {command[0]}: refused: task saxpy fails lint: error: zero-output: "
                             "stand-in 'an all-zero out' passes the correctness case odd")
    assert f"`kernel-referee lint {folder}` lists every finding" in err[0]
    assert "No GPU" not in captured.out and "compiled" not in captured.out  # refused before anything ran


def test_check_prints_lint_warnings_and_goes_on(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(check, "gpu_absent_reason", lambda: "no NVIDIA driver library (taken away by the test)")
    folder = make_task(tmp_path, "small", large="dims = { n = 4096 }")
    assert main(["check", str(folder)]) == 3  # no GPU: it compiled and stopped
    out = capsys.readouterr().out
    assert out.startswith("lint warning: too-small: case large:") and "reference: compiled for sm_90" in out


def test_lint_of_a_folder_that_is_not_a_task_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["lint", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("kernel-referee lint: ") and "task.toml: (file): not found" in err[0]


def test_an_oracle_error_over_several_lines_is_said_on_one(tmp_path):
    folder = make_task(tmp_path, "chatty-oracle",
                       oracle="def oracle(inputs, dims):\n    raise ValueError('first\\nsecond\\n' + 'x' * 900)\n")
    message = next(f.message for f in findings(folder) if f.check == "oracle")
    assert "\n" not in message and message.startswith("case odd: the oracle failed: ")
    assert "ValueError: first second xx" in message
    assert len(message) < 400
